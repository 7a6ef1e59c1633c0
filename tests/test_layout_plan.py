"""The run's layout (scalerl.layout), computed by pure functions before anything starts: the docs'
examples (read from docs/cluster.md itself, so the page cannot drift from what the code accepts), a
grid of layouts checked rank by rank, and each placement defect of issue 56 that a CPU can show
(the batch that does not split, engine tasks over TP GPUs, local engines on several nodes, the ports of
consecutive jobs, threads from the allotment, LOCAL_WORLD_SIZE beside engine tasks, colocated vLLM
memory, trainers narrowed to their GPUs)."""

from __future__ import annotations

import copy
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY

from scalerl import layout
from scalerl.config import compose, typed
from scalerl.config.validate import ConfigError
from scalerl.layout import Launch, LayoutError, job_ports, plan
from scalerl.messages import RunError
from scalerl.sweep.job import task_env

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "cluster.md"


def _opts(cfg) -> layout.LayoutOptions:
    """The layout's options of a composed recipe, typed as setup hands them out."""
    o = typed(cfg)
    return layout.LayoutOptions.of(o)


def _launch(cfg) -> Launch:
    """The launch the recipe's own launcher option asks for."""
    o = typed(cfg)
    return layout.launch_from_launcher(o.launcher, o.trainer)


# ----------------------------------------------------------------------------- the docs' examples
def _blocks(kind: str, page: Path = DOCS) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", page.read_text(), flags=re.S)


def _words(block: str) -> list[str]:
    return shlex.split(block.replace("\\\n", " "))


def _docs_sweep() -> tuple[list[str], list[str]]:
    """(the worked example's base overrides, its sweep command's launcher overrides)."""
    sweep = next(yaml.safe_load(b) for b in _blocks("yaml") if "cluster_pipeline" in b)
    command = next(_words(b) for b in _blocks("bash") if b.startswith("python sweep.py"))
    return list(sweep["base"]), [w for w in command if w.startswith("launcher")]


def test_layout_plan_of_the_docs_two_node_example_is_accepted_and_places_every_rank():
    base, launcher = _docs_sweep()
    cfg = compose([*base, *launcher])
    lay = plan(_opts(cfg), _launch(cfg))
    assert (lay.launch.kind, lay.launch.nodes, lay.launch.tasks_per_node, lay.launch.gpus_per_node) == (
        "slurm",
        2,
        8,
        8,
    )
    batch = int(cfg.trainer.batch_size)
    trainers = [p for p in lay.ranks if p.role == "trainer"]
    assert lay.trainers == len(trainers) == 12 and sum(p.samples for p in trainers) == batch
    assert [p.visible for p in trainers[:8]] == [tuple(range(8))] * 8
    assert [p.visible for p in trainers[8:]] == [(0, 1, 2, 3)] * 4
    assert all(p.device == f"cuda:{p.local_rank}" for p in trainers)
    assert [p.local_world_size for p in trainers] == [8] * 8 + [4] * 4
    assert [(e.node, e.gpus, e.group_ranks) for e in lay.engines] == [
        (1, (4,), (1,)),
        (1, (5,), (2,)),
        (1, (6,), (3,)),
        (1, (7,), (4,)),
    ]
    assert lay.weight_world == 5 and lay.backend == "nccl"
    assert all(p.threads == 12 for p in lay.ranks)  # launcher.cpus_per_task, not the machine's cores


def test_layout_plan_refuses_the_old_docs_example_and_says_which_rank_counts_divide():
    """Defect 1: 14 trainer ranks (16 tasks, 2 generator tasks) for paper_scale's 768 = 48 x 16."""
    base, launcher = _docs_sweep()
    base = [o for o in base if not o.startswith(("placement.engines", "placement.generator_tasks"))]
    cfg = compose([*base, "placement.engines=2", "placement.generator_tasks=2", *launcher])
    with pytest.raises(LayoutError) as e:
        plan(_opts(cfg), _launch(cfg))
    msg = str(e.value)
    assert "\n" not in msg and "trainer.batch_size=768" in msg and "16 x 14 = 224" in msg, msg
    assert "1, 2, 3, 4, 6, 8, 12, 16, 24, 48" in msg and "trainer.batch_size=672 or 896" in msg, msg
    assert "placement.generator_tasks=4 (and placement.engines=4: 12 trainer ranks)" in msg, msg


