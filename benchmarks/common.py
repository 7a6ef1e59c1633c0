"""What the benchmark scripts share, so that each states only what it measures.

* **Where and when it ran** (a results file's header): :func:`cpu_model`, :func:`machine` (the CPU
  model and its cores), :func:`load`/:func:`loadavg` (the load average: a shared machine's other jobs
  make timings 2-10x worse), :func:`commit` (the checkout measured), :func:`utc_now`, and all of it
  with the software's versions and the GPUs for a JSON file, :func:`environment`.
* **A reference rate**: :func:`matmul_rate`, the fp32 matmul FLOP/s of this thread, against which
  scripts set their counted-FLOP limits.
* **Alternating timing**: :func:`in_turn`, the order of a round's contenders (rotated each round, so
  drift and the machine's other load fall on all of them alike).
* **Whole runs**: :func:`start_train` (``python train.py`` in a folder of its own, its output to a
  log) and :func:`wait_train` (all of them, stopping the script where one failed).
* **A run's parts** as ``python train.py`` builds them: :func:`options` (the config composed and read
  once into its typed options), :func:`task`, :func:`policy`, :func:`loaded_policy`,
  :func:`trainer`, :func:`generator`, each from the typed options, as the run's setup hands them
  out, and :func:`length_limit` (samples cut at a length, nothing else) for the generator scripts.

A script run as ``python benchmarks/<script>.py`` has this folder first on ``sys.path``, so it
imports this module as ``common``; :func:`use_checkout` puts the checkout's ``src/`` (and, for the
scripts that reuse the tests' small models, ``tests/``) before an installed copy.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

T = TypeVar("T")


def use_checkout(*, tests: bool = False) -> None:
    """Import ``scalerl`` from this checkout's ``src/`` (and the tests' helpers from ``tests/`` with
    ``tests``), ahead of any installed copy, and this folder's scripts by name."""
    for path in [HERE, ROOT / "src"] + ([ROOT / "tests"] if tests else []):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


# ---------------------------------------------------------------------------- where and when
def cpu_model() -> str:
    """The CPU's model name: ``lscpu``'s, else ``/proc/cpuinfo``'s, else what ``platform`` says."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except Exception:  # noqa: BLE001 - no lscpu here
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> str:
    """``<CPU model>, <n> cores``: what a results file names the machine by."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages (``[]`` where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def load() -> str:
    """The load average as ``/proc/loadavg`` says it (runnable/total threads and the last pid too),
    else the three averages."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return " ".join(f"{x:.2f}" for x in loadavg()) or "unknown"


def commit(*, dirty: Sequence[str | Path] = (), root: Path = ROOT) -> str:
    """The short commit hash of the checkout at ``root`` (this one by default; ``unknown`` outside a
    git checkout); with ``dirty`` (paths), ``+uncommitted changes`` appended when any of them
    differs from that commit."""
    git = ["git", "-C", str(root)]
    try:
        out = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = out.stdout.strip() or "unknown"
    if dirty and sha != "unknown":
        diff = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", *map(str, dirty)])
        if diff.returncode:
            sha += "+uncommitted changes"
    return sha


def utc_now() -> str:
    """``YYYY-MM-DD HH:MM UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def environment(*, dirty: Sequence[str | Path] = ()) -> dict:
    """What a JSON results file records of where it ran: ``date`` (local time), ``commit`` (see
    :func:`commit`), ``cpu`` and ``cores``, the ``python`` and ``torch`` versions, and the ``gpus``
    torch sees (with the first one's name, ``gpu``, and memory, ``gpu_mem_gb``, where there is one)."""
    import torch

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(dirty=dirty),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if info["gpus"]:
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_mem_gb=round(p.total_memory / 2**30, 1))
    return info


