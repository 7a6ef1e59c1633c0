"""Runs of several tasks (processes) per job: the launcher settings, what each task of a job sets for
torch.distributed (sweep/job.py), and the devices a run holds (loop/accounting.py).

The SLURM environments here are plain input data, as SLURM sets them in a task (variable names
and formats from SLURM 22.05's srun/sbatch man pages and from the dev cluster's tasks); the real
2-task job is in test_slurm_multitask.py."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_sweep import write_sweep

from scalerl.loop.accounting import devices_held, job_cpus, job_gpus
from scalerl.rollout.modes import Placement
from scalerl.sweep import load_spec, make_plan
from scalerl.sweep.job import check_store_here, export_task_env, finished_elsewhere, job_ports, task_env
from scalerl.sweep.launch import Launcher, local_threads, make_executor, max_parallel, num_tasks

# task 5 of a 2-node job of 4 tasks per node (global rank 5: the second node's local rank 1)
SLURM_2x4 = {
    "SUBMITIT_EXECUTOR": "slurm",
    "SLURM_JOB_ID": "4242",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "MASTER_ADDR": "127.0.0.1",  # from the sweep's own environment: replaced
    "RANK": "0",
}


# ----------------------------------------------------------------------------- task environment
def test_a_slurm_task_becomes_its_rank_of_the_run():
    env = dict(SLURM_2x4)
    got = export_task_env(env)
    assert got == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu-node07",  # the first node: where rank 0 runs
        "MASTER_PORT": str(job_ports(4242)[0]),
    }
    assert {k: env[k] for k in got} == got  # exported, replacing what was there
    assert env["SLURM_PROCID"] == "5"  # the rest untouched


def test_every_task_of_a_job_agrees_on_the_rendezvous_and_has_its_own_rank():
    tasks = []
    for rank in range(8):
        env = {
            **SLURM_2x4,
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % 4),
            "SLURM_NODEID": str(rank // 4),
        }
        tasks.append(task_env(env))
    assert sorted(int(t["RANK"]) for t in tasks) == list(range(8))
    assert {(t["MASTER_ADDR"], t["MASTER_PORT"], t["WORLD_SIZE"]) for t in tasks} == {
        ("gpu-node07", str(job_ports(4242)[0]), "8")
    }
    # another job (another element of the sweep's array) rendezvouses on another port
    assert task_env({**SLURM_2x4, "SLURM_JOB_ID": "4243"})["MASTER_PORT"] != tasks[0]["MASTER_PORT"]


def test_node_lists_of_several_groups_give_the_first_host():
    env = {**SLURM_2x4, "SLURM_JOB_NODELIST": "a100-[3,5-6],h100-1"}
    assert task_env(env)["MASTER_ADDR"] == "a100-3"


def test_a_job_of_one_task_or_no_job_sets_nothing():
    one = {
        **SLURM_2x4,
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NUM_NODES": "1",
    }
    before = dict(one)
    assert export_task_env(one) == {}  # a one-process run ...
    # ... without the MASTER_ADDR and RANK the sweep's own environment passed on: its local engines
    # would have dialled that host
    assert one == {k: v for k, v in before.items() if k not in ("MASTER_ADDR", "RANK")}
    assert export_task_env({"PATH": "/bin"}) == {}  # train.py, or torchrun's own variables
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}
    assert export_task_env(torchrun) == {} and torchrun["MASTER_ADDR"] == "10.0.0.1"


def test_a_task_placed_other_than_block_by_block_is_refused():
    """The layout puts rank r on node r // tasks per node; SLURM's cyclic distribution puts it on
    node r % nodes, where another rank's GPU would be taken twice."""
    cyclic = {**SLURM_2x4, "SLURM_PROCID": "5", "SLURM_NODEID": "1", "SLURM_LOCALID": "2"}
    with pytest.raises(RuntimeError, match=r"task 5 of 8 runs on node 1 as local task 2.*block distribution"):
        task_env(cyclic)
    with pytest.raises(RuntimeError, match="block distribution"):
        task_env({**SLURM_2x4, "SLURM_PROCID": "5", "SLURM_NODEID": "0", "SLURM_LOCALID": "1"})


def test_local_executor_tasks_rendezvous_on_loopback():
    env = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "31337",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
    }
    assert task_env(env) == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(job_ports(31337)[0]),
    }


def test_a_broken_task_environment_says_which_variable():
    env = {k: v for k, v in SLURM_2x4.items() if k != "SLURM_NTASKS"}
    with pytest.raises(RuntimeError, match="SLURM_NTASKS is not set"):
        task_env(env)
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST is not set"):
        task_env({k: v for k, v in SLURM_2x4.items() if k != "SLURM_JOB_NODELIST"})
    with pytest.raises(RuntimeError, match="every node must run as many tasks"):
        task_env({**SLURM_2x4, "SLURM_NTASKS": "7"})