def test_layout_plan_refuses_the_docs_tp_2_alternative_as_the_page_says():
    """The page's arithmetic: 2 engine tasks of TP 2 with 7 tasks a node leave 12 trainer ranks and
    need 5 + 2 x 2 = 9 GPUs on the second node."""
    base, launcher = _docs_sweep()
    base = [o for o in base if not o.startswith(("placement.engines", "placement.generator_tasks"))]
    launcher = [
        o if not o.startswith("launcher.tasks_per_node") else "launcher.tasks_per_node=7" for o in launcher
    ]
    tp2 = ["placement.engines=2", "placement.generator_tasks=2", "placement.tensor_parallel_size=2"]
    cfg = compose([*base, *tp2, *launcher])
    with pytest.raises(
        LayoutError, match=r"node 1 runs 5 trainer rank\(s\) and 2 engine task\(s\).*= 9 GPUs"
    ):
        plan(_opts(cfg), _launch(cfg))
    assert "5 + 2 x 2 = 9 GPUs on node 1: refused" in " ".join(DOCS.read_text().split())


def _docs_torchrun(page: Path = DOCS) -> tuple[int, list[str]]:
    words = next(_words(b) for b in _blocks("bash", page) if b.startswith("torchrun"))
    nproc = int(words[words.index("--nproc_per_node") + 1])
    return nproc, [w for w in words[words.index("train.py") + 1 :] if w != "..."]


@pytest.mark.parametrize("page", [DOCS, ROOT / "README.md"], ids=["cluster.md", "README"])
def test_layout_plan_of_the_docs_torchrun_example_narrows_each_trainer_to_the_gpus_left(page):
    """Defect 2: under split placement each trainer process sees only the GPUs the engines leave, so
    cuda:LOCAL_RANK (DeepSpeed's device) is its own GPU; the engines take GPUs 0-1 of the job's list."""
    nproc, overrides = _docs_torchrun(page)
    cfg = compose(overrides)
    lay = plan(_opts(cfg), Launch("torchrun", 1, nproc, 8, 4, master_port=29500))
    assert [p.role for p in lay.ranks] == ["trainer"] * 6
    assert {p.visible for p in lay.ranks} == {(2, 3, 4, 5, 6, 7)}
    assert [p.device for p in lay.ranks] == [f"cuda:{k}" for k in range(6)]
    assert [e.gpus for e in lay.engines] == [(0,), (1,)] and lay.ranks[0].local_engines == (0, 1)
    assert (lay.master_port, lay.store_port) == (29500, 29501)
    # applied to rank 3's environment: it sees physical GPUs 2-7 (of a job given 10-17) as cuda:0-5;
    # the engines rank 0 starts are told the job's ids, not the narrowed ones
    env = {"CUDA_VISIBLE_DEVICES": "10,11,12,13,14,15,16,17", "RANK": "3", "WORLD_SIZE": "6"}
    layout.apply(lay.ranks[3], lay, env, gpu_ids=env["CUDA_VISIBLE_DEVICES"].split(","))
    assert env["CUDA_VISIBLE_DEVICES"] == "12,13,14,15,16,17"
    assert env[layout.NODE_GPUS_VAR] == "10,11,12,13,14,15,16,17"
    assert [layout.physical_gpus(e.gpus, env) for e in lay.engines] == [("10",), ("11",)]
    layout.apply(lay.ranks[3], lay, env)  # once only
    assert env["CUDA_VISIBLE_DEVICES"] == "12,13,14,15,16,17"


# ----------------------------------------------------------------------------- a grid of layouts
@pytest.fixture(scope="module")
def bases():
    common = ["trainer=deepspeed", "async_mode=pipeline_rl", "generator=vllm", "trainer.threads=0"]
    return {
        "colocated": compose([*common, "placement=colocated"]),
        "split": compose([*common, "placement=split"]),
    }


