"""Local runs at once held to their own cores (``launcher.pin_cores``): how the cores are split,
a whole process tree moved, and a real local sweep whose runs are held apart and, once no run
waits for a share, given all the cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from procs import descendants
from test_sweep import TINY_BASE, TINY_TASK, run_cli, write_sweep

from scalerl.sweep.launch import core_slots, hold_to, process_tree

CPUS = sorted(os.sched_getaffinity(0))
LOCAL = {"name": "local", "max_parallel": 2, "nodes": 1, "tasks_per_node": 1, "pin_cores": True}


def test_core_slots_split_this_process_cpus_evenly():
    """Two runs at once: this process's CPUs in two equal halves, in order; none where pinning is
    off, one run runs at a time, or there are fewer CPUs than runs."""
    per = len(CPUS) // 2
    want = [tuple(CPUS[:per]), tuple(CPUS[per : 2 * per])] if per else []
    assert core_slots(LOCAL) == want
    assert core_slots({**LOCAL, "pin_cores": False}) == []
    assert core_slots({**LOCAL, "max_parallel": 1}) == []
    assert core_slots({**LOCAL, "max_parallel": len(CPUS) + 1}) == []
    slots = core_slots({**LOCAL, "max_parallel": len(CPUS)})
    assert slots == ([(c,) for c in CPUS] if len(CPUS) > 1 else [])


_TREE = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(kid.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_hold_to_moves_every_process_of_a_tree_and_back():
    """A process and the child it started (each with its threads) held to one CPU, then given all
    of them again; a process that is gone is passed over."""
    top = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        kid = int(top.stdout.readline())
        assert process_tree(top.pid) == [top.pid, kid] and descendants(top.pid) == [kid]
        assert hold_to(top.pid, {CPUS[-1]}) >= 2
        assert os.sched_getaffinity(top.pid) == os.sched_getaffinity(kid) == {CPUS[-1]}
        assert hold_to(top.pid, CPUS) >= 2
        assert os.sched_getaffinity(top.pid) == os.sched_getaffinity(kid) == set(CPUS)
    finally:
        for p in process_tree(top.pid)[::-1]:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        top.wait()
    time.sleep(0.1)
    assert hold_to(top.pid, CPUS) == 0  # gone: nothing moved, nothing raised


@pytest.mark.skipif(len(CPUS) < 2, reason="two runs held apart need two CPUs")
def test_a_local_sweep_holds_its_runs_apart_then_spreads_the_last(tmp_path):
    """A real local sweep, two runs at once: each held to its own half of the cores (its job log
    and status.json say which, the halves disjoint); when the short run ends and nothing waits, the
    long one is given all the cores, and its record no longer names a share."""
    short, long_ = [*TINY_TASK, "trainer.total_steps=2"], [*TINY_TASK, "trainer.total_steps=60"]
    f = write_sweep(
        tmp_path / "s.yaml", {"short": short, "long": long_}, name="pin", base=TINY_BASE, baseline="long"
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = run_cli(
        [
            str(f),
            "--out",
            str(tmp_path / "out"),
            "--tracking-uri",
            uri,
            "launcher.max_parallel=2",
            "launcher.pin_cores=true",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    slots = core_slots(LOCAL)
    held = {}
    for name in ("short", "long"):
        log = open(status[name]["stdout"]).read()
        line = next(x for x in log.splitlines() if x.startswith("[sweep] held to cores "))
        held[name] = tuple(int(c) for c in line.removeprefix("[sweep] held to cores ").split(","))
        assert f"{name}: submitted (job {status[name]['job_id']}; log " in res.stderr
    assert sorted(held.values()) == sorted(slots) and held["short"] != held["long"]
    assert f"long: given cores {','.join(map(str, CPUS))} (no run waits for a share)" in res.stderr
    assert status["long"]["cores"] is None and status["short"]["cores"] == list(held["short"])
    assert status["long"]["status"] == status["short"]["status"] == "finished"
