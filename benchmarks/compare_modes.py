"""Two or more finished runs of the same command in different async modes (``sync``,
``pipeline_rl``, ...), side by side from what they logged to MLflow: wall time a step, tokens/s,
the policy lag against its bound k, the stale-KV gap, and the held-out pass rate at equal compute.

    python benchmarks/compare_modes.py sync=sqlite:////tmp/a/mlflow.db pipeline_rl=sqlite:////tmp/b/mlflow.db \
        --out benchmarks/results/<date>_<commit>_modes.md

Each argument is ``label=tracking-uri`` (the newest run in that store) or ``label=uri#run_id``.
"Equal compute" reads each evaluation of a run on the runs' compute axis (``scaling.compute_axis``:
counted FLOPs by default, which machine load does not move) and the other runs' pass rate
linearly interpolated there; a point outside another run's range is left blank.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import common
from mlflow.tracking import MlflowClient

from scalerl.analysis.mlflow_io import load_run, metric_history


def load(spec: str) -> dict:
    label, _, where = spec.partition("=")
    if not where:
        sys.exit(f"compare_modes.py: {spec!r} is not label=tracking-uri[#run_id]")
    uri, _, run_id = where.partition("#")
    client = MlflowClient(uri)
    if not run_id:
        runs = client.search_runs(
            [e.experiment_id for e in client.search_experiments()],
            order_by=["start_time DESC"],
            max_results=1,
        )
        if not runs:
            sys.exit(f"compare_modes.py: no run in {uri}")
        run_id = runs[0].info.run_id
    run = client.get_run(run_id)
    curve = load_run(client, run, reward_key="val/pass_rate")  # the held-out curve on the run's compute axis

    def values(key: str) -> list[float]:  # a value a step, in step order (a resumed run's repeats once)
        return [v for _, v in sorted(metric_history(client, run_id, key).items())]

    steps = {
        m.step: m.timestamp / 1000 for m in client.get_metric_history(run_id, "progress/step")
    }  # when each step was logged
    return dict(
        label=label,
        run_id=run_id,
        params=run.data.params,
        start=run.info.start_time / 1000,
        end=run.info.end_time / 1000 if run.info.end_time else max(steps.values(), default=0.0),
        steps=steps,
        tokens_per_s=values("perf/tokens_per_s"),
        lag_max=values("train/policy_lag_max"),
        lag_mean=values("train/policy_lag_mean"),
        gap=values("gen/stale_kv_logprob_gap"),
        update_s=values("perf/weight_update_s"),
        gen_busy=values("perf/generator_busy"),
        trainer_busy=values("perf/trainer_busy"),
        truncation=values("train/truncation_rate"),
        axis=curve.compute_axis,
        curve=list(zip(curve.steps.tolist(), curve.compute.tolist(), curve.reward.tolist())),
    )


def interpolate(points: list[tuple[float, float]], x: float) -> float | None:
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def fmt(values: list[float], digits: int = 3) -> str:
    return f"{statistics.mean(values):.{digits}f}" if values else "not logged"


def report(runs: list[dict]) -> str:
    lines = [
        f"# Async modes compared, from their MLflow runs ({common.utc_now()}, commit {common.commit()}; "
        f"rendered on {common.machine()})",
        "",
        "| | " + " | ".join(r["label"] for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]

    def row(name: str, cells: list[str]) -> None:
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("run", [f"`{r['run_id'][:8]}`" for r in runs])
    row(
        "async mode (k)",
        [
            f"{r['params'].get('async_mode/name', r['params'].get('async_mode.name', '?'))} ({r['params'].get('async_mode/max_lag', r['params'].get('async_mode.max_lag', '-'))})"
            for r in runs
        ],
    )
    row("steps", [str(max(r["steps"], default=0)) for r in runs])
    row("wall minutes, whole run", [f"{(r['end'] - r['start']) / 60:.1f}" for r in runs])
    per_step = []
    for r in runs:
        ts = [r["steps"][s] for s in sorted(r["steps"]) if s >= 1]
        per_step.append(f"{(ts[-1] - ts[0]) / (len(ts) - 1):.0f}" if len(ts) > 1 else "-")
    row("seconds a step (steps 1 to last, evaluations included)", per_step)
    row("tokens/s (mean over steps)", [fmt(r["tokens_per_s"][1:], 1) for r in runs])
    row(
        "generator busy / trainer busy (mean)",
        [f"{fmt(r['gen_busy'][1:], 2)} / {fmt(r['trainer_busy'][1:], 2)}" for r in runs],
    )
    row(
        "policy lag: max over the run / mean",
        [f"{max(r['lag_max'], default=0):.0f} / {fmt(r['lag_mean'], 2)}" for r in runs],
    )
    row("stale-KV log-prob gap (mean; steps logged)", [f"{fmt(r['gap'], 4)} ({len(r['gap'])})" for r in runs])
    row("weight update seconds (mean)", [fmt(r["update_s"], 1) for r in runs])
    row("truncation a step (mean)", [fmt(r["truncation"], 3) for r in runs])
    axis = runs[0]["axis"]
    if any(r["axis"] != axis for r in runs):
        sys.exit(
            "compare_modes.py: the runs use different compute axes: " + ", ".join(r["axis"] for r in runs)
        )
    lines += [
        "",
        f"Held-out pass rate at each evaluation, and the other runs' at the same compute ({axis}):",
        "",
    ]
    lines += [
        f"| run | step | {axis} | pass rate | "
        + " | ".join(f"{r['label']} at equal compute" for r in runs)
        + " |"
    ]
    lines += ["|---|---|---|---|" + "---|" * len(runs)]
    curves = {r["label"]: sorted((c, v) for _, c, v in r["curve"]) for r in runs}
    for r in runs:
        for s, x, v in r["curve"]:
            others = []
            for o in runs:
                y = interpolate(curves[o["label"]], x)
                others.append("" if y is None else f"{y:.3f}")
            lines.append(f"| {r['label']} | {s} | {x:.4g} | {v:.3f} | " + " | ".join(others) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="label=tracking-uri[#run_id]")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    text = report([load(s) for s in args.runs])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
