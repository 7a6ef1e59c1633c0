"""Where the half-budget fit beats persistence, over replicate studies' ``report.json``.

    python benchmarks/bench_prediction_skill.py benchmarks/results/*_ceiling-study-seeds*_report.json
    python benchmarks/bench_prediction_skill.py STUDY... --json out.json

For the predictions the horizon rule supports (the half window past 4.5x C_mid), pooled over the
studies: the fit's and persistence's (the first half's last value) errors against the observed end,
the win count and the skill score ``1 - MSE / MSE(persistence)``
(:func:`scalerl.analysis.verdicts.mse_skill`), split two ways:

* **by what the fit foresaw** (known at the half): its predicted change over persistence larger than
  its own band's half-width ("foresees change") or not ("foresees no change beyond its band");
* **by what happened** (known only at the end, a diagnosis, not a rule): the variants whose mean
  second-half change (observed end - persistence, over the studies) exceeds the noise of that
  difference from the evaluations alone (binomial, ``--noise``) ("moved") and the others ("flat").

It also prints that noise per variant: one evaluation a seed for persistence against the end's
evaluations, 3 seeds, at the variant's mean observed end.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scalerl.analysis.replicates import load_study  # noqa: E402
from scalerl.analysis.verdicts import mse_skill  # noqa: E402


def rows(paths: list[str]) -> list[dict]:
    """One row per supported prediction with a persistence forecast, every study."""
    out = []
    for p in paths:
        s = load_study(p)
        for v in s.doc["variants"]:
            q = v.get("prediction") or {}
            keys = ("predicted", "observed", "persistence", "lo", "hi")
            if q.get("supported") is not True or any(q.get(k) is None for k in keys):
                continue
            out.append(
                {
                    "study": s.label,
                    "variant": v["variant"],
                    "fit_err": q["predicted"] - q["observed"],
                    "pers_err": q["persistence"] - q["observed"],
                    "foreseen": q["predicted"] - q["persistence"],
                    "change": q["observed"] - q["persistence"],
                    "half_width": (q["hi"] - q["lo"]) / 2,
                    "observed": q["observed"],
                }
            )
    return out


def score(rs: list[dict]) -> dict:
    f = np.array([r["fit_err"] for r in rs])
    p = np.array([r["pers_err"] for r in rs])
    if not rs:
        return {"n": 0}
    return {
        "n": len(rs),
        "fit_beats": int(np.sum(np.abs(f) < np.abs(p))),
        "mse_skill": mse_skill(f, p),
        "fit_mean": float(f.mean()),
        "fit_mae": float(np.abs(f).mean()),
        "pers_mae": float(np.abs(p).mean()),
        "foreseen_mean": float(np.mean([r["foreseen"] for r in rs])),
        "change_mean": float(np.mean([r["change"] for r in rs])),
        "variants": sorted({r["variant"] for r in rs}),
    }


def noise_sd(p: float, trials: int, end_evals: int, seeds: int) -> float:
    """The sd of (persistence - observed end) from binomial evaluation noise alone."""
    one = p * (1 - p) / trials / seeds
    end = p * (1 - p) / (trials * end_evals) / seeds
    return math.sqrt(one + end)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+")
    ap.add_argument("--trials", type=int, default=768, help="samples of one evaluation (192 x 4)")
    ap.add_argument("--end-evals", type=int, default=2, help="evaluations in the last tenth")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rs = rows(a.studies)
    by_variant: dict[str, list[dict]] = {}
    for r in rs:
        by_variant.setdefault(r["variant"], []).append(r)
    noise = {
        v: noise_sd(
            min(max(float(np.mean([x["observed"] for x in xs])), 0.01), 0.99), a.trials, a.end_evals, a.seeds
        )
        for v, xs in by_variant.items()
    }
    moved = {v for v, xs in by_variant.items() if np.mean([x["change"] for x in xs]) > noise[v]}
    out = {
        "studies": a.studies,
        "all": score(rs),
        "foresees_change": score([r for r in rs if abs(r["foreseen"]) > r["half_width"]]),
        "foresees_no_change": score([r for r in rs if abs(r["foreseen"]) <= r["half_width"]]),
        "moved": score([r for r in rs if r["variant"] in moved]),
        "flat": score([r for r in rs if r["variant"] not in moved]),
        "noise_sd": noise,
    }
    for k in ("all", "foresees_change", "foresees_no_change", "moved", "flat"):
        s = out[k]
        if not s["n"]:
            print(f"{k:20s} none")
            continue
        print(
            f"{k:20s} n {s['n']:3d}  fit beats {s['fit_beats']:3d}  skill {s['mse_skill']:+.2f}  fit err mean "
            f"{s['fit_mean']:+.4f} abs {s['fit_mae']:.4f}  persistence abs {s['pers_mae']:.4f}  foreseen "
            f"{s['foreseen_mean']:+.4f}  change {s['change_mean']:+.4f}  {','.join(s['variants'])}"
        )
    for v, sd in noise.items():
        xs = by_variant[v]
        print(
            f"{v:20s} change {np.mean([x['change'] for x in xs]):+.4f} over {len(xs)} studies; noise of "
            f"(persistence - end) from the evaluations alone: sd {sd:.4f} (mean abs {sd * math.sqrt(2 / math.pi):.4f})"
            f"{'  moved' if v in moved else ''}"
        )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