def test_a_requeued_job_of_a_finished_run_does_not_wait_for_rank_0(tmp_path):
    """Rank 0 returns a finished run's summary without starting torch.distributed: the other ranks
    must not wait for it in the rendezvous."""
    run = (str(tmp_path), 4)  # the run's out_dir and trainer.total_steps
    rank1, rank0 = task_env(SLURM_2x4), {**task_env(SLURM_2x4), "RANK": "0"}
    assert not finished_elsewhere(*run, rank1)  # nothing run yet
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 3}))
    assert not finished_elsewhere(*run, rank1)  # stopped before its last step: resume
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4}))
    assert finished_elsewhere(*run, rank1)
    assert not finished_elsewhere(*run, rank0) and not finished_elsewhere(
        *run, {}
    )  # rank 0 / one task: train()


# ----------------------------------------------------------------------------- launcher settings
def _plan(tmp_path, *launcher: str):
    f = write_sweep(tmp_path / "s.yaml", {"a": []}, name="mt", base=["trainer=deepspeed"])
    return make_plan(load_spec(f), list(launcher), sweep_dir=tmp_path / "out", tracking_uri="sqlite:///x.db")


def _sbatch(tmp_path, *launcher: str) -> list[str]:
    """The #SBATCH lines of the job script submitit writes for the plan (nothing is submitted; the
    tests calling this are marked ``slurm_client``)."""
    ex = make_executor(_plan(tmp_path, *launcher))
    return [
        ln for ln in ex._make_submission_file_text("true", "uid").splitlines() if ln.startswith("#SBATCH")
    ]


@pytest.mark.slurm_client  # submitit's SlurmExecutor, built to write the job script, needs srun
def test_slurm_job_of_two_nodes_asks_for_its_tasks_and_gpus(tmp_path):
    lines = _sbatch(
        tmp_path,
        "launcher=slurm",
        "launcher.nodes=2",
        "launcher.tasks_per_node=8",
        "launcher.gpus_per_node=8",
    )
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=8" in lines
    assert "#SBATCH --gpus-per-node=8" in lines
    assert not any("gpus-per-task" in ln for ln in lines)


@pytest.mark.slurm_client  # submitit's SlurmExecutor, built to write the job script, needs srun
def test_gpus_per_task_are_held_per_node_so_each_task_sees_the_nodes_gpus(tmp_path):
    lines = _sbatch(tmp_path, "launcher=slurm", "launcher.tasks_per_node=4", "launcher.gpus_per_task=2")
    assert "#SBATCH --ntasks-per-node=4" in lines and "#SBATCH --gpus-per-node=8" in lines
    assert "#SBATCH --nodes=1" in lines and not any("gpus-per-task" in ln for ln in lines)


@pytest.mark.slurm_client  # submitit's SlurmExecutor, built to write the job script, needs srun
def test_default_slurm_job_is_one_task_without_gpus(tmp_path):
    lines = _sbatch(tmp_path, "launcher=slurm")
    assert "#SBATCH --nodes=1" in lines and "#SBATCH --ntasks-per-node=1" in lines
    assert not any("gpus" in ln for ln in lines)
    assert num_tasks(_plan(tmp_path, "launcher=slurm").launcher) == 1


def test_local_executor_runs_the_tasks_of_a_run(tmp_path):
    plan = _plan(tmp_path, "launcher.tasks_per_node=2")
    assert num_tasks(plan.launcher) == 2
    assert make_executor(plan).parameters["tasks_per_node"] == 2
    # runs at once, sized to the machine: a core per task, each run with its share of the cores
    cores = os.cpu_count() or 1
    one, two = max_parallel({**plan.launcher, "tasks_per_node": 1}), max_parallel(plan.launcher)
    assert one == cores and two == max(1, cores // 2)
    assert max_parallel({**plan.launcher, "max_parallel": 3}) == 3  # set: as it is
    assert local_threads(plan.launcher, []) == [f"trainer.threads={max(1, cores // (two * 2))}"]
    assert local_threads({**plan.launcher, "max_parallel": 1}, []) == [
        f"trainer.threads={max(1, cores // 2)}"
    ]
    assert local_threads(plan.launcher, ["trainer.threads=3"]) == []  # the sweep's own setting stays
    # what each local job is given to compose (a SLURM job's processes get the cores SLURM gives them)
    overrides, _, _ = Launcher(plan, "parent")._args(plan.runs[0])
    assert overrides == [*plan.runs[0].overrides, *local_threads(plan.launcher, [])]
    slurm = _plan(tmp_path, "launcher=slurm")
    assert Launcher(slurm, "parent")._args(slurm.runs[0])[0] == slurm.runs[0].overrides


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["launcher.nodes=2"],
            "invalid config value launcher.nodes=2: must be 1 (launcher=local runs on this machine; "
            "use launcher=slurm for several nodes)",
        ),
        (
            ["launcher.tasks_per_node=0"],
            "invalid config value launcher.tasks_per_node=0: must be an integer >= 1",
        ),
        (
            ["launcher=slurm", "launcher.nodes=0"],
            "invalid config value launcher.nodes=0: must be an integer >= 1",
        ),
        (
            ["launcher=slurm", "launcher.gpus_per_task=-1"],
            "invalid config value launcher.gpus_per_task=-1: must be >= 0",
        ),
        (
            ["launcher=slurm", "launcher.gpus_per_task=1", "launcher.gpus_per_node=8"],
            "invalid config value launcher.gpus_per_task=1: must be 0 when launcher.gpus_per_node is set (8): "
            "set one of the two (gpus_per_node = tasks_per_node x gpus_per_task)",
        ),
    ],
)
def test_a_bad_launcher_setting_is_one_line(tmp_path, overrides, line):
    with pytest.raises(Exception) as e:
        _plan(tmp_path, *overrides)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(line), msg


