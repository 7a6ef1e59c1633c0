"""Pytest plugin: the ``slurm_cluster`` fixture for tests marked ``@pytest.mark.slurm``.

Load it from ``tests/conftest.py``: ``pytest_plugins = ["slurm_fixture"]`` while tests/ has no
``__init__.py`` (pytest's default "prepend" import mode puts tests/ on sys.path; this works for
``pytest`` and ``python -m pytest`` from any folder), or ``pytest_plugins = ["tests.slurm_fixture"]``
once tests/ is a package (with tests/__init__.py).

The cluster itself is started outside pytest by ``launch/start_slurm.sh`` (CI: ``.ci/run``, two
nodes: ``SCALERL_SLURM_NODES=2``), which prints ``export SLURM_CONF=...``. Without ``SLURM_CONF``
the slurm tests are skipped, unless ``SCALERL_REQUIRE_SLURM=1`` (set by CI): then they fail. The
fixture says which nodes are up (``SlurmCluster.nodes``); a test that needs several calls
``require_nodes(n)``: skipped on a smaller cluster, failed there under ``SCALERL_REQUIRE_SLURM=1``.
Tests that need only SLURM's client commands (``srun`` on PATH), not a cluster, are marked
``slurm_client`` instead (:func:`need_client`): fast, and skipped or failed the same way.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REQUIRE_ENV = "SCALERL_REQUIRE_SLURM"
START_HINT = "start one with `launch/start_slurm.sh` and `export SLURM_CONF=<base>/etc/slurm.conf`"


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    partition: str
    nodes: tuple[str, ...]  # the default partition's nodes, every one up (idle, mixed, ...)

    def require_nodes(self, n: int) -> None:
        """Skip (fail under SCALERL_REQUIRE_SLURM=1) unless the default partition has ``n`` nodes."""
        if len(self.nodes) < n:
            _unavailable(
                f"the test needs {n} nodes and partition {self.partition} has {len(self.nodes)} "
                f"({', '.join(self.nodes)}); start one with `SCALERL_SLURM_NODES={n} launch/start_slurm.sh`"
            )

    def run(self, *cmd: str, timeout: float = 30) -> str:
        """Run a SLURM client command (sacct, squeue, ...) against this cluster; return stdout."""
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def sacct_state(self, job_id: str) -> str:
        """Final allocation state of a job as accounting records it, e.g. 'COMPLETED'."""
        out = self.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State")
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        return lines[-1].split()[0] if lines else ""


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"SLURM cluster required ({REQUIRE_ENV}=1) but {reason}", pytrace=False)
    pytest.skip(f"no SLURM cluster: {reason}")


CLIENT_WHY = (
    "needs SLURM's `srun` on PATH (submitit's SlurmExecutor refuses to be built without it, even to "
    "write a job's script; no cluster needed): apt-get install slurm-client (.ci/install_system.sh)"
)


def need_client() -> None:
    """For tests marked ``slurm_client`` (tests/conftest.py): they build a real submitit
    ``SlurmExecutor`` to read the job script scalerl asks for, which needs SLURM's client installed
    but no running cluster, so they stay in the fast selection where the client is there. Skipped
    where it is not (a pip-only install), failed instead under ``SCALERL_REQUIRE_SLURM=1`` (CI)."""
    if shutil.which("srun") is not None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{CLIENT_WHY} ({REQUIRE_ENV}=1)", pytrace=False)
    pytest.skip(CLIENT_WHY)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        _unavailable(f"SLURM_CONF is not set; {START_HINT}")
    if not Path(conf).is_file():  # set but wrong: an error, not a skip
        pytest.fail(f"SLURM_CONF={conf} does not exist; {START_HINT}", pytrace=False)
    for tool in ("sinfo", "sbatch", "sacct", "scancel", "srun"):
        if shutil.which(tool) is None:
            _unavailable(f"`{tool}` is not on PATH (install with .ci/install_system.sh)")
    # SLURM_CONF is set: from here on a broken cluster is an error, not a skip.
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%P %N %T"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
        subprocess.run(
            ["sacct", "-n", "-X", "-S", "now-1minutes"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        pytest.fail(
            f"SLURM_CONF={conf} is set but the cluster does not answer ({exc}): {stderr.strip()}; "
            f"is it started? ({START_HINT}; logs under <base>/log)",
            pytrace=False,
        )
    # one line a (partition, node): "debug* scalerl-n1 idle"
    nodes: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        part, node, state = line.split()
        nodes.setdefault(part, {})[node] = state
    default = next((p for p in nodes if p.endswith("*")), None)
    if default is None:
        pytest.fail(f"no default partition in `sinfo` output: {out!r}", pytrace=False)
    down = {n: s for n, s in nodes[default].items() if s not in _UP}
    if down:
        pytest.fail(f"default partition {default}: nodes not up {down} (`sinfo -R` says why)", pytrace=False)
    return SlurmCluster(conf=Path(conf), partition=default.rstrip("*"), nodes=tuple(sorted(nodes[default])))


_UP = ("idle", "mixed", "allocated", "completing")


def preempt(job_id: str, took_sigterm) -> None:
    """What SLURM sends a preempted job: SIGTERM (submitit's handler ignores it), then USR2 (submitit
    checkpoints and runs `scontrol requeue`). USR2 is sent once ``took_sigterm()`` says the job's
    tasks have the SIGTERM: sent back to back, the SIGTERM could arrive after the USR2 and kill the
    `scontrol requeue` its handler runs, and the job failed instead of requeuing (CI, a fast machine)."""
    subprocess.run(["scancel", job_id, "--signal", "SIGTERM"], check=True, timeout=20)
    deadline = time.monotonic() + 60
    while not took_sigterm():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} did not take the SIGTERM within 60 s")
        time.sleep(0.1)
    subprocess.run(["scancel", job_id, "--signal", "USR2"], check=True, timeout=20)


def took_sigterm(*logs: Path) -> bool:
    """Whether every one of ``logs`` (submitit's stderr files) shows submitit's handler took a SIGTERM."""
    try:
        return all("Bypassing signal SIGTERM" in Path(f).read_text() for f in logs)
    except OSError:
        return False
