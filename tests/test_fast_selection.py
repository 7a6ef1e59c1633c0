"""The fast selection on a machine without SLURM (a pip-only install): the tests that need SLURM's
client (marked ``slurm_client``) are skipped, saying what to install, and fail instead under
``SCALERL_REQUIRE_SLURM=1`` (CI), where a missing client must not pass as a skip. Unmarked, they
failed there with submitit's 'Could not detect "srun"'.

Each case runs pytest on tests/test_multitask.py (the file with such tests) in a subprocess whose
PATH holds nothing of SLURM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_fixture import CLIENT_WHY

TESTS = Path(__file__).resolve().parent


def _pytest_without_slurm(tmp_path: Path, *args: str, require: bool = False) -> str:
    empty = tmp_path / "bin"  # PATH: no srun, sbatch, squeue (the interpreter is called by its path)
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SCALERL_REQUIRE", "PYTEST"))}
    env["PATH"] = str(empty)
    if require:
        env["SCALERL_REQUIRE_SLURM"] = "1"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsf", *args],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return r.stdout + r.stderr


def _counts(out: str) -> dict[str, int]:
    summary = out.strip().splitlines()[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|error)", summary)}


@pytest.mark.slow  # starts pytest in a subprocess (10-40 s)
def test_without_slurm_the_slurm_client_tests_skip_saying_what_to_install(tmp_path):
    out = _pytest_without_slurm(tmp_path, "-m", "not slow", "tests/test_multitask.py")
    counts = _counts(out)
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, out[-3000:]
    assert counts.get("skipped") == 3 and counts.get("passed", 0) > 0, out[-3000:]
    # -rs groups the skips by the line that raised them: "SKIPPED [3] tests/slurm_fixture.py:81: <why>"
    said = re.findall(r"^SKIPPED \[(\d+)\] \S+: " + re.escape(CLIENT_WHY) + "$", out, re.M)
    assert sum(map(int, said)) == 3, out[-3000:]


@pytest.mark.slow  # starts pytest in a subprocess (10-40 s)
def test_without_slurm_the_slurm_client_tests_fail_when_slurm_is_required(tmp_path):
    out = _pytest_without_slurm(tmp_path, "-m", "slurm_client", "tests/test_multitask.py", require=True)
    assert _counts(out).get("error") == 3, out[-3000:]  # pytest.fail in the setup: an error, the run fails
    assert out.count(f"{CLIENT_WHY} (SCALERL_REQUIRE_SLURM=1)") >= 3, out[-3000:]
