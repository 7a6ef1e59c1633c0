"""A run across two nodes (``launcher.nodes=2 launcher.tasks_per_node=2``) on the two-node cluster
that ``SCALERL_SLURM_NODES=2 launch/start_slurm.sh`` starts on this machine (CI does): nodes
scalerl-n1 and scalerl-n2, one slurmd each, each in a UTS namespace whose hostname is the node's
name. The four tasks are ranks 0-3 of one DeepSpeed run on CPU over gloo: ranks 0-1 on the first
node, 2-3 on the second, rendezvous at the first node's name.

The nodes' address: 127.0.0.1 for both (the default, every daemon loopback-only), or node k at
127.0.0.k with ``SCALERL_SLURM_OWN_ADDRS=1`` (launch/README.md says why not by default); the test
checks that each rank listens on its own node's address, either way. What one machine cannot
show: all nodes share one network namespace, so every 127.0.0.k is local to every process, and a
process that binds another node's address works here where on separate machines it would fail.

Needs ``SLURM_CONF`` and two nodes (see tests/slurm_fixture.py): skipped without them, failed
without them when ``SCALERL_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest
import torch
from procs import listening_addresses
from test_slurm_multitask import DEEPSPEED_CPU, _sweep_in_background
from test_sweep import TINY_BASE, TINY_TASK, _client, _runs, write_sweep
from test_sweep_slurm import _finish, _wait_for

pytestmark = pytest.mark.slurm

TWO_NODES = ["launcher.nodes=2", "launcher.tasks_per_node=2"]
STEPS = 3
# submitit's first line in each task's log: socket.gethostname() and SLURM's node/task ids
JOB_ENV = re.compile(
    r"Starting with JobEnvironment\(job_id=\S+, hostname=(\S+), local_rank=(\d+)\((\d+)\), "
    r"node=(\d+)\((\d+)\), global_rank=(\d+)\((\d+)\)\)"
)
# scalerl.sweep.job's line: the rank the task exported for the run
RANK_LINE = re.compile(
    r"\[sweep\] task: rank (\d+) of (\d+) \(local (\d+) of (\d+)\), rendezvous (\S+):(\d+)"
)


class _Listeners:
    """Samples, every 0.3 s while the run goes, the TCP addresses that each task of a SLURM job
    listens on, from /proc: gloo's device in a rank listens on the address its hostname resolves
    to, which says whether a node's ranks took their node's address. Records ``(job id,
    SLURMD_NODENAME, SLURM_PROCID, address)`` of the Python processes that slurmd started."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if not (proc / "comm").read_text().startswith("python"):
                    continue
                env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
                if "SLURMD_NODENAME" not in env or "SLURM_PROCID" not in env:
                    continue
                key = (_job_id(env), env["SLURMD_NODENAME"], int(env["SLURM_PROCID"]))
                self.seen.update((*key, addr) for addr, _ in listening_addresses(int(proc.name)))
            except (OSError, ValueError):  # the process ended while being read
                continue

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)


def _job_id(env: dict[str, str]) -> str:
    """A task's job as squeue/sacct name it: ``<array job>_<index>`` for an element of an array."""
    if "SLURM_ARRAY_JOB_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env["SLURM_JOB_ID"]


def _task_logs(out: Path, job: str, tasks: int) -> list[str]:
    """Each task's stderr + stdout (submitit: <job>_<task>_log.err / .out)."""
    log0 = Path(json.loads((out / "status.json").read_text())[job]["log"])
    texts = []
    for task in range(tasks):
        err = log0.with_name(log0.name.replace("_0_log.err", f"_{task}_log.err"))
        texts.append(err.read_text() + err.with_suffix(".out").read_text())
    return texts