# ----------------------------------------------------------------------------- devices held
CPU, GPU, GPU0, GPU1 = (
    torch.device("cpu"),
    torch.device("cuda"),
    torch.device("cuda", 0),
    torch.device("cuda", 1),
)
NO_JOB: dict = {}


def test_one_gpu_counts_once_whether_or_not_its_index_is_written():
    """The bug: pick_device gives ``cuda``, PipelineRL's generator shares ``cuda:0``: 1, not 2."""
    if torch.cuda.is_available():
        torch.cuda.set_device(0)  # ``cuda`` is the current device
    assert devices_held(GPU, Placement(8, 8, GPU0), 1, generator_process=True, environ=NO_JOB) == 1
    assert devices_held(GPU0, Placement(8, 8, GPU), 1, generator_process=True, environ=NO_JOB) == 1
    assert devices_held(GPU, Placement(8, 8, GPU), 1, generator_process=False, environ=NO_JOB) == 1


def test_split_placement_counts_the_generators_gpu():
    assert (
        devices_held(GPU, Placement(8, 8, GPU1, generator_gpus=1), 1, generator_process=True, environ=NO_JOB)
        == 2
    )
    assert (
        devices_held(GPU0, Placement(8, 8, GPU1, generator_gpus=1), 1, generator_process=True, environ=NO_JOB)
        == 2
    )


def test_a_job_holding_8_gpus_counts_8_whatever_the_run_uses():
    """One process on a node of 8 reserved GPUs: the reservation is what is paid."""
    job = {"SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}
    assert (
        devices_held(GPU, Placement(8, 8, GPU1, generator_gpus=1), 1, generator_process=True, environ=job)
        == 8
    )
    assert devices_held(GPU0, Placement(8, 8, GPU0), 8, generator_process=False, environ=job) == 8
    # two nodes of 8: 16, from any of the variables SLURM sets
    assert job_gpus({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8"}) == 16
    assert job_gpus({"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}) == 16
    assert job_gpus({"SLURM_NNODES": "2", "SLURM_GPUS_PER_NODE": "a100:8"}) == 16
    assert job_gpus({"SLURM_JOB_NUM_NODES": "2"}) == 0  # no GPUs held
    # no job: its own processes
    assert devices_held(GPU0, Placement(8, 8, GPU0), 4, generator_process=False, environ=NO_JOB) == 4


def test_cpu_threads_and_the_cpus_a_job_holds():
    # no job: each trainer process's threads, plus a pipeline generator process's own
    assert devices_held(CPU, Placement(2, 2, CPU), 1, generator_process=False, environ=NO_JOB) == 2
    assert devices_held(CPU, Placement(6, 2, CPU), 1, generator_process=True, environ=NO_JOB) == 8
    assert devices_held(CPU, Placement(4, 4, CPU), 2, generator_process=False, environ=NO_JOB) == 8
    # a SLURM job of 2 tasks x 4 CPUs on each of 2 nodes holds 16, used or not
    job = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}
    assert devices_held(CPU, Placement(1, 1, CPU), 4, generator_process=False, environ=job) == 16
    assert devices_held(CPU, Placement(8, 8, CPU), 4, generator_process=False, environ=job) == 32  # more used
    assert job_cpus({"SLURM_JOB_CPUS_PER_NODE": "4(x2),2"}) == 10
    assert job_cpus(NO_JOB) == 0


def test_a_job_that_does_not_see_the_sweep_s_sqlite_store_is_refused(tmp_path):
    """A job on a node that does not share the driver's folder created a new empty store there and
    logged its run into it: the sweep's report found nothing, long after."""
    db = tmp_path / "mlflow.db"
    with pytest.raises(
        RuntimeError, match=r"tracking.uri=sqlite:///.*mlflow.db: the sweep's MLflow store is not on"
    ):
        check_store_here(f"sqlite:///{db}")
    db.write_bytes(b"")  # the driver made it
    check_store_here(f"sqlite:///{db}")
    check_store_here("http://127.0.0.1:5000")  # a server: every node reaches the same store
