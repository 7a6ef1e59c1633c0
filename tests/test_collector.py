"""How our processes start and end around their imports' objects (scalerl.collector): the heavy
imports run with the collector paused and end frozen; train.py and sweep.py end without the
interpreter's finalisation, but with everything an ordinary exit does that matters (the threads
waited for, the exit handlers run, the streams flushed, the exit status kept)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# runs an entry point as its own program, with: an exit handler, a thread that is not a daemon and
# is still working when the entry point has begun to end the process (it waits to see the main
# thread inside end_process), and an object whose finaliser only the interpreter's finalisation
# would run
PROBE = """
import atexit, runpy, sys, threading, time

class Probe:
    def __del__(self):
        print("finalised", flush=True)

def late():
    main = threading.main_thread().ident
    while True:
        frame = sys._current_frames().get(main)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if "end_process" in names or not threading.main_thread().is_alive():
            break
        time.sleep(0.01)
    time.sleep(0.3)
    print("thread done", flush=True)

probe = Probe()
atexit.register(lambda: print("exit handlers ran", flush=True))
threading.Thread(target=late).start()
sys.argv = {argv!r}
runpy.run_path({path!r}, run_name="__main__")
"""


def _program(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = PROBE.format(argv=[script, *args], path=str(ROOT / script))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def _ended_without_finalisation(r: subprocess.CompletedProcess) -> None:
    assert "thread done" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]  # waited for, as Python does
    assert "exit handlers ran" in r.stdout
    assert r.stdout.index("thread done") < r.stdout.index("exit handlers ran")
    assert "finalised" not in r.stdout  # the interpreter's finalisation did not run


def test_train_py_ends_without_finalisation_with_its_output_whole(tmp_path):
    r = _program("train.py", ["--cfg", "job"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trainer:" in r.stdout and "tracking:" in r.stdout  # the whole config, flushed
    _ended_without_finalisation(r)


def test_train_py_keeps_its_exit_status_for_a_bad_value(tmp_path):
    r = _program("train.py", ["trainer.lr=-1"], tmp_path)
    assert r.returncode == 2 and "trainer.lr" in r.stderr
    _ended_without_finalisation(r)


def test_sweep_py_ends_without_finalisation_with_its_status(tmp_path):
    r = _program("sweep.py", ["--loo", "--dry-run"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "scalerl" in r.stdout
    _ended_without_finalisation(r)
    bad = _program("sweep.py", ["no-such-sweep.yaml", "--dry-run"], tmp_path)
    assert bad.returncode != 0 and "no-such-sweep" in bad.stderr
    _ended_without_finalisation(bad)


def test_imports_run_with_the_collector_paused_and_end_frozen_and_an_ordinary_exit_unfreezes():
    # in a fresh process: the import inside sees the collector off, after it the imports' objects
    # are frozen and the collector is on; a collector that was off stays off; and the process then
    # exits the ordinary way with the objects unfrozen first, so its shutdown frees them (with
    # vLLM installed, triton is imported under torch and reports what a shutdown leaves as leaks)
    code = """
import atexit, gc, json
from scalerl.collector import uncollected_imports
atexit.register(lambda: print("frozen at exit", gc.get_freeze_count(), flush=True))  # runs last
seen = {}
with uncollected_imports():
    seen["inside"] = gc.isenabled()
    import scalerl.model.build  # noqa: F401  (torch, transformers)
seen["after"] = gc.isenabled()
seen["frozen"] = gc.get_freeze_count()
seen["left"] = len(gc.get_objects())
gc.disable()
with uncollected_imports():
    pass
seen["kept_off"] = not gc.isenabled()
gc.enable()
print(json.dumps(seen), flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[0])
    assert seen["inside"] is False and seen["after"] is True and seen["kept_off"] is True
    assert seen["frozen"] > 50_000 and seen["left"] < 5_000
    assert r.stdout.strip().splitlines()[-1] == "frozen at exit 0"  # unfrozen before the shutdown...
    assert "leaked" not in r.stderr  # ...which freed what the imports made


def test_a_training_loop_runs_with_the_runs_parts_frozen_only_under_our_entry_point():
    # in a fresh process: long_lived freezes nothing in a library call (nobody's entry point froze
    # its imports: a test's or a notebook's objects are theirs); after uncollected_imports, the
    # objects alive when it starts (a run's parts) are frozen for its body and unfrozen after it
    code = """
import gc, json
from scalerl.collector import long_lived, uncollected_imports
seen = {}
with long_lived():
    seen["library"] = gc.get_freeze_count()
with uncollected_imports():
    import scalerl.config  # noqa: F401
imports = gc.get_freeze_count()
parts = [[i] for i in range(50_000)]
with long_lived():
    seen["parts"] = gc.get_freeze_count() - imports
    made = [[i] for i in range(1_000)]
    seen["made_frozen"] = gc.get_freeze_count() - imports - seen["parts"]
seen["after"] = gc.get_freeze_count()
print(json.dumps(seen), flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[0])
    assert seen["library"] == 0
    assert seen["parts"] >= 50_000 and seen["made_frozen"] == 0
    assert seen["after"] == 0


def _freeze_count(queue):
    import gc

    queue.put(gc.get_freeze_count())


def test_an_engine_process_starts_with_the_fork_servers_imports_frozen():
    from scalerl.rollout.server import process_context

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


def test_the_fork_servers_preload_makes_its_ordinary_exit_skip_finalisation():
    # what the engines' fork server runs: the preload, then (when its parent is gone) an ordinary
    # exit, which must end it at once with status 0, the streams flushed and no leak reports
    code = """
import atexit, sys

class Probe:
    def __del__(self):
        print("finalised", flush=True)

probe = Probe()
atexit.register(lambda: print("an earlier exit handler", flush=True))
import scalerl.rollout.preload  # noqa: F401
sys.stdout.write("unflushed output")
sys.exit(3)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.endswith("unflushed output")
    assert "finalised" not in r.stdout and "an earlier exit handler" not in r.stdout
    assert "leaked" not in r.stderr


# train.py up to the point where it has started the engines' fork server: there, the probe reports
# whether the server runs, whether it is a fork of this process (its parent is this process and its
# command line this one's, not a new interpreter's `-c from multiprocessing.forkserver ...`) and
# whether this process had imported transformers by then, and ends it
EARLY = """
import json, os, sys
from multiprocessing import forkserver
import scalerl.cli as cli
from scalerl.loop import run

def probe(cfg):
    pid = forkserver._forkserver._forkserver_pid
    server = {}
    if pid is not None:
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f, open("/proc/self/cmdline", "rb") as me:
            server = {"forked": parent == os.getpid() and f.read() == me.read()}
    print(json.dumps({"server": server or None, "transformers": "transformers" in sys.modules}), flush=True)
    os._exit(0)

run.train = probe
sys.argv = ["train.py", *sys.argv[1:]]
cli.main()
"""


def test_train_py_forks_the_engines_fork_server_from_itself_once_its_imports_are_done(tmp_path):
    def early(*args: str) -> dict:
        over = [f"out_dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}", *args]
        r = subprocess.run(
            [sys.executable, "-c", EARLY, *over], capture_output=True, text=True, cwd=tmp_path, timeout=300
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    # pipeline_rl (the default): the server is this process forked, its imports done (none anew)
    assert early() == {"server": {"forked": True}, "transformers": True}
    assert early("async_mode=sync") == {"server": None, "transformers": True}  # no engines to fork