def test_two_node_job_runs_one_deepspeed_run_with_two_ranks_on_each_node(slurm_cluster, tmp_path, _cache_dir):
    """2 nodes x 2 tasks: ranks 0-1 on scalerl-n1, 2-3 on scalerl-n2 (each task's hostname, SLURM
    node id and exported RANK / LOCAL_RANK agree), one DeepSpeed run of world 4 on gloo with each
    rank on its node's address, every step logged once, the ranks' weights equal at the end."""
    slurm_cluster.require_nodes(2)
    n1, n2 = slurm_cluster.nodes[:2]
    name = "two_nodes"
    f = write_sweep(
        tmp_path / f"{name}.yaml",
        {"ds4": []},
        name=name,
        base=[*TINY_BASE, *TINY_TASK, *DEEPSPEED_CPU, f"trainer.total_steps={STEPS}"],
    )
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    with _Listeners() as listeners:
        with _sweep_in_background(f, out, uri, slurm_cluster.partition, tmp_path, TWO_NODES) as proc:
            rc, stdout, stderr = _finish(proc, 600)
    assert rc == 0, stderr[-3000:]

    status = json.loads((out / "status.json").read_text())
    assert list(status) == ["ds4"] and status["ds4"]["status"] == "finished", status
    job = status["ds4"]["job_id"]
    _wait_for(lambda: slurm_cluster.sacct_state(job) == "COMPLETED", 60, f"job {job} to be COMPLETED")

    # accounting: the job held both nodes, its one step ran 4 tasks over both
    rows = slurm_cluster.run("sacct", "-n", "-P", "-j", job, "-o", "JobID,NNodes,NTasks,NodeList,State")
    steps = {r.split("|")[0]: r.split("|")[1:] for r in rows.splitlines() if r.strip()}
    assert steps[job][0] == "2", rows
    assert steps[f"{job}.0"][:2] == ["2", "4"] and steps[f"{job}.0"][3] == "COMPLETED", rows
    nodelist = slurm_cluster.run("scontrol", "show", "hostnames", steps[f"{job}.0"][2]).split()
    assert nodelist == [n1, n2], rows

    # each task: where it ran (submitit's JobEnvironment) and the rank it exported (the sweep's line)
    logs = _task_logs(out, "ds4", 4)
    master = None
    for task, text in enumerate(logs):
        env = JOB_ENV.search(text)
        assert env, text[-2000:]
        hostname, local, per_node, node, nodes, rank, world = env.groups()
        expect_node = task // 2
        assert (int(rank), int(world), int(local), int(per_node)) == (task, 4, task % 2, 2), env[0]
        assert (int(node), int(nodes)) == (expect_node, 2), env[0]
        # the task runs on its node's slurmd, whose UTS namespace has the node's name as hostname
        assert hostname == (n1, n2)[expect_node], env[0]
        line = RANK_LINE.search(text)
        assert line, text[-2000:]
        r, w, lr, lw, addr, port = line.groups()
        assert (int(r), int(w), int(lr), int(lw)) == (task, 4, task % 2, 2), line[0]
        assert addr == n1, line[0]  # rank 0's node: the first host of SLURM_JOB_NODELIST
        assert master in (None, port), line[0]  # one rendezvous for all four
        master = port

    # gloo: every rank listened on its own node's address (and on none of another node's); a
    # wildcard listener (every interface: the TCPStore of rank 0) belongs to no node
    addr = dict(line.split() for line in slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %o").splitlines())
    # a node's name resolves to its NodeAddr here (MASTER_ADDR is the first node's name)
    assert {n: socket.gethostbyname(n) for n in (n1, n2)} == {n: addr[n] for n in (n1, n2)}, addr
    seen = {rank: set() for rank in range(4)}
    for job_id, node, rank, address in listeners.seen:
        if job_id == job and address not in ("0.0.0.0", "0" * 32):
            assert node == (n1, n2)[rank // 2], (rank, node)
            seen[rank].add(address)
    assert seen == {rank: {addr[(n1, n2)[rank // 2]]} for rank in range(4)}, (seen, addr)

    summary = json.loads((out / "ds4" / "summary.json").read_text())
    assert summary["steps"] == STEPS
    engine = out / "ds4" / "checkpoint" / "engine" / f"step_{STEPS:08d}"
    files = sorted(p.name for p in engine.glob("scalerl_rank_*.pt"))
    assert files == [f"scalerl_rank_{r:05d}.pt" for r in range(4)], files
    digests = {torch.load(engine / p, weights_only=False)["weights_digest"] for p in files}
    assert len(digests) == 1, "the ranks' weights differ"

    client = _client(uri)
    runs = _runs(client, name)
    parent = next(r for r in runs if r.data.tags.get("sweep.role") == "parent")
    children = [r for r in runs if r.info.run_id != parent.info.run_id]
    assert [r.info.run_name for r in children] == ["ds4"]
    run = children[0]
    assert run.info.status == "FINISHED" and run.info.run_id == summary["run_id"]
    history = client.get_metric_history(run.info.run_id, "train/reward")
    assert [m.step for m in history] == list(range(1, STEPS + 1))  # logged once (by rank 0), every step
