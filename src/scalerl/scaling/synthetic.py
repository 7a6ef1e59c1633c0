"""Synthetic evaluation curves with known parameters (tests, benchmarks, demos)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalerl.scaling.sigmoid import _predict


@dataclass(frozen=True)
class TrueCurve:
    R0: float
    A: float
    B: float
    C_mid: float

    def __call__(self, compute) -> np.ndarray:
        return _predict(np.asarray(compute, dtype=float), self.R0, self.A, self.B, self.C_mid)


def random_curve(rng: np.random.Generator, *, c_mid: float = 1000.0) -> TrueCurve:
    """Parameters spanning the paper's range (A 0.45-0.8, B 1-2.5) and a bit beyond."""
    r0 = float(rng.uniform(0.05, 0.3))
    a = float(rng.uniform(max(0.45, r0 + 0.2), 0.85))
    b = float(rng.uniform(1.0, 2.5))
    return TrueCurve(r0, a, b, c_mid * float(np.exp(rng.uniform(-1.0, 1.0))))


def sample_run(
    curve: TrueCurve,
    rng: np.random.Generator,
    *,
    reach: float = 6.0,
    n_points: int = 30,
    trials: int = 512,
    step0: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Evaluations of a run like a real one: ``n_points`` evenly spaced steps up to
    ``reach * C_mid`` compute (plus the step-0 evaluation at C = 0 when ``step0``), each a binomial
    pass rate over ``trials`` samples (e.g. 128 prompts x 4 samples = 512)."""
    c = np.linspace(0.0, reach * curve.C_mid, n_points + 1)
    if not step0:
        c = c[1:]
    p = np.clip(curve(c), 0.0, 1.0)
    y = rng.binomial(trials, p) / trials
    return c, y.astype(float)
