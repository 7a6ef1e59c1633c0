"""The GPU path, end to end: `python train.py ...` on CUDA for each case below, timed and checked.

    python benchmarks/bench_gpu.py                     # every case (~6 min on one H100)
    python benchmarks/bench_gpu.py --only default sync # some of them
    python benchmarks/bench_gpu.py --steps 40          # steps for the shorter cases

Each case is the real command a user runs (a fresh `train.py` process with the case's overrides;
``trainer.device=cuda``), writing to its own folder and a shared MLflow sqlite store; the
warm-start cache is shared (``SCALERL_CACHE`` when set, so a second invocation reuses it), so the
first case of a model pays for its warm-start (reported). Per case: wall seconds of
the run (``summary.json``: the steps and the evaluations), seconds per step, generated tokens/s,
the generator's and trainer's busy fractions, the held-out pass rate at the start and end, the
trainer's peak GPU memory (``perf/gpu_mem_peak_gb``), the largest policy lag, and the effective
dtypes the run logged (native bf16 on CUDA). Cases:

* ``default`` / ``sync``: the README's main job (the ScaleRL recipe, 200 steps) in ``pipeline_rl``
  (generator process on the same GPU when there is one) and in ``sync``;
* ``fp32`` / ``bf16``: the other precisions, ``sync``;
* ``zero1`` / ``zero2`` / ``zero3``: ``trainer=deepspeed`` on one GPU (NCCL), ``sync``;
  ``zero3_pipeline``: ZeRO-3 with the generator process fed gathered weights;
* ``big_sync`` / ``big_pipeline``: a 134M-parameter Qwen2-shaped policy (hidden 1024, 12 layers,
  GQA 16/4) on the same task, for throughput only (``filter=none``: every batch is trained on).

Writes ``<out>/gpu.{md,json}`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

HERE, ROOT = common.HERE, common.ROOT

BIG = [
    "model.arch=qwen2",
    "model.hidden_size=1024",
    "model.num_layers=12",
    "model.num_heads=16",
    "model.num_kv_heads=4",
    "model.intermediate_size=2816",
    "model.warmstart_lr=3e-4",
    "trainer.lr=1e-5",
    "filter=none",
]

# name -> (overrides, uses --steps (else the recipe's 200))
CASES: dict[str, tuple[list[str], bool]] = {
    "default": ([], False),
    "sync": (["async_mode=sync"], False),
    "fp32": (["async_mode=sync", "precision=fp32"], True),
    "bf16": (["async_mode=sync", "precision=bf16"], True),
    "zero1": (["async_mode=sync", "trainer=deepspeed", "trainer.zero_stage=1"], True),
    "zero2": (["async_mode=sync", "trainer=deepspeed", "trainer.zero_stage=2"], True),
    "zero3": (["async_mode=sync", "trainer=deepspeed", "trainer.zero_stage=3"], True),
    "zero3_pipeline": (["trainer=deepspeed", "trainer.zero_stage=3"], True),
    "big_sync": ([*BIG, "async_mode=sync"], True),
    "big_pipeline": (BIG, True),
}


def run_case(name: str, overrides: list[str], work: Path, cache: Path) -> dict:
    from mlflow.tracking import MlflowClient

    out = work / name
    uri = f"sqlite:///{work / 'mlflow.db'}"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "trainer.device=cuda",
        f"out_dir={out}",
        f"tracking.uri={uri}",
        "tracking.experiment=bench-gpu",
        "progress=log",
        *overrides,
    ]
    env = {**os.environ, "SCALERL_CACHE": str(cache), "MLFLOW_DISABLE_TELEMETRY": "true"}
    t0 = time.time()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    (work / f"{name}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        return {"case": name, "overrides": overrides, "error": (r.stderr or r.stdout)[-1500:]}
    summary = json.loads((out / "summary.json").read_text())
    run = MlflowClient(uri).get_run(summary["run_id"])
    m, p = run.data.metrics, run.data.params
    lag = MlflowClient(uri).get_metric_history(summary["run_id"], "train/policy_lag_max")
    steps = summary["steps"]
    return {
        "case": name,
        "overrides": overrides,
        "process_wall_s": wall,
        "run_wall_s": summary["wall_seconds"],
        "steps": steps,
        "s_per_step": summary["wall_seconds"] / max(1, steps),
        "tokens_per_s": m.get("perf/tokens_per_s"),
        "generator_busy": m.get("perf/generator_busy"),
        "trainer_busy": m.get("perf/trainer_busy"),
        "gpu_mem_peak_gb": m.get("perf/gpu_mem_peak_gb"),
        "pass_rate_start": summary["pass_rate_start"],
        "pass_rate_final": summary["pass_rate_final"],
        "policy_lag_max": max((x.value for x in lag), default=None),
        "device": p.get("device"),
        "body_dtype": p.get("precision/body_dtype"),
        "head_dtype": p.get("precision/head_dtype"),
        "params_non_embedding": p.get("model/params_non_embedding"),
    }


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def report(info: dict, rows: list[dict], warmstart: dict) -> str:
    lines = [
        f"# The GPU path ({info.get('gpu', 'no GPU')}, {info['date']})",
        "",
        f"torch {info['torch']}, Python {info['python']}, {info['cores']} CPU cores, "
        f"{info.get('gpus', 0)} GPU(s) of {info.get('gpu_mem_gb', '-')} GiB. "
        f"Warm-starts (built once, cached): {warmstart}.",
        "",
        "| case | steps | s/step | tokens/s | gen busy | train busy | pass rate start -> end | "
        "peak GPU GiB | max lag | body / head |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | FAILED: {r['error'].strip().splitlines()[-1][:150]} |")
            continue
        lines.append(
            f"| {r['case']} | {r['steps']} | {fmt(r['s_per_step'], '.3f')} | {fmt(r['tokens_per_s'], '.0f')} | "
            f"{fmt(r['generator_busy'])} | {fmt(r['trainer_busy'])} | "
            f"{fmt(r['pass_rate_start'], '.3f')} -> {fmt(r['pass_rate_final'], '.3f')} | "
            f"{fmt(r['gpu_mem_peak_gb'])} | {fmt(r['policy_lag_max'], '.0f')} | "
            f"{r['body_dtype']} / {r['head_dtype']} |"
        )
    lines += ["", "Overrides per case:", ""]
    lines += [f"- `{r['case']}`: `{' '.join(r['overrides']) or '(the recipe)'}`" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="run these cases (default: all)")
    ap.add_argument("--steps", type=int, default=40, help="steps of the shorter cases")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; this benchmark runs the GPU path only", file=sys.stderr)
        return 2
    info = common.environment()
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    cache = Path(os.environ.get("SCALERL_CACHE") or work / "cache")  # a warm-start built once serves again
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.only or list(CASES):
        overrides, short = CASES[name]
        overrides = [*overrides, *([f"trainer.total_steps={a.steps}"] if short else [])]
        rows.append(run_case(name, overrides, work, cache))
        r = rows[-1]
        print(name, "FAILED" if "error" in r else f"{r['s_per_step']:.3f} s/step", flush=True)
        warmstart = {
            m.parent.name: round(json.loads(m.read_text()).get("warmstart_seconds") or 0, 1)
            for m in sorted(cache.glob("warmstart-*/meta.json"))
            if "made" not in json.loads(m.read_text())  # trained here, not the shipped base model
        }
        md = report(info, rows, warmstart)  # written after every case: a cut-off run keeps its rows
        (a.out / "gpu.md").write_text(md)
        (a.out / "gpu.json").write_text(
            json.dumps({"machine": info, "warmstart_s": warmstart, "rows": rows}, indent=1)
        )
    print(md)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
