"""The fast selection on a machine without SLURM (a pip-only install): the tests that need SLURM's
client (marked ``slurm_client``) are skipped, saying what to install, and fail instead under
``SCALERL_REQUIRE_SLURM=1`` (CI), where a missing client must not pass as a skip. Unmarked, they
failed there with submitit's 'Could not detect "srun"'.

Each case runs pytest on tests/test_multitask.py (the file with such tests) in a subprocess whose
PATH holds nothing of SLURM.

And what an ordinary install differs in from the development machine: a user's PATH without the sbin
folders (the code sandbox's userns boundary must still be found: without bubblewrap every code test,
and every task=code run, was refused), and the newest transformers the package allows (every forward
with a KV cache goes through scalerl.model.kv_cache, which names the cache by that version's keyword)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_fixture import CLIENT_WHY

import scalerl

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


# ----------------------------------------------------------------------------- a user's PATH
def _userns_works(path: str) -> bool:
    probe = "from scalerl.task.sandbox import _works; print(_works('userns') is None)"
    r = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return r.stdout.strip().splitlines()[-1] == "True"


def test_the_userns_sandbox_is_found_on_a_users_path_without_sbin():
    """Debian's PATH for a user other than root (no /usr/sbin, where util-linux puts pivot_root) finds
    the userns boundary wherever root's PATH does. Where userns cannot work here at all, both say so
    and the test shows nothing (bubblewrap, CI's boundary, is on every PATH)."""
    root = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    user = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
    assert _userns_works(user) == _userns_works(root)


# ----------------------------------------------------------------------------- the newest transformers
def test_every_forward_with_a_kv_cache_names_it_through_kv_cache():
    """``past_key_values=`` (a keyword) or ``.past_key_values`` (an output's field) outside
    scalerl/model/kv_cache.py: deprecated from transformers 5.2x, whose FutureWarning the tests turn
    into an error (pyproject's filterwarnings) and a fresh install gets. The wall-time estimate's
    decode probe passed it by name, and every estimate said 'not estimated' there."""
    root = Path(scalerl.__file__).resolve().parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "model/kv_cache.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = (isinstance(node, ast.keyword) and node.arg == "past_key_values") or (
                isinstance(node, ast.Attribute) and node.attr == "past_key_values"
            )
            if named:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not found, f"use scalerl.model.kv_cache.with_cache / output_cache: {found}"
