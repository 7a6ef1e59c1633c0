"""Is a recipe stable enough to extrapolate? Runs it on several seeds to a multiple of its budget.

For each setting (a list of ``train.py`` overrides) and seed it runs ``python train.py`` to
``--horizon`` times the budget (``trainer.total_steps`` of the composed config) and reads the
held-out curve back from the run's MLflow store. It reports, per seed, the largest fall of the
held-out pass rate below its own running maximum (raw, and over a moving mean of ``--smooth``
evaluations, which takes out one evaluation's binomial noise), and for the pooled seeds the fit at
the budget (points up to it, the configured early cut): A, B, C_mid and C_final / C_mid, where
C_final is the compute at the budget's end. Issue #27's bar: no seed falls more than 0.05 below its
running maximum out to twice the budget, and C_final / C_mid >= 4 at the budget.

    python benchmarks/bench_stability.py --setting default= --setting lr5e-5=trainer.lr=5e-5 \\
        --seeds 0 1 2 --horizon 2 --out /tmp/stability --json benchmarks/results/stability.json

Settings run one at a time, seeds in turn (``--parallel 2`` runs two processes at once, each with
one thread). Compute is the run's ``scaling.compute_axis`` (counted FLOPs by default), so machine
load moves wall time, not the curves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common

ROOT = common.ROOT


def parse_setting(text: str) -> tuple[str, list[str]]:
    name, _, rest = text.partition("=")
    if not name:
        raise SystemExit(f"--setting {text!r}: expected NAME=override,override,... (NAME= for the default)")
    # commas inside brackets belong to a list value (trainer.betas=[0.9,0.95])
    parts, depth, cur = [], 0, ""
    for ch in rest:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return name, [o for o in [*parts, cur] if o]


def budget_of(overrides: list[str]) -> int:
    common.use_checkout()
    _, config = common.options(overrides)
    return int(config.trainer.total_steps)


def run_one(name, overrides, seed, steps, out: Path, uri: str, threads: int) -> dict:
    run_dir = out / f"{name}_s{seed}"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        f"seed={seed}",
        f"trainer.total_steps={steps}",
        f"out_dir={run_dir}",
        f"tracking.uri={uri}",
        "tracking.experiment=stability",
        f"tracking.run_name={name}_s{seed}",
        f"+tracking.tags.setting={name}",
        "progress=log",
    ]
    if threads:
        cmd.append(f"trainer.threads={threads}")
    t0 = time.time()
    with open(out / f"{name}_s{seed}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return {"setting": name, "seed": seed, "rc": rc, "wall_s": round(time.time() - t0, 1)}


def curve(uri: str, run_name: str, axis: str) -> tuple[list[int], list[float], list[float]]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("stability")
    runs = c.search_runs(  # the newest run of that name (an earlier, stopped attempt may be there)
        [exp.experiment_id],
        f"attributes.run_name = '{run_name}'",
        max_results=1,
        order_by=["start_time DESC"],
    )
    if not runs:
        return [], [], []
    rid = runs[0].info.run_id
    pr = {m.step: m.value for m in c.get_metric_history(rid, "val/pass_rate")}
    comp = {m.step: m.value for m in c.get_metric_history(rid, f"compute/{axis}")}
    steps = sorted(s for s in pr if s in comp)
    return steps, [comp[s] for s in steps], [pr[s] for s in steps]


def max_drop(values: list[float], smooth: int = 1) -> float:
    out, peak = 0.0, float("-inf")
    for i in range(len(values)):
        window = values[max(0, i - smooth + 1) : i + 1]
        v = sum(window) / len(window)
        peak = max(peak, v)
        out = max(out, peak - v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", action="append", required=True, help="NAME=override,override,...")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--horizon", type=float, default=2.0, help="run to this multiple of the budget")
    ap.add_argument("--smooth", type=int, default=3, help="moving mean over this many evaluations")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--out", default="/tmp/scalerl-stability")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report-only", action="store_true", help="read the runs already in --out, run nothing")
    args = ap.parse_args(argv)

    from scalerl.config import compose  # noqa: F401  (fails early, with the path set below)
    from scalerl.scaling import fit_sigmoid_runs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    settings = [parse_setting(s) for s in args.setting]
    jobs = []
    for name, ov in settings:
        budget = budget_of(ov)
        jobs += [(name, ov, seed, int(round(budget * args.horizon))) for seed in args.seeds]
    t0 = time.time()
    threads = 1 if args.parallel > 1 else 0
    runs = []
    if not args.report_only:
        # create the store and the experiment once: runs that each create a new sqlite store at the
        # same moment race in its schema migration
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        if client.get_experiment_by_name("stability") is None:
            client.create_experiment("stability")
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            runs = list(pool.map(lambda j: run_one(*j, out, uri, threads), jobs))
    wall = time.time() - t0

    report = {
        "date": common.utc_now(),
        "commit": common.commit(),
        "machine": common.machine(),
        "load_avg": common.loadavg(),
        "wall_s": round(wall, 1),
        "runs": runs,
        "settings": {},
    }
    for name, ov in settings:
        cfg_axis = _axis(ov)
        budget = budget_of(ov)
        per_seed, pooled, cuts = [], [], []
        for seed in args.seeds:
            steps, comp, pr = curve(uri, f"{name}_s{seed}", cfg_axis)
            if not steps:
                per_seed.append({"seed": seed, "missing": True})
                continue
            k = [i for i, s in enumerate(steps) if s <= budget]
            per_seed.append(
                {
                    "seed": seed,
                    "steps": steps,
                    "pass_rate": [round(v, 4) for v in pr],
                    "max_drop": round(max_drop(pr), 4),
                    f"max_drop_smooth{args.smooth}": round(max_drop(pr, args.smooth), 4),
                    "at_budget": round(pr[k[-1]], 4) if k else None,
                    "last": round(pr[-1], 4),
                }
            )
            pooled.append(([comp[i] for i in k], [pr[i] for i in k]))
            cuts.append(_early_cut(ov, [steps[i] for i in k], [comp[i] for i in k]))
        fit = None
        if pooled:
            f = fit_sigmoid_runs(pooled, min_compute=cuts, bootstrap=200, level=0.9)
            c_final = max(max(c) for c, _ in pooled)
            fit = {
                "A": f.A,
                "B": f.B,
                "C_mid": f.C_mid,
                "C_final_over_C_mid": round(c_final / f.C_mid, 2) if f.C_mid else None,
                "A_ci": f.ci.get("A") if f.ci else None,
            }
        report["settings"][name] = {"overrides": ov, "budget": budget, "seeds": per_seed, "pooled_fit": fit}
        drops = [s.get(f"max_drop_smooth{args.smooth}") for s in per_seed if not s.get("missing")]
        print(
            f"{name:>14}: max fall below running max (smoothed {args.smooth}) per seed {drops}; "
            f"pooled fit at budget {budget}: {fit}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=float) + "\n")
    return 0


def _axis(overrides: list[str]) -> str:
    return str(common.options(overrides)[1].scaling.compute_axis)


def _early_cut(overrides, steps, comp) -> float:
    from scalerl.scaling.sigmoid import early_cutoff

    s = common.options(overrides)[1].scaling
    return early_cutoff(steps, comp, min_step=int(s.min_step), min_compute=float(s.min_compute))


if __name__ == "__main__":
    common.use_checkout()
    raise SystemExit(main())
