"""The embedded default's learning target, measured as a user runs it.

Runs ``python train.py`` (the default recipe, or the overrides given) in a fresh folder with an
empty warm-start cache (the default's base model ships in the package and is copied; other model or
task settings train their warm-start, which is then included), and reports:

* wall time of the whole command (target: <= 5 minutes on the 2-core machine),
* held-out pass rate (mean over K samples at the training temperature) at step 0 and at the end
  (target: +0.3 absolute), and on the prompts no sample solved at step 0,
* the curve (pass rate per evaluation) and the fitted sigmoid (A, B, C_mid).

    python benchmarks/bench_learning.py                      # the default
    python benchmarks/bench_learning.py --seeds 0 1 2        # several seeds
    python benchmarks/bench_learning.py -- async_mode=sync   # any overrides after --
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ROOT = common.ROOT


def one_run(seed: int, overrides: list[str], keep_cache: str | None) -> dict:
    from mlflow.tracking import MlflowClient

    work = Path(tempfile.mkdtemp(prefix="bench-learning-"))
    cache = keep_cache or str(work / "cache")
    env = {**os.environ, "SCALERL_CACHE": cache, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        f"seed={seed}",
        f"out_dir={work / 'run'}",
        "progress=log",
        *overrides,
    ]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"train.py failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    summary = json.loads((work / "run" / "summary.json").read_text())
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")

    def hist(key):
        return sorted((m.step, m.value) for m in client.get_metric_history(summary["run_id"], key))

    curve = hist("val/pass_rate")
    unsolved = hist("val/pass_rate_unsolved_at_start")
    d4 = hist("val/pass_rate_d4")  # the prompts harder than most of the warm-start's (addition task)
    metrics = client.get_run(summary["run_id"]).data.metrics
    ws = json.loads(next(Path(cache).glob("warmstart-*/meta.json")).read_text()) if not keep_cache else {}
    return {
        "seed": seed,
        "wall_seconds": wall,
        # the default's base model ships with the package ("made" by scalerl.ship): not trained here
        "warmstart_seconds": None if "made" in ws else ws.get("warmstart_seconds"),
        "warmstart_shipped": "made" in ws,
        "steps": summary["steps"],
        "pass_rate_start": curve[0][1],
        "pass_rate_final": curve[-1][1],
        "gain": curve[-1][1] - curve[0][1],
        "gain_on_unsolved_at_start": unsolved[-1][1] - unsolved[0][1] if unsolved else None,
        "pass_rate_d4": (d4[0][1], d4[-1][1]) if d4 else None,
        "curve": curve,
        "fit": {k: metrics.get(f"fit/{k}") for k in ("A", "B", "C_mid", "R0", "A_lo", "A_hi")},
        "train_truncation_rate_final": metrics.get("train/truncation_rate"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument(
        "--keep-cache", help="reuse this warm-start cache (excludes the warm-start from the time)"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "learning.json"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    runs = [one_run(s, args.overrides, args.keep_cache) for s in args.seeds]
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": common.machine(),
        "commit": common.commit(),
        "overrides": args.overrides,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"# Learning benchmark ({result['date']}, {result['machine']})\n")
    print(
        "| seed | wall (s) | warm-start (s) | steps | pass@start | pass@end | gain | gain on unsolved-at-start "
        "| 4-digit prompts | fit A | fit B |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        ws = "shipped" if r.get("warmstart_shipped") else "cached"
        ws = f"{r['warmstart_seconds']:.0f}" if r["warmstart_seconds"] else ws
        uns = f"{r['gain_on_unsolved_at_start']:+.3f}" if r["gain_on_unsolved_at_start"] is not None else "-"
        fa, fb = r["fit"]["A"], r["fit"]["B"]
        d4 = f"{r['pass_rate_d4'][0]:.3f} -> {r['pass_rate_d4'][1]:.3f}" if r["pass_rate_d4"] else "-"
        print(
            f"| {r['seed']} | {r['wall_seconds']:.0f} | {ws} | {r['steps']} | {r['pass_rate_start']:.3f} | "
            f"{r['pass_rate_final']:.3f} | {r['gain']:+.3f} | {uns} | {d4} | "
            f"{fa if fa is None else round(fa, 3)} | {fb if fb is None else round(fb, 2)} |"
        )
    for r in runs:
        print(
            f"\nseed {r['seed']} curve (step, pass rate): "
            + ", ".join(f"({s}, {v:.2f})" for s, v in r["curve"])
        )


if __name__ == "__main__":
    main()