# ---------------------------------------------------------------------------- reference rate
def matmul_rate(n: int = 2048, reps: int = 5, *, best: bool = False) -> float:
    """fp32 FLOP/s of ``n x n`` by ``n x n`` matmuls on this process's torch threads, timed by this
    thread's CPU time (a shared machine's other load does not count against it): the median of
    ``reps`` calls after one untimed, or the fastest with ``best``."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t = time.thread_time()
        torch.mm(a, b)
        times.append(time.thread_time() - t)
    return 2.0 * n**3 / (min(times) if best else statistics.median(times))


# ---------------------------------------------------------------------------- alternating timing
def in_turn(contenders: Sequence[T], round_: int) -> list[T]:
    """The order of round ``round_``'s contenders: rotated by one each round (two of them: swapped
    every other round), so each runs first as often as the others."""
    items = list(contenders)
    k = round_ % max(1, len(items))
    return items[k:] + items[:k]


# ---------------------------------------------------------------------------- whole runs
def start_train(
    folder: Path, seed: int, overrides: Sequence[str], *, env: dict | None = None
) -> subprocess.Popen:
    """``python train.py <overrides> seed=<seed>`` of this checkout, started in the background: its
    out_dir ``folder/run-<seed>``, its MLflow store ``folder/mlflow.db``, its output to
    ``folder/run-<seed>.log`` (the process's ``log_path``); ``env``: the process's environment
    (None: this one's)."""
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        f"seed={seed}",
        f"out_dir={folder / f'run-{seed}'}",
        f"tracking.uri=sqlite:///{folder / 'mlflow.db'}",
    ]
    log_path = folder / f"run-{seed}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    proc.log_path = log_path  # type: ignore[attr-defined]  (said by wait_train where the run fails)
    return proc


def wait_train(procs: Sequence[subprocess.Popen]) -> None:
    """Wait for every run of :func:`start_train`; the script stops, naming the run's log and
    command, where one failed."""
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a run failed (exit {p.returncode}): see {p.log_path} ({p.args})")


# ---------------------------------------------------------------------------- a run's parts
def options(overrides: Sequence[str]):
    """``(cfg, config)``: ``overrides`` composed like ``python train.py`` would (``cfg``, the
    DictConfig a run's loop and checkpoints keep) and read once into its typed options
    (``config``: :class:`scalerl.config.Config`), from which the helpers below build the parts."""
    from scalerl.config import compose, typed

    cfg = compose(list(overrides))
    return cfg, typed(cfg)


def task(config):
    """The run's task (:func:`scalerl.task.build_task` of its task option)."""
    from scalerl.task import build_task

    return build_task(config.task)


def policy(config, task, device, *, trained: bool = True):
    """``(model, tokenizer, precision)``: the run's policy on ``device`` under its precision option
    (:func:`scalerl.model.build.build_policy`; ``trained=False``: an inference-only copy)."""
    from scalerl.model.build import build_policy

    return build_policy(
        config.model,
        task,
        device,
        precision=config.precision,
        task_option=config.task,
        seed=config.seed,
        trained=trained,
    )


def loaded_policy(config, task):
    """``(model, tokenizer, info)``: the run's policy as loaded, fp32 on the CPU, not yet prepared
    for a precision (:func:`scalerl.model.build.load_policy`)."""
    from scalerl.model.build import load_policy

    return load_policy(config.model, task, task_option=config.task, seed=config.seed)


def trainer(config, model, precision, *, device, temperature: float | None = None):
    """The run's trainer over ``model`` (:func:`scalerl.trainer.make_trainer` of its trainer, loss,
    aggregation and correction options); ``temperature``: the generator's, unless given."""
    from scalerl.trainer import make_trainer

    return make_trainer(
        model,
        precision,
        trainer=config.trainer,
        loss=config.loss,
        aggregation=config.aggregation,
        correction=config.correction,
        temperature=config.generator.temperature if temperature is None else temperature,
        device=device,
    )


def generator(config, model, tokenizer, precision, *, device="cpu", seed: int = 0):
    """The run's generator over ``model`` (:func:`scalerl.generator.make_generator` of its generator,
    length-control and placement options)."""
    from scalerl.generator import make_generator

    return make_generator(
        config.generator,
        config.length_control,
        model,
        tokenizer,
        precision,
        device=device,
        seed=seed,
        placement=config.placement,
    )


def length_limit(max_new_tokens: int):
    """The ``length_control=none`` option capped at ``max_new_tokens``: samples cut at the cap and
    nothing else (no thinking budget, no interruption), what the generator benchmarks decode."""
    _, config = options(["length_control=none", f"length_control.max_new_tokens={int(max_new_tokens)}"])
    return config.length_control
