"""Synthetic evaluation curves with known parameters (tests, benchmarks, demos)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scalerl.scaling._solvers import expit
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


@dataclass(frozen=True)
class RisingCurve:
    """A curve whose local exponent rises: the slope of ``log((A - R) / (R - R0))`` against
    ``log C`` is ``-b(C)`` with ``b`` going from ``B`` (early) to ``B_late`` around ``rise_at x C_mid``
    over ``width`` (in log C). ``R(C_mid) = (R0 + A) / 2`` as for the sigmoid, which it is when
    ``B_late == B``. The shape the real runs show (issue 53: local exponent about 1.1-1.3 up to
    about 2.5x C_mid and about 2.1 after): a sigmoid fitted before the rise under-estimates the tail."""

    R0: float
    A: float
    B: float
    C_mid: float
    B_late: float
    rise_at: float = 2.5
    width: float = 0.25

    def exponent(self, compute) -> np.ndarray:
        """The local exponent ``b(C)``."""
        x = np.log(np.asarray(compute, dtype=float) / self.C_mid)
        return self.B + (self.B_late - self.B) * expit((x - math.log(self.rise_at)) / self.width)

    def __call__(self, compute) -> np.ndarray:
        c = np.asarray(compute, dtype=float)
        with np.errstate(divide="ignore"):
            x = np.log(np.where(c > 0, c, 0.0) / self.C_mid)
        xt, w = math.log(self.rise_at), self.width
        g = self.B * x + (self.B_late - self.B) * w * (
            np.logaddexp(0.0, (x - xt) / w) - np.logaddexp(0.0, -xt / w)
        )
        return self.R0 + (self.A - self.R0) * expit(g)
