"""The engines' fork server forked from an entry point whose imports are done
(scalerl.rollout.server.fork_here): it runs multiprocessing's server as a new interpreter would after
the same imports (nothing of the entry point's open, no handler of its own), engines forked from it
work, and where forking is not safe it is started anew instead."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from procs import running

# an entry point as train.py is at that moment: its imports done, a file and a lock of its own open
# (an out_dir's lock), a SIGTERM handler and a logging handler installed; then fork_here(), an engine
# process forked from the server, and a report of what the server holds
ENTRY = """
import fcntl, json, logging, os, signal, sys, threading, time
from scalerl.rollout import server

folder = sys.argv[1]
server.import_preloaded()
held = open(os.path.join(folder, "held.txt"), "w")
lock = open(os.path.join(folder, "lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
signal.signal(signal.SIGTERM, lambda *_: None)
logging.getLogger().addHandler(logging.FileHandler(os.path.join(folder, "entry.log")))
if "--thread" in sys.argv:
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
forked = server.fork_here()

from multiprocessing import forkserver
pid = forkserver._forkserver._forkserver_pid

def targets(p):
    out = []
    for fd in os.listdir(f"/proc/{p}/fd"):
        try:
            out.append(os.readlink(f"/proc/{p}/fd/{fd}"))
        except OSError:
            pass
    return out

def caught(p):  # the signals the process handles itself (a handler, not the default or ignored)
    line = next(l for l in open(f"/proc/{p}/status") if l.startswith("SigCgt:"))
    mask = int(line.split()[1], 16)
    return [s for s in range(1, 65) if mask >> (s - 1) & 1]

ctx = server.process_context()
q = ctx.Queue()

engine = (
    "import gc, logging, os, sys; from multiprocessing import util; "
    "q.put({'parent': os.getppid(), 'imported': 'scalerl.task.score' in sys.modules, 'frozen': gc.get_freeze_count(), "
    "'logging': [len(logging.getLogger().handlers), logging.getLogger().level], "
    "'spawn': util.spawnv_passfds.__module__})"
)
p = ctx.Process(target=exec, args=(engine, {"q": q}))
p.start()
child = q.get(timeout=120)
p.join(60)
with open(f"/proc/{pid}/cmdline", "rb") as f, open("/proc/self/cmdline", "rb") as me:
    same_command = f.read() == me.read()
server_targets = targets(pid)
print(json.dumps({
    "forked": forked,
    "same_command": same_command,
    "server_parent": int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid(),
    "holds_file": any(t.startswith(folder) for t in server_targets),
    "sigterm_caught": signal.SIGTERM in caught(pid),
    "engine": child,
    "engine_exit": p.exitcode,
    "server_pid": pid,
}), flush=True)
lock.close()
# the lock is free once this process lets go of it, though the server still runs
other = open(os.path.join(folder, "lock"), "w")
fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("lock free", flush=True)
"""


def _entry(tmp_path, *args: str) -> tuple[dict, str]:
    r = subprocess.run(
        [sys.executable, "-c", ENTRY, str(tmp_path), *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    report = json.loads(lines[-2])
    # the server ends with the entry point (it holds no end of the pipe whose closing tells it so)
    deadline = time.monotonic() + 30
    while running(report["server_pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(report["server_pid"]), "the engines' server outlived its entry point"
    return report, lines[-1]


@pytest.mark.slow
def test_a_server_forked_from_an_entry_point_holds_nothing_of_it_and_forks_working_engines(tmp_path):
    report, last = _entry(tmp_path)
    assert report["forked"] and report["same_command"] and report["server_parent"]
    assert not report["holds_file"]  # the entry point's file and lock: not open in the server
    assert not report["sigterm_caught"]  # the entry point's handler: back to the default
    assert report["engine_exit"] == 0
    engine = report["engine"]
    assert engine["parent"] == report["server_pid"]  # forked from the server
    assert engine["imported"] and engine["frozen"] > 50_000  # its imports done and frozen, none anew
    assert engine["logging"] == [0, 30]  # the entry point's handler gone, the level a new process's
    assert engine["spawn"] == "multiprocessing.util"  # it starts processes as usual, not as forks
    assert last == "lock free"


@pytest.mark.slow
def test_with_a_second_thread_the_server_is_started_anew_instead(tmp_path):
    report, last = _entry(tmp_path, "--thread")
    assert not report["forked"] and not report["same_command"]  # a new interpreter's command line
    assert report["server_parent"] and report["engine_exit"] == 0
    assert report["engine"]["imported"] and report["engine"]["parent"] == report["server_pid"]
    assert report["engine"]["logging"] == [0, 30]
    assert not report["holds_file"] and last == "lock free"
