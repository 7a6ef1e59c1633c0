"""What one GPU machine without vLLM can check of the GPU path (issues #29 and #30), in one bounded run.

    launch/gpu_check.sh                                  # on the GPU machine (installs .whl/ first)
    python benchmarks/gpu_check.py --out DIR             # the same, dependencies already installed
    python benchmarks/gpu_check.py --cpu-smoke --out DIR # tiny versions of every part on a CPU

Parts, each timed, each asserting what it reports (a part that fails is FAIL with its error; the
others still run), within ``--budget-s`` in all:

* ``transport``: the trainer's weights, its own tensors on CUDA, sent by
  :class:`scalerl.transport.WeightSender` (``gloo``, small ``bucket_mb``: several buckets per update)
  to a :class:`~scalerl.transport.WeightReceiver` in a CPU process that loads them into a model of
  its own; every tensor it holds after each version is bitwise equal (SHA-256 of its bytes) to what
  was sent; the publish latency (what the trainer waits) and the time until the receiver has loaded
  them, for the embedded model and a SmolLM2-135M-shaped one. With >= 2 GPUs also the NCCL pair
  (``cuda:0`` -> ``cuda:1``).
* ``devices``: short ``async_mode=pipeline_rl`` runs of the embedded default (``python train.py
  trainer.device=cuda ...``), with one engine process and with ``placement.engines=2`` (two HF
  engines colocated on the one GPU, weights over gloo): the trainer process and every engine process
  seen holding the GPU (NVML's process list, and the processes' open ``/dev/nvidia*`` files; the
  engines' pids from a wrapper around ``train.py``'s entry point in the same process), every engine
  holding the trainer's last published weights bit for bit (``EnginePool.fingerprints()``), the
  run's own ``device``, ``compute/devices`` (1 on one GPU) and ``perf/gpu_mem_peak_gb``; groups
  trained, tokens/s, the gen/train log-prob gap, and ``perf/weight_update_s`` (what handing the
  weights to the engines costs per update, logged by the run at every step).
* ``memory``: ``benchmarks/bench_memory.py --suite gpu``: peak GPU memory of one trainer step
  against model size (135M, 0.5B, 1.5B shapes), response tokens per micro-batch (2k, 8k), the
  LM head chunked or not, activation checkpointing off or on; an OOM is a measured row.
* ``deepspeed``: ``trainer=deepspeed`` ZeRO-1 and ZeRO-3 in ``async_mode=sync``, and ZeRO-3 with
  ``pipeline_rl`` (the engine fed gathered weights: every published tensor whole, and the engine's
  fingerprints those of the trainer's gathered weights).

What needs vLLM or several GPUs is listed as not run. Writes ``<out>/gpu_check.{md,json}`` (after
every part, so a cut-off run keeps what it measured) and ``<out>/gpu_check_logs.txt`` (each run's
log tail); prints the one-screen report. Exit status 0 when every part that ran passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import common

HERE, ROOT = common.HERE, common.ROOT

# the embedded default (its warm-start too: a shorter one starts at pass rate ~0, where every group
# has zero variance and every step is skipped), fewer evaluation prompts
GPU_BASE = [
    "trainer.device=cuda",
    "eval.every=10",
    "eval.num_prompts=32",
    "checkpoint_every=10",
    "progress=log",
]
GPU_STEPS = {"devices": 16, "devices_2engines": 8, "deepspeed": 8}
# tests/conftest.py's TINY: seconds per run on a CPU (after a warm-start of ~40 s, shared)
SMOKE_BASE = [
    "trainer.device=cpu",
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
    "eval.every=2",
    "eval.num_prompts=8",
    "eval.samples_per_prompt=2",
    "checkpoint_every=2",
    "generator.chunk_prompts=4",
    "trainer.threads=1",
    "progress=log",
]
SMOKE_STEPS = {"devices": 3, "devices_2engines": 2, "deepspeed": 2}
# seconds per part (each also gets at most what is left of --budget-s)
PART_TIMEOUT = {"transport": 100, "devices": 190, "memory": 110, "deepspeed": 150}
SMOKE_PART_TIMEOUT = {"transport": 120, "devices": 420, "memory": 240, "deepspeed": 420}
ORDER = ["transport", "devices", "memory", "deepspeed"]
# the transport's model sizes: the embedded default (gpt2 128 x 3) and SmolLM2-135M's shape
TRANSPORT_SHAPES = {
    "embedded": dict(
        arch="gpt2", hidden=128, layers=3, heads=4, kv_heads=4, intermediate=512, vocab=64, tied=False
    ),
    "smollm2-135m": dict(
        arch="llama", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, tied=True
    ),
}

# weight-update buckets per shape (placement.bucket_mb): small, so that every update is several buckets
TRANSPORT_BUCKET_MB = {"embedded": 0.25, "smollm2-135m": 16.0}


# ---------------------------------------------------------------------- results
class Part:
    """One part's outcome: checks (each a claim and what was seen), facts, an error, its time."""

    def __init__(self, name: str):
        self.name = name
        self.status = "PASS"
        self.checks: list[dict] = []
        self.facts: dict = {}
        self.lines: list[str] = []  # the report's detail lines
        self.error: str | None = None
        self.seconds = 0.0

    def check(self, what: str, ok: bool, seen, expected=None, note: str = "") -> bool:
        self.checks.append({"check": what, "ok": bool(ok), "seen": seen, "expected": expected, "note": note})
        return bool(ok)

    def fail(self, error: str) -> None:
        self.error = error
        self.status = "FAIL"

    def finish(self) -> None:
        if self.status == "PASS" and any(not c["ok"] for c in self.checks):
            self.status = "FAIL"

    def to_json(self) -> dict:
        return {
            "part": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 1),
            "checks": self.checks,
            "facts": self.facts,
            "error": self.error,
            "lines": self.lines,
        }


