"""A process waiting for another's warm-start says what it waits for, for whom, and keeps saying it;
when the holder dies, it recovers the lock and builds the cache itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY

from scalerl.config import compose, typed
from scalerl.model.build import _warmstart_key

OVERRIDES = [*TINY, "model.warmstart_steps=5"]


@pytest.mark.slow
def test_a_warmstart_waiting_on_another_process_says_so_until_it_can_go(tmp_path):
    cache = tmp_path / "cache"
    config = typed(compose([*OVERRIDES, f"model.cache_dir={cache}"]))
    lock = cache / f"warmstart-{_warmstart_key(config.model, config.task)}.lock"
    hold = f"from scalerl.lock import hold\nwith hold({str(lock)!r}, 'x', wait=False):\n print('held', flush=True)\n input()"
    env = {**os.environ, "SCALERL_WAIT_NOTICE_S": "1"}
    holder = subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    waiter = None
    try:
        assert holder.stdout.readline().strip() == "held"
        build = (
            "import logging, sys\n"
            "logging.basicConfig(level=logging.INFO)\n"
            "from scalerl.config import compose, typed\n"
            "from scalerl.model.build import load_tiny\n"
            "from scalerl.task import build_task\n"
            f"c = typed(compose({[*OVERRIDES, f'model.cache_dir={cache}']!r}))\n"
            "model, tok, info = load_tiny(c.model, build_task(c.task), task_option=c.task, seed=c.seed)\n"
            "print('built', info['source'], flush=True)\n"
        )
        waiter = subprocess.Popen(
            [sys.executable, "-c", build],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        seen, waits_before = [], 0
        deadline = time.monotonic() + 240
        while waits_before < 2 and time.monotonic() < deadline:  # imports, then a notice a second
            line = waiter.stdout.readline()
            if not line:
                break  # it ended: the asserts below say how
            seen.append(line)
            waits_before += "waiting for the warm-start cache" in line
        assert waiter.poll() is None, "".join(seen)  # still waiting, and saying so
        holder.kill()
        holder.wait()
        rest, _ = waiter.communicate(timeout=240)
        text = "".join(seen) + rest
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
    assert waiter.returncode == 0, text
    waits = [line for line in text.splitlines() if "waiting for the warm-start cache" in line]
    assert len(waits) >= 2, text
    assert all(f"held by pid {holder.pid} on host" in line and "since" in line for line in waits)
    assert f"recovered the lock on the warm-start cache {Path(cache)}" in text
    assert "built warm-start" in text
