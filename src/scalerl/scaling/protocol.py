"""The fit protocol: one frozen object with every setting a scaling fit is made with.

Built once from a run's or sweep's ``scaling`` config (:meth:`FitProtocol.from_config`) or from the
analysis CLI's options, and handed as is to the live refits (:mod:`scalerl.scaling.live`), the
report's per-run and pooled fits and the half-budget check (:mod:`scalerl.analysis`), so every fit
of a run uses the same compute axis, early cut, method, grid and bootstrap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scalerl.scaling.pass_at_k import DEFAULT_METRIC, METRIC_ALLOWED, metric_k
from scalerl.scaling.sigmoid import (
    DEFAULT_METHOD,
    METHODS,
    SigmoidFit,
    early_cutoff,
    fit_sigmoid,
    fit_sigmoid_runs,
)

COMPUTE_AXES = ("device_hours", "flops")
"""The fit's x-axis: ``compute/device_hours`` or ``compute/flops`` of the run."""
CONFIG_KEYS = (
    "compute_axis",
    "min_step",
    "min_compute",
    "method",
    "grid_A",
    "grid_C_mid",
    "bootstrap",
    "extrapolate",
    "metric",
)
"""The keys of the ``scaling`` config that are fit settings (``refit_every`` is the loop's cadence)."""
GRID_A_ALLOWED = "[low, high, step] with 0 <= low <= high <= 1, step > 0"
GRID_C_MID_ALLOWED = "[low, high, n] with 0 < low <= high, n an integer >= 1"