def _fmt(x, spec=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def render(info: dict, parts: list[Part], not_run: list[str]) -> str:
    head = (
        f"scalerl GPU check: {info.get('gpu', 'no GPU')} x {info.get('gpus', 0)}, torch {info['torch']}, "
        f"Python {info['python']}, {info['cores']} CPU cores, {info['date']}"
        + (" [CPU SMOKE: tiny versions on a CPU]" if info.get("cpu_smoke") else "")
    )
    lines = [head, "=" * min(len(head), 110)]
    for p in parts:
        lines.append(f"[{p.status}] {p.name} ({p.seconds:.0f} s)")
        lines += [f"    {x}" for x in p.lines]
        for c in p.checks:
            if not c["ok"]:
                exp = "" if c["expected"] is None else f", expected {c['expected']}"
                note = f" ({c['note']})" if c["note"] else ""
                lines.append(f"    FAILED CHECK: {c['check']}: saw {c['seen']}{exp}{note}")
        if p.error:
            lines += [f"    ERROR: {x}" for x in p.error.strip().splitlines()[-6:]]
    lines += [f"[NOT RUN] {x}" for x in not_run]
    n_ok = sum(c["ok"] for p in parts for c in p.checks)
    n = sum(len(p.checks) for p in parts)
    lines.append(f"checks passed: {n_ok} of {n}; parts: " + ", ".join(f"{p.name} {p.status}" for p in parts))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the machine
def machine(cpu_smoke: bool) -> dict:
    info = {**common.environment(), "cpu_smoke": cpu_smoke}
    for name in ("transformers", "deepspeed", "mlflow", "hydra", "omegaconf"):
        try:
            mod = __import__(name)
            info[f"v_{name}"] = getattr(mod, "__version__", "?")
        except Exception as e:
            info[f"v_{name}"] = f"missing ({type(e).__name__})"
    return info


class GpuProcesses:
    """Which processes hold a GPU: NVML's compute-process list (memory used, per GPU), and the
    ``/dev/nvidia<N>`` files each process of interest has open (a CUDA context opens them)."""

    def __init__(self):
        self.nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as e:
            self.error = f"NVML unavailable: {type(e).__name__}: {e}"

    def nvml_pids(self) -> dict[int, dict[int, float]]:
        """pid -> {gpu index: MiB used}."""
        out: dict[int, dict[int, float]] = {}
        if self.nvml is None:
            return out
        for i, h in enumerate(self.handles):
            try:
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                continue
            for p in procs:
                used = p.usedGpuMemory
                out.setdefault(int(p.pid), {})[i] = (used or 0) / 2**20
        return out

    @staticmethod
    def device_files(pid: int) -> list[str]:
        found = set()
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/dev/nvidia"):
                    found.add(target)
        except OSError:
            pass
        return sorted(found)


# ---------------------------------------------------------------------- train.py runs
def train_wrapper(record: str, overrides: list[str]) -> None:
    """``train.py`` in this process (the same entry point, arguments and code), with three looks at
    pipeline_rl's :class:`~scalerl.rollout.pool.EnginePool` that change nothing it does: the engine
    processes' pids once they are ready, the digest (SHA-256 per tensor) of the weights the trainer
    published last (taken after ``load_weights`` returned, outside what ``perf/weight_update_s``
    times), and before the pool closes each engine's :meth:`fingerprints` of what it samples with.
    The record is written after each."""
    rec: dict = {"instrumented": False, "engine_pids": [], "published_version": None}
    state: dict = {}

    def save() -> None:
        Path(record).write_text(json.dumps(rec))

    try:
        from scalerl.generator.base import digests
        from scalerl.rollout.pool import EnginePool

        orig_ready, orig_load, orig_close = EnginePool.wait_ready, EnginePool.load_weights, EnginePool.close

        def wait_ready(self):
            orig_ready(self)
            pids = [int(p.pid) for p in self.procs if p.pid is not None]
            if pids != rec["engine_pids"]:
                rec["engine_pids"] = pids
                rec["backend"] = str(getattr(self.placement, "backend", "?"))
                save()

        def load_weights(self, weights, version):
            orig_load(self, weights, version)
            if self.placement.main and getattr(self, "source_of", None) is not None:
                with self.source_of(weights)(weights.names(False)) as tensors:
                    # an engine under native bf16/fp16 holds the trainer's fp32 master weights cast
                    # to its dtype (with an fp32 head, only the body's): each tensor's digest as sent
                    # and as each such cast, compared tensor by tensor at close
                    import torch

                    casts = {"as sent": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
                    by_cast = {
                        c: digests({k: (v if dt is None else v.to(dt)) for k, v in tensors.items()})
                        for c, dt in casts.items()
                    }
                    state["digests"] = {k: {c: by_cast[c][k] for c in casts} for k in tensors}
                    rec["tensor_devices"] = sorted({str(v.device) for v in tensors.values()})
                    rec["min_numel"] = min((int(v.numel()) for v in tensors.values()), default=0)
                rec["published_version"] = int(version)
                save()

        def close(self):
            try:
                if self.started and self.ready and self.alive() and "digests" in state:
                    prints = self.fingerprints()
                    want = state["digests"]  # name -> {cast: digest}

                    def held_as(p: dict) -> dict:  # name -> the cast the engine's tensor matches, or None
                        return {k: next((c for c, d in want[k].items() if p.get(k) == d), None) for k in want}

                    held = [held_as(p) for p in prints]
                    rec["fingerprints"] = {
                        "version": rec["published_version"],
                        "engines": len(prints),
                        "tensors": len(want),
                        "equal": [
                            set(p) == set(want) and None not in h.values() for p, h in zip(prints, held)
                        ],
                        "held_as": [sorted(set(h.values()), key=str) for h in held],
                        "differ": [
                            sorted(k for k in set(p) | set(want) if h.get(k) is None)[:5]
                            for p, h in zip(prints, held)
                        ],
                    }
            except Exception as e:  # noqa: BLE001 - reported, the run's own close goes on
                rec["fingerprints"] = {"error": f"{type(e).__name__}: {e}"}
            save()
            orig_close(self)

        EnginePool.wait_ready, EnginePool.load_weights, EnginePool.close = wait_ready, load_weights, close
        rec["instrumented"] = True
    except Exception as e:  # the pipeline's shape changed: the run goes on, unobserved
        rec["not_instrumented"] = f"{type(e).__name__}: {e}"
    save()
    sys.argv = [str(ROOT / "train.py"), *overrides]
    from scalerl.cli import main

    main()


def _descendants(pid: int) -> dict[int, dict]:
    import psutil

    out = {}
    try:
        root = psutil.Process(pid)
        for c in root.children(recursive=True):
            try:
                depth, q = 1, c.parent()
                while q is not None and q.pid != pid:
                    depth, q = depth + 1, q.parent()
                out[c.pid] = {"depth": depth, "cmd": " ".join(c.cmdline())[:120]}
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return out


def _read_store(db: Path, run_id: str) -> tuple[dict, dict[str, list[tuple[int, float]]]]:
    """(params, metric histories) of one run, read from MLflow's sqlite store with sqlite3."""
    con = sqlite3.connect(str(db))
    try:
        params = dict(con.execute("SELECT key, value FROM params WHERE run_uuid=?", (run_id,)).fetchall())
        hist: dict[str, list[tuple[int, float]]] = {}
        for key, value, step in con.execute(
            "SELECT key, value, step FROM metrics WHERE run_uuid=? ORDER BY step, timestamp", (run_id,)
        ):
            hist.setdefault(key, []).append((int(step), float(value)))
    finally:
        con.close()
    return params, hist


class Ctx:
    def __init__(self, args, work: Path):
        self.args, self.work = args, work
        self.smoke = args.cpu_smoke
        self.base = SMOKE_BASE if self.smoke else GPU_BASE
        self.steps = SMOKE_STEPS if self.smoke else GPU_STEPS
        self.db = work / "mlflow.db"
        self.logs: list[str] = []
        self.gpus = 0
        self.deadline = 0.0

    def left(self) -> float:
        return self.deadline - time.time()


def train_run(ctx: Ctx, name: str, overrides: list[str], timeout: float) -> dict:
    """One ``train.py`` run (through :func:`train_wrapper`), its GPU holders sampled meanwhile."""
    out = ctx.work / name
    record = ctx.work / f"{name}.engines.json"
    args = [
        *ctx.base,
        *overrides,
        f"out_dir={out}",
        f"tracking.uri=sqlite:///{ctx.db}",
        "tracking.experiment=gpu-check",
    ]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--train-wrapper", str(record), "--", *args]
    env = {
        **os.environ,
        "SCALERL_CACHE": str(ctx.work / "cache"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = ctx.work / f"{name}.log"
    gp = GpuProcesses() if ctx.gpus else None
    seen: dict[int, dict] = {}  # pid -> what was seen of it
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ctx.work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = False
        while proc.poll() is None:
            if time.time() - t0 > timeout:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group (started above)
                proc.wait()
                break
            tree = {proc.pid: {"depth": 0, "cmd": "train.py (trainer)"}, **_descendants(proc.pid)}
            nv = gp.nvml_pids() if gp else {}
            for pid, meta in tree.items():
                s = seen.setdefault(pid, {**meta, "nvml_mib": {}, "device_files": []})
                for gpu, mib in nv.get(pid, {}).items():
                    s["nvml_mib"][gpu] = max(s["nvml_mib"].get(gpu, 0.0), mib)
                if gp:
                    files = GpuProcesses.device_files(pid)
                    s["device_files"] = sorted(set(s["device_files"]) | set(files))
            time.sleep(0.5)
    wall = time.time() - t0
    text = log_path.read_text(errors="replace")
    ctx.logs.append(f"===== {name}: {' '.join(cmd[4:])}\n" + "\n".join(text.splitlines()[-60:]))
    res: dict = {
        "name": name,
        "rc": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "wall_s": wall,
        "procs": seen,
        "nvml": None if gp is None else (gp.nvml is not None or gp.error),
    }
    try:
        res["engines"] = json.loads(record.read_text())
    except Exception:
        res["engines"] = None
    summary_file = out / "summary.json"
    if summary_file.is_file():
        res["summary"] = json.loads(summary_file.read_text())
        res["params"], res["metrics"] = _read_store(ctx.db, res["summary"]["run_id"])
    if timed_out or proc.returncode != 0:
        why = f"timed out after {timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
        res["error"] = f"{why}:\n" + "\n".join(text.splitlines()[-12:])
    return res


def _last(hist: dict, key: str):
    h = hist.get(key) or []
    return h[-1][1] if h else None


def run_checks(
    p: Part, r: dict, steps: int, *, gpu: bool, engines: int, expected_devices: int | None
) -> None:
    """What every train.py run of the check asserts; facts and lines into ``p``."""
    name = r["name"]
    if not p.check(
        f"{name}: the run finished", r.get("rc") == 0 and "summary" in r, r.get("error", "ok")[-300:]
    ):
        return
    s, params, m = r["summary"], r["params"], r["metrics"]
    p.check(f"{name}: steps", s["steps"] == steps, s["steps"], steps)
    dev = params.get("device", "?")
    p.check(
        f"{name}: the run's device",
        dev.startswith("cuda") if gpu else dev == "cpu",
        dev,
        "cuda" if gpu else "cpu",
    )
    losses = [v for _, v in m.get("train/loss", [])]
    p.check(
        f"{name}: train/loss finite at every step",
        bool(losses) and all(math.isfinite(x) for x in losses),
        len(losses),
    )
    # a step with no group to train on (every group's rewards equal) is skipped and logs a gap of 0
    skipped = {st for st, v in m.get("train/step_skipped", []) if v > 0}
    trained = sum(v for _, v in m.get("train/groups_trained", []))
    p.check(
        f"{name}: groups trained (steps not all skipped)",
        trained > 0,
        f"{trained:.0f} groups, {len(skipped)} steps skipped",
    )
    gap = [v for st, v in m.get("train/gen_train_logprob_diff", []) if st not in skipped]
    p.check(
        f"{name}: gen/train log-prob gap logged and finite on trained steps",
        bool(gap) and all(math.isfinite(x) for x in gap),
        len(gap),
    )
    facts = {
        "wall_s": round(r["wall_s"], 1),
        "run_s": round(s["wall_seconds"], 1),
        "s_per_step": s["wall_seconds"] / max(1, s["steps"]),
        "tokens_per_s": _last(m, "perf/tokens_per_s"),
        "gen_train_logprob_diff_mean": sum(gap) / len(gap) if gap else None,
        "groups_trained": trained,
        "steps_skipped": len(skipped),
        "gen_train_logprob_diff_max": max(gap) if gap else None,
        "gpu_mem_peak_gb": _last(m, "perf/gpu_mem_peak_gb"),
        "compute/devices": params.get("compute/devices"),
        "policy_lag_max": max((v for _, v in m.get("train/policy_lag_max", [])), default=None),
        "body/head": f"{params.get('precision/body_dtype')} / {params.get('precision/head_dtype')}",
        "pass_rate": f"{_fmt(s.get('pass_rate_start'))} -> {_fmt(s.get('pass_rate_final'))}",
    }
    # the run's mean seconds per weight update so far (its first: the engines joining included)
    wu = dict(m.get("perf/weight_update_s", []))
    eng = r.get("engines") or {}
    facts.update(
        weight_update_s=wu[max(wu)] if wu else None,
        weight_update_s_first=wu[min(wu)] if wu else None,
        transport_backend=eng.get("backend"),
        published_tensor_devices=eng.get("tensor_devices"),
        published_min_numel=eng.get("min_numel"),
    )
    p.check(f"{name}: tokens/s > 0", (facts["tokens_per_s"] or 0) > 0, facts["tokens_per_s"])
    if gpu:
        p.check(
            f"{name}: perf/gpu_mem_peak_gb > 0", (facts["gpu_mem_peak_gb"] or 0) > 0, facts["gpu_mem_peak_gb"]
        )
    if expected_devices is not None:
        p.check(
            f"{name}: compute/devices = the devices the job holds",
            str(facts["compute/devices"]) == str(expected_devices),
            facts["compute/devices"],
            expected_devices,
            note="issue #29's bug (cuda and cuda:0 counted as two) is fixed: one GPU counts 1" if gpu else "",
        )
    # who held the GPU: the trainer (depth 0) and, in pipeline_rl, each engine process (its pid
    # recorded by the wrapper; a descendant of the trainer, through the fork server)
    procs = r["procs"]
    holders = {
        pid: x
        for pid, x in procs.items()
        if x["nvml_mib"] or any(f[len("/dev/nvidia") :].isdigit() for f in x["device_files"])
    }
    engine_pids = [int(x) for x in eng.get("engine_pids") or []]
    facts["engine_pids"] = engine_pids

    def role(pid: int, x: dict) -> str:
        if x["depth"] == 0:
            return "trainer"
        if pid in engine_pids:
            return f"engine {engine_pids.index(pid)}"
        return f"descendant depth {x['depth']}"

    facts["gpu_holders"] = {
        str(pid): {"role": role(pid, x), "nvml_mib": x["nvml_mib"], "files": x["device_files"]}
        for pid, x in holders.items()
    }
    if engines:
        p.check(
            f"{name}: {engines} engine process(es) started, each seen running",
            len(engine_pids) == engines and all(pid in procs for pid in engine_pids),
            f"pids {engine_pids}, seen {[pid for pid in engine_pids if pid in procs]}",
            engines,
        )
        train_steps = sorted({st for st, _ in m.get("train/loss", [])})
        p.check(
            f"{name}: perf/weight_update_s logged at every step, finite, > 0",
            bool(train_steps)
            and all(st in wu for st in train_steps)
            and all(math.isfinite(x) and x > 0 for x in wu.values()),
            f"steps {sorted(wu)}",
            f"steps {train_steps}",
        )
        fp = eng.get("fingerprints") or {}
        p.check(
            f"{name}: every engine holds the trainer's last published weights bit for bit",
            fp.get("engines") == engines and all(fp.get("equal") or [False]),
            fp or eng.get("not_instrumented", "no fingerprints"),
            note="SHA-256 per tensor: the trainer's at its last load_weights, each engine's from fingerprints()",
        )
    if gpu:
        p.check(
            f"{name}: the trainer process holds the GPU",
            any(x["depth"] == 0 for x in holders.values()),
            facts["gpu_holders"],
        )
        if engines:
            on_gpu = [pid for pid in engine_pids if pid in holders]
            p.check(
                f"{name}: every engine process holds the GPU",
                bool(engine_pids) and len(on_gpu) == len(engine_pids) == engines,
                f"{len(on_gpu)} of {engines} engines ({engine_pids}); holders {facts['gpu_holders']}",
                engines,
            )
        if r.get("nvml") is not True:
            facts["nvml"] = r.get("nvml")
    p.facts[name] = facts


def run_line(name: str, f: dict) -> str:
    return (
        f"{name}: {_fmt(f['s_per_step'])} s/step, {_fmt(f['tokens_per_s'], '.0f')} tokens/s, "
        f"gen/train |dlogp| mean {_fmt(f['gen_train_logprob_diff_mean'])} (max {_fmt(f['gen_train_logprob_diff_max'])}), "
        f"{f['groups_trained']:.0f} groups trained, "
        f"peak {_fmt(f['gpu_mem_peak_gb'])} GiB, devices {f['compute/devices']}, pass {f['pass_rate']}"
    )


# ---------------------------------------------------------------------- part a: devices
def engine_lines(f: dict) -> list[str]:
    lines = [
        f"weight updates to the engines over {f['transport_backend']}: perf/weight_update_s "
        f"{_fmt(f['weight_update_s'])} s per update over the run (what the trainer waits; "
        f"{_fmt(f['weight_update_s_first'])} s at step 0, the engines joining); tensors published from "
        f"{f['published_tensor_devices']}; max policy lag {_fmt(f['policy_lag_max'])}"
    ]
    for pid, h in f["gpu_holders"].items():
        lines.append(
            f"GPU held by pid {pid} ({h['role']}): NVML MiB {h['nvml_mib'] or '-'}, {', '.join(h['files'])}"
        )
    if f.get("nvml"):
        lines.append(f"NVML: {f['nvml']}")
    return lines


def part_devices(ctx: Ctx, p: Part, timeout: float) -> None:
    """pipeline_rl with one engine process, then with two colocated on the same device."""
    gpu = not ctx.smoke
    expected = 1 if gpu and ctx.gpus == 1 else None  # one GPU held, however many processes use it
    t_end = time.time() + timeout
    cases = [
        ("pipeline", 1, ctx.steps["devices"], max(timeout * 0.6, timeout - 65)),  # with the warm-start
        ("pipeline_2engines", 2, ctx.steps["devices_2engines"], timeout),
    ]
    errors = []
    for name, engines, steps, limit in cases:
        left = min(limit, t_end - time.time())
        if left < 20:
            p.check(f"{name}: run", False, "not run: out of time")
            continue
        overrides = ["async_mode=pipeline_rl", f"placement.engines={engines}", f"trainer.total_steps={steps}"]
        r = train_run(ctx, name, overrides, left)
        run_checks(p, r, steps, gpu=gpu, engines=engines, expected_devices=expected)
        f = p.facts.get(name)
        if f:
            p.lines.append(run_line(f"{name} ({engines} engine{'s' if engines > 1 else ''})", f))
            p.lines += [f"  {x}" for x in engine_lines(f)]
        if r.get("error"):
            errors.append(f"{name}: {r['error']}")
    if errors:
        p.fail("\n".join(errors))


# ---------------------------------------------------------------------- part b: DeepSpeed
def part_deepspeed(ctx: Ctx, p: Part, timeout: float) -> None:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:
        p.fail(f"deepspeed does not import: {type(e).__name__}: {e}")
        return
    steps = ctx.steps["deepspeed"]
    gpu = not ctx.smoke
    cases = [
        ("zero1_sync", ["trainer=deepspeed", "trainer.zero_stage=1", "async_mode=sync"], False),
        ("zero3_sync", ["trainer=deepspeed", "trainer.zero_stage=3", "async_mode=sync"], False),
        ("zero3_pipeline", ["trainer=deepspeed", "trainer.zero_stage=3", "async_mode=pipeline_rl"], True),
    ]
    t_end = time.time() + timeout
    errors = []
    for name, overrides, pipe in cases:
        left = t_end - time.time()
        if left < 15:
            p.check(f"{name}: run", False, "not run: out of time")
            continue
        r = train_run(ctx, name, [*overrides, f"trainer.total_steps={steps}"], min(left, timeout / 2))
        run_checks(p, r, steps, gpu=gpu, engines=1 if pipe else 0, expected_devices=None)
        f = p.facts.get(name)
        if f:
            p.lines.append(run_line(name, f))
            if pipe:  # ZeRO-3: the engine fed gathered weights (the fingerprint check: every tensor whole)
                p.check(
                    f"{name}: every published tensor whole (ZeRO-3 gathered)",
                    (f["published_min_numel"] or 0) > 0,
                    f["published_min_numel"],
                    "> 0",
                )
                p.lines += [f"  {x}" for x in engine_lines(f)]
        if r.get("error"):
            errors.append(f"{name}: {r['error']}")
    if errors:
        p.fail("\n".join(errors))


# ---------------------------------------------------------------------- part c: the transport
def _digests(state: dict) -> dict[str, str]:
    import hashlib

    import torch

    out = {}
    for k, v in state.items():
        b = v.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[k] = hashlib.sha256(b).hexdigest()
    return out


def _bench_memory():
    """benchmarks/bench_memory.py as a module (this folder on the import path once)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import bench_memory

    return bench_memory


def _build(shape: dict, dtype: str, seed: int = 0):
    import torch

    from scalerl.model.build import build_model

    mcfg = _bench_memory().shape_cfg(shape, 256)
    model = build_model(mcfg, shape["vocab"], seed=seed, pad_token_id=0, eos_token_id=1)
    return model.to(getattr(torch, dtype))


def transport_receiver(spec, rank: int, shape: dict, dtype: str, device: str, last: int, q) -> None:
    """The generator's side, in a process of its own: a :class:`~scalerl.transport.WeightReceiver`
    loading each announced update into its own model (built from other initial weights) until version
    ``last``; after each, the SHA-256 of every tensor it now holds and when it had them."""
    try:
        import torch

        from scalerl.transport import WeightReceiver, load_into

        model = _build(shape, dtype, seed=1).to(device)
        rx = WeightReceiver(spec, rank, device)
        rx.layout.check_matches(model)
        q.put(("buckets", None, time.time(), len(rx.layout.buckets)))
        current, deadline = -1, time.time() + spec.timeout_s
        while current < last and time.time() < deadline:
            v = rx.announced()
            if v is None or v == current:
                time.sleep(0.0005)
                continue
            if v != current + 1:
                raise RuntimeError(f"version {v} announced after {current}: one was skipped")
            load_into(model, rx.receive())
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            current = v
            q.put(("version", v, time.time(), _digests(model.state_dict())))
        q.put(("done", current, time.time(), None))
    except Exception:
        q.put(("error", None, time.time(), traceback.format_exc()))


def transport_case(
    shape_name: str, dtype: str, backend: str, sender: str, receiver: str, updates: int, bucket_mb: float
) -> dict:
    import multiprocessing as mp

    import torch

    from scalerl.transport import Layout, TransportSpec, WeightSender, connect

    shape = TRANSPORT_SHAPES[shape_name]
    model = _build(shape, dtype).to(sender)
    state = {k: v.detach() for k, v in model.state_dict().items()}  # the trainer's own tensors
    n_bytes = sum(v.numel() * v.element_size() for v in state.values())
    layout = Layout.of(state, bucket_mb)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    spec = TransportSpec(backend, "127.0.0.1", 0, world=2, timeout_s=120)
    store = connect(spec, master=True)
    spec = TransportSpec(backend, "127.0.0.1", store.port, world=2, timeout_s=120)
    proc = ctx.Process(
        target=transport_receiver, args=(spec, 1, shape, dtype, receiver, updates, q), daemon=True
    )
    proc.start()
    tx = WeightSender(store, spec, layout, device=sender, alive=proc.is_alive)
    out = {
        "shape": shape_name,
        "dtype": dtype,
        "backend": backend,
        "from": sender,
        "to": receiver,
        "mbytes": n_bytes / 1e6,
        "bucket_mb": bucket_mb,
        "buckets": len(layout.buckets),
        "tensor_devices": sorted({str(v.device) for v in state.values()}),
    }
    publish_s, e2e_s, equal, tensors = [], [], [], len(state)
    gen = torch.Generator(device=sender).manual_seed(0)
    seen_buckets = []

    def wait_for(v: int):
        while True:
            kind, got, t, payload = q.get(timeout=120)
            if kind == "error":
                raise RuntimeError(f"receiver failed:\n{payload}")
            if kind == "buckets":
                seen_buckets.append(payload)
                continue
            if kind == "done":
                raise RuntimeError(f"receiver stopped at version {got}, before {v}")
            if got == v:
                return t, payload

    try:
        for v in range(updates + 1):
            if v:
                with torch.no_grad():  # the trainer's step: new weights in place
                    for t in state.values():
                        if t.is_floating_point():
                            t.add_(torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) * 1e-3)
            if sender.startswith("cuda"):
                torch.cuda.synchronize(sender)
            sent = _digests(state)
            t0 = time.time()
            tx.publish(state, v)
            publish_s.append(time.time() - t0)
            loaded, dig = wait_for(v)
            e2e_s.append(loaded - t0)
            equal.append(dig == sent)
        proc.join(timeout=30)
    finally:
        tx.close()
        if proc.is_alive():
            proc.kill()
    out.update(
        versions=len(equal),
        bitwise_equal=all(equal) and len(equal) == updates + 1,
        equal_per_version=equal,
        tensors=tensors,
        receiver_buckets=seen_buckets[0] if seen_buckets else None,
        publish_s=publish_s,
        loaded_after_s=e2e_s,
        sender_seconds=tx.seconds,
        sender_updates=tx.updates,
    )
    return out


def part_transport_child(smoke: bool, gpus: int) -> dict:
    """The transport part's cases, in a process of its own (a hung collective is killed with it)."""
    import torch

    sender = "cpu" if smoke else "cuda:0"
    cases = [("embedded", "float32"), ("embedded", "bfloat16")]
    if not smoke:
        cases.append(("smollm2-135m", "float32"))
    rows = [transport_case(s, d, "gloo", sender, "cpu", 3, TRANSPORT_BUCKET_MB[s]) for s, d in cases]
    if not smoke and gpus >= 2:
        rows += [
            transport_case(s, d, "nccl", "cuda:0", "cuda:1", 3, TRANSPORT_BUCKET_MB[s])
            for s, d in (cases[0], cases[-1])
        ]
    return {"rows": rows, "torch": torch.__version__}


def part_transport(ctx: Ctx, p: Part, timeout: float) -> None:
    res_file = ctx.work / "transport.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--transport-child",
        str(res_file),
        str(int(ctx.smoke)),
        str(ctx.gpus),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    try:
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True
        )
        rc, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = (
            None,
            f"timed out after {timeout:.0f} s\n"
            + (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")),
        )
    ctx.logs.append(f"===== transport ({time.time() - t0:.0f} s)\n" + "\n".join(text.splitlines()[-60:]))
    if rc != 0 or not res_file.is_file():
        p.fail(f"exit {rc}:\n" + "\n".join(text.splitlines()[-12:]))
        return
    rows = json.loads(res_file.read_text())["rows"]
    p.facts["cases"] = rows
    for row in rows:
        label = f"{row['shape']} {row['dtype']} ({row['mbytes']:.1f} MB) {row['backend']} {row['from']} -> {row['to']}"
        p.check(f"{label}: bitwise equal, every version", row["bitwise_equal"], row["equal_per_version"])
        p.check(
            f"{label}: several buckets (bucket_mb={row['bucket_mb']}), the receiver's layout the same",
            row["buckets"] >= 3 and row["receiver_buckets"] == row["buckets"],
            f"{row['buckets']} sent, {row['receiver_buckets']} in the receiver's layout",
            ">= 3",
        )
        p.check(
            f"{label}: the trainer's tensors on {row['from']}",
            row["tensor_devices"] == [row["from"]],
            row["tensor_devices"],
        )
        # version 0 also waits for the receiver to start and the group to form: the means are of the rest
        pub, e2e = (
            row["publish_s"][1:] or row["publish_s"],
            row["loaded_after_s"][1:] or row["loaded_after_s"],
        )
        p.lines.append(
            f"{label}: {row['versions']} versions x {row['tensors']} tensors in {row['buckets']} buckets, bitwise "
            f"equal={row['bitwise_equal']}; publish {_fmt(sum(pub) / len(pub))} s (what the trainer waits), "
            f"loaded after {_fmt(sum(e2e) / len(e2e))} s (mean of updates 1-{len(pub)}; the first, with the "
            f"group forming: {_fmt(row['loaded_after_s'][0])} s)"
        )


# ---------------------------------------------------------------------- part d: memory
def part_memory(ctx: Ctx, p: Part, timeout: float) -> None:
    bench_memory = _bench_memory()
    rows = bench_memory.run_gpu_suite(ctx.smoke, "cpu" if ctx.smoke else "cuda", timeout - 3)
    (ctx.work / "memory.json").write_text(json.dumps(rows, indent=1))
    p.facts["rows"] = rows
    p.facts["table"] = bench_memory.gpu_table(rows)
    errors = [r for r in rows if "error" in r and not r.get("oom")]
    measured = [r for r in rows if "step_peak" in r]
    ooms = [r for r in rows if r.get("oom")]
    p.check("every configuration measured or OOM", not errors, [r["error"] for r in errors] or "all")
    # chunking claim (issue #30): the chunked head's peak is not above the unchunked one's
    by = {}
    for r in measured:
        s = r["spec"]
        by[(s["model"], r["positions_per_micro_batch"], s["ckpt"], bool(s["chunk"]))] = r
    for (model, tok, ck, chunked), r in sorted(by.items()):
        if not chunked:
            continue
        u = by.get((model, tok, ck, False))
        if u is None:
            continue
        p.check(
            f"{model} {tok} tokens ckpt={'on' if ck else 'off'}: chunked head peak <= unchunked",
            r["step_peak"] <= u["step_peak"] * 1.02 + 1,
            f"{r['step_peak']:.0f} vs {u['step_peak']:.0f} MB",
        )
    models = []
    for r in measured:
        if r["spec"]["model"] not in models:
            models.append(r["spec"]["model"])
    unit = "MB resident" if ctx.smoke else "GB on the GPU"
    scale = 1 if ctx.smoke else 1e3
    for model in models:
        rs = [r for r in measured if r["spec"]["model"] == model]
        peaks = ", ".join(
            f"{r['positions_per_micro_batch']}t/{'c' if r['spec']['chunk'] else 'u'}{'/ckpt' if r['spec']['ckpt'] else ''} "
            f"{r['step_peak'] / scale:.3g}"
            for r in rs
        )
        p.lines.append(f"{model} ({rs[0]['params'] / 1e6:.3g}M params) step peak {unit}: {peaks}")
    if ooms:
        p.lines.append(
            "OOM: " + ", ".join(f"{r['spec']['model']} {r['positions_per_micro_batch']}t" for r in ooms)
        )
    p.lines.append(
        "(t = response tokens per micro-batch, c/u = LM head chunked 1024 / unchunked; table in gpu_check.md)"
    )
    if errors:
        p.fail("\n".join(r["error"] for r in errors))


PARTS = {
    "transport": part_transport,
    "devices": part_devices,
    "memory": part_memory,
    "deepspeed": part_deepspeed,
}


def not_run_lines(gpus: int, smoke: bool) -> list[str]:
    lines = [
        "generator=vllm (engine device per process, in-process and cross-process weight updates into vLLM, "
        "the fp32 head under vLLM): needs vLLM, absent here (launch/gpu_vllm_check.sh with a vLLM wheelhouse)",
        "weight updates received inside vLLM workers, several vLLM engines, tensor parallelism (#29 item 2): "
        "needs vLLM (several HF engines on one GPU run in devices)",
    ]
    if gpus < 2:
        lines += [
            f"NCCL transport pair and the split placement (generator on a GPU of its own): needs >= 2 GPUs, "
            f"{'a CPU smoke run' if smoke else f'this machine has {gpus}'}",
            "several trainer ranks (torchrun, DeepSpeed over >1 GPU) and multi-node SLURM: needs >= 2 GPUs / nodes",
        ]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny versions of every part, on the CPU")
    ap.add_argument("--only", nargs="*", choices=ORDER, help="these parts (default: all)")
    ap.add_argument(
        "--budget-s", type=float, default=None, help="all parts together (default 345; smoke 1300)"
    )
    ap.add_argument("--work", type=Path, help="runs' folders (default: a new temporary folder)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--train-wrapper"]:  # internal: one train.py run (record file, then its overrides)
        train_wrapper(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    if argv[:1] == ["--transport-child"]:  # internal: the transport part's process
        import faulthandler

        faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where it is
        path, smoke, gpus = argv[1:4]
        Path(path).write_text(json.dumps(part_transport_child(smoke == "1", int(gpus))))
        return 0
    a = ap.parse_args(argv)

    import torch

    info = machine(a.cpu_smoke)
    if not a.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --cpu-smoke to check the script on a CPU", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(a, work)
    ctx.gpus = 0 if a.cpu_smoke else info["gpus"]
    budget = a.budget_s if a.budget_s is not None else (1300 if a.cpu_smoke else 345)
    ctx.deadline = time.time() + budget
    timeouts = SMOKE_PART_TIMEOUT if a.cpu_smoke else PART_TIMEOUT
    not_run = not_run_lines(ctx.gpus, a.cpu_smoke)
    parts: list[Part] = []

    def write() -> str:
        text = render(info, parts, not_run)
        tables = [f"\n## {p.name}: table\n\n{p.facts['table']}\n" for p in parts if "table" in p.facts]
        (a.out / "gpu_check.md").write_text("```\n" + text + "```\n" + "".join(tables))
        doc = {"machine": info, "budget_s": budget, "parts": [p.to_json() for p in parts], "not_run": not_run}
        (a.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
        (a.out / "gpu_check_logs.txt").write_text("\n\n".join(ctx.logs) + "\n")
        return text

    for name in a.only or ORDER:
        p = Part(name)
        parts.append(p)
        left = ctx.left()
        if left < 20:
            p.status = "NOT RUN"
            p.error = f"out of time: {left:.0f} s of the {budget:.0f} s budget left"
            write()
            continue
        timeout = min(timeouts[name], left)
        t0 = time.time()
        print(f"--- {name} (at most {timeout:.0f} s)", flush=True)
        try:
            PARTS[name](ctx, p, timeout)
        except Exception:
            p.fail(traceback.format_exc())
        p.seconds = time.time() - t0
        p.finish()
        print(f"--- {name}: {p.status} in {p.seconds:.0f} s", flush=True)
        write()
    text = write()
    print(text, end="")
    print(f"(written: {a.out}/gpu_check.md, gpu_check.json, gpu_check_logs.txt; runs in {work})")
    return 0 if all(p.status == "PASS" for p in parts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
