"""How well a local sweep's "about T left" line (scalerl.sweep.launch.Pace) foretold its end.

Replays a finished sweep folder: each run's start and end from its ``status.json`` (the end is the
time its outcome was recorded, the start that less its seconds), and at every run's end the line the
launcher printed then (the runs going, with their time so far, and those not yet started, in the
order they started), against the time the last run actually ended. The launcher's own code computes
each figure; nothing is re-implemented here.

    python benchmarks/bench_sweep_pace.py /path/to/sweep_folder [--at-once 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from scalerl.sweep.launch import Outcome, Pace


def replay(sweep_dir: Path, at_once: int) -> list[dict]:
    """One row per run that finished, in the order they ended: the line's estimate and the truth."""
    status = json.loads((sweep_dir / "status.json").read_text())
    variant = {r["name"]: r["variant"] for r in json.loads((sweep_dir / "sweep.json").read_text())["runs"]}
    span = {}
    for name, e in status.items():
        if e.get("status") == "finished" and e.get("seconds") is not None:
            end = datetime.datetime.fromisoformat(e["updated"]).timestamp()
            span[name] = (end - float(e["seconds"]), end)
    if not span:
        raise SystemExit(f"{sweep_dir}: no finished run in status.json")
    last = max(end for _, end in span.values())
    started = sorted(span, key=lambda n: span[n][0])
    pace = Pace(variant, at_once, len(span))
    rows = []
    for name in sorted(span, key=lambda n: span[n][1]):
        t = span[name][1]
        pace.record(
            Outcome(name=name, status="finished", job_id="", log="", stdout="", seconds=t - span[name][0])
        )
        going = {n: t - s for n, (s, e) in span.items() if s <= t < e}
        waiting = [n for n in started if span[n][0] > t]
        left = pace.left_s(going, waiting) if (going or waiting) else 0.0
        rows.append({"run": name, "done": pace.ended, "said_s": left, "true_s": last - t})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--at-once", type=int, default=2, help="the runs the launcher ran at once")
    a = ap.parse_args()
    rows = replay(a.sweep_dir, a.at_once)
    print("| done | run | said left (min) | true left (min) | error (min) | error / true |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        err = r["said_s"] - r["true_s"]
        rel = f"{err / r['true_s']:+.0%}" if r["true_s"] > 0 else ""
        print(
            f"| {r['done']} | {r['run']} | {r['said_s'] / 60:.1f} | {r['true_s'] / 60:.1f} | {err / 60:+.1f} | {rel} |"
        )
    errs = [abs(r["said_s"] - r["true_s"]) / 60 for r in rows[:-1]]
    print(
        f"\nmean |error| {sum(errs) / len(errs):.1f} min over {len(errs)} lines; largest {max(errs):.1f} min"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