class FitProtocolError(ValueError):
    """A fit setting out of its range; the message is one line naming the key, the value and what is
    allowed."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid fit setting {key}={value!r}: must be {allowed}")


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _grid(v: object) -> list | None:
    """``v`` as a list of three numbers (None when it is not one)."""
    try:
        out = list(v)  # type: ignore[call-overload]
    except TypeError:
        return None
    return out if len(out) == 3 and all(_num(x) for x in out) else None


def min_bootstrap(level: float) -> int:
    """The fewest bootstrap resamples whose ``level`` percentile interval has a resample in each tail
    (fewer, and the interval's ends are the extreme resamples, or one resample)."""
    return math.ceil(round(2 / (1 - level), 9))


def bootstrap_problem(key: str, bootstrap: object, level: float) -> tuple[str, object, str] | None:
    """``(key, value, allowed)`` when ``bootstrap`` is neither 0 (no intervals) nor enough resamples
    for a ``level`` interval (:func:`min_bootstrap`); None when it is. The entry points (the
    ``scaling`` config, the analysis CLI) check it; :class:`FitProtocol` accepts any count >= 0."""
    least = min_bootstrap(level)
    if _num(bootstrap) and (bootstrap == 0 or bootstrap >= least):
        return None
    return (
        key,
        bootstrap,
        f"0 (no intervals) or at least {least}, so that each {(1 - level) / 2:.1%} tail of a "
        f"{level:.0%} interval holds a resample",
    )


def fit_problems(values) -> dict[str, tuple[str, object, str]]:
    """key -> ``(key, value, allowed)`` for each fit setting of ``values`` (an object with the
    :data:`CONFIG_KEYS` as attributes: a ``ScalingConfig`` or a :class:`FitProtocol`) out of its range.
    The one statement of the ranges: the config's check and :class:`FitProtocol` both use it."""
    out: dict[str, tuple[str, object, str]] = {}

    def bad(key, ok, allowed, shown=None):
        if not ok:
            v = getattr(values, key)
            out[key] = (key, v if shown is None else shown, allowed)

    axis, method = values.compute_axis, values.method
    bad("compute_axis", axis in COMPUTE_AXES, "one of " + ", ".join(COMPUTE_AXES))
    bad("method", method in METHODS, "one of " + ", ".join(METHODS))
    bad("min_step", _num(values.min_step) and values.min_step >= 0, "an integer >= 0")
    bad("min_compute", _num(values.min_compute) and values.min_compute >= 0, ">= 0")
    if values.grid_A is not None:
        g = _grid(values.grid_A)
        bad(
            "grid_A",
            g is not None and 0 <= g[0] <= g[1] <= 1 and g[2] > 0,
            GRID_A_ALLOWED,
            list(values.grid_A),
        )
    if values.grid_C_mid is not None:
        g = _grid(values.grid_C_mid)
        ok = g is not None and 0 < g[0] <= g[1] and g[2] >= 1 and float(g[2]).is_integer()
        bad("grid_C_mid", ok, GRID_C_MID_ALLOWED, list(values.grid_C_mid))
    bad("bootstrap", _num(values.bootstrap) and values.bootstrap >= 0, ">= 0")
    bad("extrapolate", _num(values.extrapolate) and values.extrapolate >= 1, ">= 1")
    bad("metric", metric_k(values.metric) is not None, METRIC_ALLOWED)
    return out


@dataclass(frozen=True)
class FitProtocol:
    """How every scaling fit of a run or a sweep is made. The defaults are the ``scaling`` config's.

    - ``compute_axis``: the x-axis (``flops`` or ``device_hours``);
    - ``min_step``, ``min_compute``: the early cut, the same absolute cut for every run (points
      evaluated before that optimiser step or below that compute are left out; :meth:`cut`);
    - ``method``: ``direct`` or ``grid``, ``grid_A`` = (low, high, step), ``grid_C_mid`` =
      (low, high, n) the grid method's ranges (None: from the data);
    - ``bootstrap``: resamples for the intervals, at ``level``, drawn with ``seed``;
    - ``extrapolate``: plots extend the curve to this multiple of the budget;
    - ``metric``: the fitted metric, ``val/<metric>`` of every evaluation (:attr:`reward_key`):
      ``pass_rate`` (pass@1) or ``pass_at_<k>`` (:mod:`scalerl.scaling.pass_at_k`); R0, the
      curve's start, is that metric's at step 0.
    """

    compute_axis: str = "flops"
    min_step: int = 10
    min_compute: float = 0.0
    method: str = DEFAULT_METHOD
    grid_A: tuple[float, float, float] | None = None
    grid_C_mid: tuple[float, float, float] | None = None
    bootstrap: int = 200
    extrapolate: float = 2.0
    metric: str = DEFAULT_METRIC
    level: float = 0.9
    seed: int = 0

    def __post_init__(self):
        for key, value, allowed in fit_problems(self).values():
            raise FitProtocolError(f"scaling.{key}", value, allowed)
        if not (_num(self.level) and 0 < self.level < 1):
            raise FitProtocolError("level", self.level, "a number in (0, 1)")
        if not (_num(self.seed) and self.seed >= 0 and float(self.seed).is_integer()):
            raise FitProtocolError("seed", self.seed, "an integer >= 0")
        set_ = object.__setattr__  # frozen: normalise the types once, here
        set_(self, "min_step", int(self.min_step))
        set_(self, "min_compute", float(self.min_compute))
        set_(self, "bootstrap", int(self.bootstrap))
        set_(self, "extrapolate", float(self.extrapolate))
        set_(self, "level", float(self.level))
        set_(self, "seed", int(self.seed))
        for key in ("grid_A", "grid_C_mid"):
            v = getattr(self, key)
            set_(self, key, None if v is None else tuple(float(x) for x in v))

    @classmethod
    def from_config(cls, scaling, **settings) -> FitProtocol:
        """The protocol of a ``scaling`` config (a DictConfig, a ``ScalingConfig`` or a plain dict, as
        a sweep's state stores it); keys it lacks take the defaults, keys that are no fit setting
        (``refit_every``) are ignored. ``settings``: ``level``, ``seed`` or any field, set directly."""
        if isinstance(scaling, Mapping) or hasattr(scaling, "keys"):
            get = scaling.get
        else:
            get = lambda k, d=None: getattr(scaling, k, d)  # noqa: E731
        values = {k: get(k, None) for k in CONFIG_KEYS}
        return cls(**{k: v for k, v in values.items() if v is not None or k.startswith("grid_")}, **settings)

    def to_config(self) -> dict:
        """The ``scaling`` config keys of this protocol (grids as lists): ``from_config`` of it gives
        the same protocol back."""
        out = {k: getattr(self, k) for k in CONFIG_KEYS}
        for key in ("grid_A", "grid_C_mid"):
            out[key] = None if out[key] is None else list(out[key])
        return out

    @property
    def reward_key(self) -> str:
        """The MLflow metric every fit is made of: ``val/pass_rate`` or ``val/pass_at_<k>``."""
        return f"val/{self.metric}"

    @property
    def grid(self) -> dict:
        """``grid_A`` / ``grid_C_mid`` as the fit functions' keyword arguments."""
        return {"grid_A": self.grid_A, "grid_C_mid": self.grid_C_mid}

    def cut(self, steps, compute) -> float:
        """The early cut of one run (its evaluations' steps and compute), in compute units
        (:func:`~scalerl.scaling.sigmoid.early_cutoff`)."""
        return early_cutoff(steps, compute, min_step=self.min_step, min_compute=self.min_compute)

    def cut_of(self, run) -> float:
        """:meth:`cut` of a run with ``steps`` and ``compute`` arrays (an analysis ``RunData``)."""
        return self.cut(run.steps, run.compute)

    def fit(self, compute, reward, *, min_compute: float, bootstrap: int | None = None) -> SigmoidFit:
        """One run's fit with this protocol (NaN points left out) above ``min_compute`` (the run's
        :meth:`cut`); ``bootstrap``: another number of resamples (0 for the half-budget check)."""
        return fit_sigmoid(
            compute,
            reward,
            min_compute=min_compute,
            method=self.method,
            bootstrap=self.bootstrap if bootstrap is None else int(bootstrap),
            level=self.level,
            seed=self.seed,
            drop_nonfinite=True,
            **self.grid,
        )

    def fit_runs(
        self,
        runs: Sequence[tuple],
        cuts: Sequence[float],
        *,
        bootstrap: int | None = None,
        resample_runs: bool = True,
    ) -> SigmoidFit:
        """The pooled fit of several runs' ``(compute, reward)`` with this protocol, each above its
        cut (``resample_runs``: :func:`~scalerl.scaling.sigmoid.fit_sigmoid_runs`')."""
        return fit_sigmoid_runs(
            runs,
            min_compute=list(cuts),
            method=self.method,
            bootstrap=self.bootstrap if bootstrap is None else int(bootstrap),
            level=self.level,
            seed=self.seed,
            drop_nonfinite=True,
            resample_runs=resample_runs,
            **self.grid,
        )

    def describe(self, axis: str) -> str:
        """The protocol in one paragraph of the report (``axis``: the runs' compute axis)."""
        cut = [f"before step {self.min_step}"] if self.min_step else []
        cut += [f"below {self.min_compute:g} {axis}"] if self.min_compute else []
        grid = ""
        if self.method == "grid":
            grid = (
                f" (A grid {self.grid_A or 'from the data'}, C_mid grid {self.grid_C_mid or 'from the data'})"
            )
        return (
            f"Fit: `R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)` of `{self.reward_key}` against compute "
            f"({axis}), method {self.method}{grid}; early points "
            + (" or ".join(cut) if cut else "none")
            + " left out of every fit (the same cut for every run); "
            f"{self.level:.0%} bootstrap intervals ({self.bootstrap} resamples)."
        )