def _cfg(base, *, batch, G, engines, tp, gen_tasks, device="auto"):
    cfg = copy.deepcopy(base)
    cfg.trainer.batch_size, cfg.trainer.generations_per_prompt, cfg.trainer.device = batch, G, device
    cfg.placement.engines, cfg.placement.tensor_parallel_size = engines, tp
    if "generator_tasks" in cfg.placement:
        cfg.placement.generator_tasks = gen_tasks
    cfg.generator.gpu_memory_utilization = 0.3
    return cfg


def _check_every_rank(cfg, lay):
    L = lay.launch
    batch = int(cfg.trainer.batch_size)
    trainers = [p for p in lay.ranks if p.role == "trainer"]
    assert len(lay.ranks) == L.tasks and lay.trainers == len(trainers) >= 1
    assert sum(p.samples for p in trainers) == batch  # the shares make the batch
    assert len({p.samples for p in trainers}) == 1
    assert [p.rank for p in lay.ranks] == list(range(L.tasks))
    for p in lay.ranks:
        assert p.node == p.rank // L.tasks_per_node and p.local_rank == p.rank % L.tasks_per_node
        here = [q for q in trainers if q.node == p.node]
        assert p.local_world_size == len(here)
        # threads within the task's allotment (a process needs one thread, each engine one more)
        total = p.threads + len(p.local_engines) * p.engine_threads
        assert total <= max(p.allotment, 1 + len(p.local_engines)), (p, total)
    # engines: one per engine task or local engine, their group ranks 1 + e x TP + shard, contiguous
    tp = int(cfg.placement.tensor_parallel_size)
    ranks = [0] + [r for e in lay.engines for r in e.group_ranks]
    assert ranks == list(range(lay.weight_world)) and lay.weight_world == 1 + len(lay.engines) * tp
    if not lay.on_gpu:
        assert all(p.visible is None and p.device == "cpu" for p in lay.ranks)
        return
    for node in range(L.nodes):
        used: dict[int, str] = {}  # GPU -> the role that computes on it
        for p in trainers:
            if p.node != node:
                continue
            assert p.device == f"cuda:{p.local_rank}" and p.local_rank < len(p.visible)
            gpu = p.visible[p.local_rank]
            assert gpu not in used, (node, gpu, used)
            used[gpu] = f"trainer {p.rank}"
        for e in lay.engines:
            if e.node != node:
                continue
            assert len(e.gpus) == tp and all(0 <= g < L.gpus_per_node for g in e.gpus)
            for g in e.gpus:
                if cfg.placement.name == "colocated":  # beside the trainer's rank 0, on its GPU
                    assert used.get(g) == "trainer 0", (g, used)
                else:
                    assert g not in used, (node, g, used)
                    used[g] = f"engine {e.index}"
        # an engine task computes on the GPUs of its engine
        for p in lay.ranks:
            if p.role == "engine" and p.node == node:
                assert p.visible == lay.engines[p.engine].gpus and p.device == "cuda:0"
        assert all(0 <= g < L.gpus_per_node for g in used)


def test_layout_plan_grid_checks_every_rank_of_every_layout(bases):
    accepted, refused = 0, 0
    reasons: set[str] = set()
    for nodes, gpus, per_node, tp, placement, gen_tasks, engines in itertools.product(
        (1, 2, 3, 4),
        (0, 1, 2, 4, 8),
        (1, 2, 4, 6, 8),
        (1, 2, 3, 4),
        ("colocated", "split"),
        (0, 1, 2, 4),
        (1, 2),
    ):
        if gen_tasks and (placement == "colocated" or engines != gen_tasks):
            continue  # validate() refuses these before any layout (generator_tasks: split, one engine each)
        cfg = _cfg(bases[placement], batch=96, G=4, engines=engines, tp=tp, gen_tasks=gen_tasks)
        launch = Launch("slurm", nodes, per_node, gpus, 4, job_id=nodes * 100 + per_node)
        try:
            lay = plan(_opts(cfg), launch)
        except LayoutError as e:
            msg = str(e)
            assert "\n" not in msg and "=" in msg, msg
            reasons.add(msg.split(":")[0].split(" ")[0])
            refused += 1
            continue
        accepted += 1
        _check_every_rank(cfg, lay)
        master, store = job_ports(launch.job_id)
        assert (lay.master_port, lay.store_port) == (master, store)
    assert accepted > 300 and refused > 300, (accepted, refused)
    assert len(reasons) >= 4, reasons  # several kinds of refusal, not one that takes everything


