"""Our entry points end without Python's last garbage collection (scalerl.collector): train.py,
sweep.py and a study's job leave every object they made frozen, whichever way they end."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from scalerl.collector import skip_final_collection

ROOT = Path(__file__).resolve().parents[1]

# runs an entry point in a fresh process and prints, as it ends (normally or by an exception or
# SystemExit), how many objects the collector has frozen
PROBE = """
import gc, runpy, sys
try:
    {call}
finally:
    print("frozen", gc.get_freeze_count(), flush=True)
"""


def _frozen(call: str, cwd: Path) -> tuple[int, subprocess.CompletedProcess]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE.format(call=call)], capture_output=True, text=True, cwd=cwd, timeout=300
    )
    line = [x for x in r.stdout.splitlines() if x.startswith("frozen ")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    return int(line[-1].split()[1]), r


def test_the_helper_freezes_what_the_collector_tracks():
    tracked = len(gc.get_objects())
    try:
        skip_final_collection()
        assert gc.get_freeze_count() >= tracked > 10_000
        assert len(gc.get_objects()) < 1_000  # nothing left for a collection to walk
    finally:
        gc.unfreeze()  # this test process goes on


def test_train_py_ends_with_its_objects_frozen(tmp_path):
    call = f"sys.argv = ['train.py', '--cfg', 'job']; runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')"
    n, r = _frozen(call, tmp_path)
    assert r.returncode == 0 and "trainer:" in r.stdout
    assert n > 10_000  # the imports' objects (hydra, omegaconf, scalerl's config)


def test_train_py_refusing_a_bad_value_ends_with_its_objects_frozen(tmp_path):
    call = f"sys.argv = ['train.py', 'trainer.lr=-1']; runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')"
    n, r = _frozen(call, tmp_path)
    assert r.returncode == 2 and "trainer.lr" in r.stderr
    assert n > 10_000


def test_sweep_py_ends_with_its_objects_frozen(tmp_path):
    call = f"sys.argv = ['sweep.py', '--loo', '--dry-run']; runpy.run_path({str(ROOT / 'sweep.py')!r}, run_name='__main__')"
    n, r = _frozen(call, ROOT)
    assert r.returncode == 0 and "scalerl" in r.stdout
    assert n > 10_000


def test_a_job_that_fails_ends_with_its_objects_frozen(tmp_path):
    call = (
        "from scalerl.sweep.job import TrainJob; "
        f"TrainJob()(['trainer.lr=-1'], {{'out_dir': {str(tmp_path / 'run')!r}}}, 0)"
    )
    n, r = _frozen(call, tmp_path)
    assert r.returncode == 1 and "trainer.lr" in r.stderr  # the job's error, raised as it is
    assert n > 10_000


def test_imports_run_with_the_collector_paused_and_end_frozen_with_it_resumed():
    import json

    # in a fresh process: the import inside sees the collector off, and after it the heavy
    # objects are frozen and the collector is back on; a disabled collector stays disabled
    code = """
import gc, json
from scalerl.collector import uncollected_imports
seen = {}
with uncollected_imports():
    seen["inside"] = gc.isenabled()
    import torch  # noqa: F401
seen["after"] = gc.isenabled()
seen["frozen"] = gc.get_freeze_count()
seen["left"] = len(gc.get_objects())
gc.disable()
with uncollected_imports():
    pass
seen["kept_off"] = not gc.isenabled()
print(json.dumps(seen))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["inside"] is False and seen["after"] is True and seen["kept_off"] is True
    assert seen["frozen"] > 50_000 and seen["left"] < 1_000


def _freeze_count(queue):
    queue.put(gc.get_freeze_count())


def test_an_engine_process_starts_with_the_fork_servers_imports_frozen():
    from scalerl.rollout.engine import process_context

    ctx = process_context()
    assert ctx.get_start_method() == "forkserver"  # Linux's; engines elsewhere are spawned
    q = ctx.Queue()
    p = ctx.Process(target=_freeze_count, args=(q,))
    p.start()
    try:
        frozen = q.get(timeout=120)
    finally:
        p.join(timeout=60)
    assert frozen > 50_000  # torch's and transformers' objects, frozen in the server before the fork