def test_layout_plan_of_one_cpu_process_is_the_plain_run():
    cfg = compose([*TINY, "async_mode=sync"])
    lay = plan(_opts(cfg), Launch("process", cpus_per_task=6))
    (me,) = lay.ranks
    assert (me.role, me.device, me.visible, me.samples, me.prompts) == ("trainer", "cpu", None, 32, 8)
    assert me.threads == 1  # TINY's trainer.threads=1: as given
    assert (lay.master_port, lay.store_port, lay.engines) == (None, 0, ())


# ----------------------------------------------------------------------------- the defects
def test_layout_plan_engine_tasks_with_tp_2_take_gpus_of_their_own():
    """Defect 7: the old serve_task gave the task at local rank k GPUs k..k+TP-1, so two TP=2 tasks
    at local ranks 4 and 5 overlapped (4-5, 5-6); the layout gives each TP GPUs after the trainers."""
    cfg = compose(
        [*TINY, "trainer=deepspeed", "async_mode=pipeline_rl", "generator=vllm", "placement=split"]
        + ["placement.engines=2", "placement.generator_tasks=2", "placement.tensor_parallel_size=2"]
        + ["trainer.batch_size=16", "trainer.device=cuda"]
    )
    ids = [f"GPU-{i}" for i in range(8)]
    got = []
    for rank in (4, 5):
        env = {"RANK": str(rank), "WORLD_SIZE": "6", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "6"}
        env |= {"MASTER_ADDR": "n0", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": ",".join(ids)}
        lay, me = layout.current(_opts(cfg), env, raw=True, gpu_ids=ids)
        assert me.role == "engine" and me.engine == rank - 4
        got.append(layout.physical_gpus(me.visible, env))
    old = [tuple(range(k, k + 2)) for k in (4, 5)]  # what the old serve_task took
    assert set(old[0]) & set(old[1])
    assert got == [("GPU-4", "GPU-5"), ("GPU-6", "GPU-7")]
    # three such tasks beside 4 trainer ranks need 4 + 3 x 2 = 10 GPUs of 8: refused, saying so
    cfg.placement.engines = cfg.placement.generator_tasks = 3
    cfg.trainer.batch_size = 16
    with pytest.raises(LayoutError, match=r"4 \+ 3 x 2 = 10 GPUs, and the job gives it 8"):
        plan(_opts(cfg), Launch("torchrun", 1, 7, 8, 2, master_port=29500))


def test_layout_plan_refuses_engines_of_rank_0_on_several_gpu_nodes():
    """Defect 8: generator devices are held on every node but only rank 0 starts engines."""
    cfg = compose(
        ["trainer=deepspeed", "async_mode=pipeline_rl", "placement=split", "placement.engines=2"]
        + ["placement.generator_devices=[0,1]", "trainer.batch_size=96"]
    )
    with pytest.raises(LayoutError) as e:
        plan(_opts(cfg), Launch("slurm", 2, 6, 8, 4))
    assert "placement.generator_tasks=2" in str(e.value) and "idle" in str(e.value)
    plan(_opts(cfg), Launch("slurm", 1, 6, 8, 4))  # one node: as before
    plan(_opts(cfg), Launch("slurm", 2, 6, 0, 4))  # on CPUs nothing is held idle


def test_layout_plan_ports_of_consecutive_job_ids_never_collide():
    """Defect 9: the store listens on MASTER_PORT + 1, and MASTER_PORT was 20000 + id mod 12000: the
    next job of an array rendezvoused on this job's store port."""
    base = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "n1",
    }
    taken: dict[int, int] = {}
    for job in range(4240, 4240 + 400):
        master = int(task_env({**base, "SLURM_JOB_ID": str(job)})["MASTER_PORT"])
        for port in (master, master + 1):  # its rendezvous and its store
            assert port not in taken, f"job {job} and job {taken[port]} both use port {port}"
            taken[port] = job
        assert job_ports(job) == (master, master + 1)
        assert 20000 <= master and master + 1 < 32000
    cfg = compose(["trainer=deepspeed", "async_mode=pipeline_rl", "trainer.batch_size=64"])
    lay = plan(_opts(cfg), Launch("slurm", 1, 2, 0, 2, job_id=4241))
    assert (lay.master_port, lay.store_port) == job_ports(4241)
    cfg.placement.port = 20007  # a fixed store port inside the range where jobs rendezvous
    with pytest.raises(LayoutError, match="placement.port=20007"):
        plan(_opts(cfg), Launch("slurm", 1, 2, 0, 2))


def test_layout_plan_threads_come_from_the_allotment_not_the_machine():
    """Defect 12: threads from SLURM's cpus_per_task or the process's affinity shared by the node's
    tasks (os.cpu_count() over the world oversubscribed a shared node)."""
    cfg = compose([*TINY, "trainer.threads=0", "trainer=deepspeed", "trainer.batch_size=64"])
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "1", "MASTER_PORT": "29500"}
    _, me = layout.current(_opts(cfg), {**env, "SLURM_CPUS_PER_TASK": "1"}, gpu_ids=[])
    assert me.allotment == me.threads == 1
    cores = len(os.sched_getaffinity(0))
    _, me = layout.current(_opts(cfg), env, gpu_ids=[])
    assert me.threads == max(1, cores // 4)
    # two local engines on a CPU take half of rank 0's cores between them
    cfg = compose([*TINY, "trainer.threads=0", "async_mode=pipeline_rl", "placement.engines=2"])
    me = plan(_opts(cfg), Launch("process", cpus_per_task=8)).ranks[0]
    assert (me.threads, me.engine_threads, me.local_engines) == (4, 2, (0, 1))


def test_layout_plan_local_world_size_counts_the_trainer_ranks_of_the_node(monkeypatch):
    """Defect 12: a node of 8 tasks of which 4 are engines has 4 trainer ranks (LOCAL_WORLD_SIZE was
    left at min(8, trainers) = 8)."""
    from scalerl.rollout.placement import engine_task

    base, launcher = _docs_sweep()
    cfg = compose([*base, *launcher])
    for k in ("CUDA_VISIBLE_DEVICES", layout.NODE_GPUS_VAR, layout.JOB_TASKS_VAR):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here: the devices are not the point
    cfg.trainer.device = "auto"
    for k, v in {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_ADDR", "n0")
    monkeypatch.setenv("MASTER_PORT", "20002")
    assert engine_task(_opts(cfg)) is None
    assert (os.environ["WORLD_SIZE"], os.environ["LOCAL_WORLD_SIZE"]) == ("12", "4")
    # and what the rank reads afterwards (setup, placement) is still the job's layout
    lay, me = layout.current(_opts(cfg))
    assert (lay.trainers, lay.launch.tasks, me.local_world_size) == (12, 16, 4)
    monkeypatch.setenv("RANK", "13")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.delenv(layout.JOB_TASKS_VAR)
    assert engine_task(_opts(cfg)) == 1


def test_layout_plan_refuses_colocated_vllm_engines_that_cannot_share_the_gpu():
    """Defect 12: colocated pipeline_rl engines never sleep; two at gpu_memory_utilization 0.5 take
    the whole of rank 0's GPU before the trainer has any."""
    cfg = compose(["async_mode=pipeline_rl", "generator=vllm", "placement.engines=2"])
    with pytest.raises(LayoutError) as e:
        plan(_opts(cfg), Launch("process", gpus_per_node=1))
    assert "generator.gpu_memory_utilization=0.25" in str(e.value), str(e.value)
    cfg.generator.gpu_memory_utilization = 0.25
    lay = plan(_opts(cfg), Launch("process", gpus_per_node=1))
    assert [e.gpus for e in lay.engines] == [(0,), (0,)] and lay.ranks[0].visible == (0,)
    plan(_opts(compose(["async_mode=pipeline_rl", "generator=vllm"])), Launch("process", gpus_per_node=1))


def test_layout_plan_needs_only_the_four_options_it_reads():
    """The layout is planned from the trainer, generator, placement and async-mode options alone
    (issue 58): the options' dataclasses, made here without composing a config, plan a run, and a
    colocated option (which has no generator_tasks or generator_devices) needs neither field."""
    from scalerl.config.groups.async_mode import PipelineRLOptions, SyncOptions
    from scalerl.config.groups.generator import HFGeneratorOption, VLLMGeneratorOption
    from scalerl.config.groups.placement import Colocated, Split
    from scalerl.config.groups.trainer import TorchTrainerOption

    trainer = TorchTrainerOption(batch_size=32, generations_per_prompt=4, threads=0)
    split = layout.LayoutOptions(trainer, VLLMGeneratorOption(), Split(engines=2), PipelineRLOptions())
    lay = plan(split, Launch("process", gpus_per_node=4, cpus_per_task=8))
    assert [e.gpus for e in lay.engines] == [(2,), (3,)] and lay.ranks[0].visible == (0,)
    assert [e.memory for e in lay.engines] == [0.5, 0.5] and lay.backend == "nccl"
    colocated = layout.LayoutOptions(trainer, HFGeneratorOption(), Colocated(engines=2), PipelineRLOptions())
    me = plan(colocated, Launch("process", cpus_per_task=8)).ranks[0]
    assert (me.threads, me.engine_threads, me.local_engines, me.samples) == (4, 2, (0, 1), 32)
    sync = layout.LayoutOptions(trainer, HFGeneratorOption(), Colocated(), SyncOptions())
    assert plan(sync, Launch("process", cpus_per_task=8)).engines == ()


def test_layout_plan_errors_are_config_errors_where_checked_and_run_errors_where_found():
    cfg = compose([*TINY, "trainer=deepspeed"])
    with pytest.raises(LayoutError) as e:
        plan(_opts(cfg), Launch("torchrun", 1, 3, 0, 1, master_port=29500))  # 32 samples over 3 ranks
    assert isinstance(e.value, ConfigError) and isinstance(e.value, RunError)


def test_layout_plan_is_checked_by_preflight_and_by_a_sweep_before_it_submits(tmp_path):
    from test_sweep import write_sweep

    from scalerl.cli import check_layout
    from scalerl.sweep import load_spec, make_plan
    from scalerl.sweep.spec import SweepError

    cfg = compose([*TINY, "trainer=deepspeed"])
    env = {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    with pytest.raises(LayoutError, match="trainer.batch_size=32"):
        check_layout(cfg, env)
    f = write_sweep(tmp_path / "s.yaml", {"a": []}, name="lp", base=["trainer=deepspeed"])
    ok = ["launcher=slurm", "launcher.nodes=2", "launcher.tasks_per_node=8", "launcher.gpus_per_node=8"]
    make_plan(load_spec(f), ok, sweep_dir=tmp_path / "out", tracking_uri="sqlite:///x.db")
    bad = [*ok[:2], "launcher.tasks_per_node=6"]  # 12 ranks for 128 samples of 8
    with pytest.raises(SweepError, match=r"variant 'a'.*trainer.batch_size=128.*8 x 12 = 96"):
        make_plan(load_spec(f), bad, sweep_dir=tmp_path / "out", tracking_uri="sqlite:///x.db")


@pytest.mark.slow  # a train.py process (about 7 s: --cfg job composes and prints, nothing trains)
def test_layout_plan_is_printed_by_cfg_job_as_the_docs_show(tmp_path):
    """The docs' printing command, run as written: the recipe, then the plan, whose lines the docs
    quote (the docs cannot drift from what it prints)."""
    words = next(_words(b) for b in _blocks("bash") if b.startswith("python train.py"))
    assert words[-2:] == ["--cfg", "job"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *words[2:]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MASTER_PORT")},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\ntrainer:\n" in r.stdout  # the recipe first
    printed = r.stdout.splitlines()
    quoted = next(b for b in _blocks("text") if b.startswith("# layout")).splitlines()
    for line in quoted:
        if line != "...":
            assert line in printed, line
    assert sum(1 for ln in printed if re.match(r"# \d+ ", ln)) == 16  # every rank of the job
    assert list(tmp_path.iterdir()) == []  # printing writes nothing
    bad = [w for w in words[2:-2] if w != "launcher.tasks_per_node=8"] + [
        "launcher.tasks_per_node=7",
        "--cfg",
        "job",
    ]
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *bad],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "trainer.batch_size=768" in r.stderr  # 14 tasks - 4 engines = 10 trainer ranks
