"""The ScaleRL sigmoid scaling curve: fitting, bootstrap uncertainty, prediction.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

``fit_sigmoid`` fits one run, ``fit_sigmoid_runs`` pools several seeds of one recipe (bootstrap
resamples the seeds too), ``fit_fixed_A`` refits B and C_mid with A held fixed (the paper's way to
compare B across leave-one-out variants).  Data problems never raise: they give a fit with
``ok == False``, a ``reason`` and NaN parameters.  Only programmer errors (an unknown method, a bad
level) raise ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scalerl.scaling import _solvers
from scalerl.scaling._solvers import expit  # scipy's, imported at the first fit

METHODS = ("grid", "direct")
DEFAULT_METHOD = "direct"
"""The more accurate method on the synthetic accuracy suite (see analysis/README.md)."""

N_PARAMS = 3
"""The curve's free parameters (A, B, C_mid; R0 is observed): a fit needs this many points, and a
fit through exactly this many passes through them, leaving no residuals for an interval."""
B_BOUNDS = (0.1, 10.0)
"""B is a positive exponent; the paper's fits lie in 1-2.5."""
U_MARGIN = math.log(100.0)
"""C_mid may lie up to 100x outside the fitted compute range."""
MIN_GAIN = 0.01
"""A curve whose late rewards rise less than this above R0 counts as flat."""
GRID_A_STEP = 0.005
GRID_N_CMID = 100
PAPER_GRID_A = (0.45, 0.80, 0.005)
"""The paper's grid over A: 0.450, 0.455, ..., 0.800 (``grid_A=(low, high, step)``)."""
PAPER_GRID_C_MID = (100.0, 40000.0, 100)
"""The paper's grid over C_mid: 100 linearly spaced values over [100, 40000] GPU-hours
(``grid_C_mid=(low, high, n)``); only meaningful on a compute axis in GPU-hours at the paper's scale."""


def round_sig(v: float, digits: int = 3) -> float:
    """``v`` to ``digits`` significant figures (NaN and inf unchanged)."""
    v = float(v)
    if not math.isfinite(v) or v == 0.0:
        return v
    return float(f"{v:.{digits - 1}e}")


def round_to(v: float, decimals: int = 3) -> float:
    """``v`` to ``decimals`` places, with -0.0 as 0.0: a pass-rate difference of 1.1e-16 is 0."""
    v = float(v)
    if not math.isfinite(v):
        return v
    return round(v, decimals) + 0.0


def early_cutoff(steps, compute, *, min_step: int = 0, min_compute: float = 0.0) -> float:
    """The ``min_compute`` that leaves out a run's early points: those below ``min_compute`` (in the
    compute axis' units) and those evaluated before optimiser step ``min_step``.

    The same absolute threshold for every run of a sweep (the paper cuts at a fixed ~1.5k GPU-hours),
    unlike a fraction of each run's own budget, which moves between runs and between a live refit,
    the final fit and the half-budget check. Compute grows with the step, so the step cut is the
    compute of the first evaluation at ``step >= min_step``; no such evaluation: every point is cut.
    """
    s = np.asarray(steps, dtype=float)
    c = np.asarray(compute, dtype=float)
    cut = float(min_compute)
    if min_step > 0 and s.size:
        late = np.isfinite(c) & (s >= min_step)
        cut = max(cut, float(c[late].min()) if late.any() else math.inf)
    return cut


@dataclass
class SigmoidFit:
    """Result of a sigmoid fit. Parameters are NaN when ``ok`` is False."""

    A: float = math.nan
    B: float = math.nan
    C_mid: float = math.nan
    R0: float = math.nan
    ok: bool = False
    reason: str = ""
    method: str = DEFAULT_METHOD
    min_compute: float = 0.0
    n_points: int = 0
    """Points used in the fit (after exclusions)."""
    compute: np.ndarray = field(default_factory=lambda: np.zeros(0))
    reward: np.ndarray = field(default_factory=lambda: np.zeros(0))
    used: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Mask over ``compute``/``reward``: True where the point was in the fit."""
    excluded: dict[int, str] = field(default_factory=dict)
    """Index into the input arrays -> why the point was left out of the fit."""
    run_index: np.ndarray | None = None
    """For pooled fits: which input run each point came from."""
    level: float = 0.9
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    boot: np.ndarray | None = None
    """Bootstrap replicates, shape (n, 4): A, B, C_mid, R0."""
    sse: float = math.nan
    rmse: float = math.nan
    fixed_A: bool = False

    @property
    def through_points(self) -> bool:
        """Fitted, A free, on no more points than the curve has parameters: it is set by those points
        alone, with nothing left to check it against, so its A is no measured ceiling and it
        predicts nothing (no horizon judged, no extrapolation, no prediction scored)."""
        return self.ok and not self.fixed_A and self.n_points <= N_PARAMS

    # ---- prediction -------------------------------------------------------------------------
    def predict(self, compute) -> np.ndarray:
        """Predicted reward at ``compute`` (R0 at C <= 0). NaN everywhere when the fit failed."""
        c = np.asarray(compute, dtype=float)
        if not self.ok:
            return np.full(c.shape, math.nan)
        return _predict(c, self.R0, self.A, self.B, self.C_mid)

    def predict_band(self, compute, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise bootstrap band of the fitted curve (uncertainty of the mean curve, not of
        single noisy evaluations). NaN when there is no bootstrap."""
        c = np.asarray(compute, dtype=float)
        level = self.level if level is None else _check_level(level)
        if not self.ok or self.boot is None or len(self.boot) < 2:
            nan = np.full(c.shape, math.nan)
            return nan, nan.copy()
        b = self.boot
        pred = _predict(c[..., None], b[:, 3], b[:, 0], b[:, 1], b[:, 2])  # (..., n_boot)
        q = (1.0 - level) / 2.0
        lo, hi = np.quantile(pred, [q, 1.0 - q], axis=-1)
        return lo, hi

    # ---- reporting --------------------------------------------------------------------------
    def to_metrics(self, prefix: str = "fit/") -> dict[str, float]:
        """Flat float metrics for MLflow (NaN where unknown), rounded to what the data supports:
        pass rates (A, R0 and A's interval) to 0.001 (an evaluation of 128 prompts x 4 samples
        resolves 0.002), B, C_mid and the rmse to 3 significant figures; the exact values stay in
        the fit object."""
        out = {
            "A": round_to(self.A),
            "B": round_sig(self.B),
            "C_mid": round_sig(self.C_mid),
            "R0": round_to(self.R0),
        }
        for name in ("A", "B", "C_mid"):
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            r = round_to if name == "A" else round_sig
            out[f"{name}_lo"] = r(lo)
            out[f"{name}_hi"] = r(hi)
        out["n_points"] = float(self.n_points)
        out["ok"] = 1.0 if self.ok else 0.0
        out["rmse"] = round_sig(self.rmse)
        return {prefix + k: float(v) for k, v in out.items()}

    def summary(self) -> str:
        if not self.ok:
            return f"unfittable: {self.reason}"

        def ci(name, fmt):
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            if math.isnan(lo):
                return ""
            return f" [{fmt.format(lo)}, {fmt.format(hi)}]"

        return (
            f"A={self.A:.3f}{ci('A', '{:.3f}')} B={self.B:.2f}{ci('B', '{:.2f}')} "
            f"C_mid={self.C_mid:.4g}{ci('C_mid', '{:.3g}')} R0={self.R0:.3f} "
            f"(n={self.n_points}, {self.method})"
        )

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.summary()


def _predict(c, r0, a, b, c_mid):
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logc = np.where(c > 0, np.log(np.where(c > 0, c, 1.0)), -np.inf)
        s = expit(b * (logc - np.log(c_mid)))
    return r0 + (a - r0) * s


def _check_level(level: float) -> float:
    if not (0.0 < float(level) < 1.0):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return float(level)


# ------------------------------------------------------------------------------------------------
# Input preparation
# ------------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    compute: np.ndarray
    reward: np.ndarray
    used: np.ndarray
    excluded: dict[int, str]
    r0: float
    r0_from_data: int  # how many observed points R0 was averaged from (0 = given)
    reason: str = ""
    fatal: bool = False  # malformed input (as opposed to too little / flat data)


def _prepare(compute, reward, r0, min_compute, drop_nonfinite) -> _Prepared:
    def bad(reason, c=np.zeros(0), y=np.zeros(0)):
        return _Prepared(c, y, np.zeros(c.shape, bool), {}, math.nan, 0, reason, fatal=True)

    try:
        c = np.asarray(compute, dtype=float)
        y = np.asarray(reward, dtype=float)
    except (TypeError, ValueError) as e:
        return bad(f"non-numeric input ({e})")
    if c.ndim != 1 or y.ndim != 1:
        return bad(f"compute and reward must be 1-D sequences (got {c.ndim}-D and {y.ndim}-D)")
    if c.size == 0 or y.size == 0:
        return (
            bad("no points", c, y)
            if c.size == y.size
            else bad(f"compute and reward have different lengths ({c.size} vs {y.size})")
        )
    empty = _Prepared(c, y, np.zeros(c.shape, bool), {}, math.nan, 0, fatal=True)
    if c.shape != y.shape:
        empty.reason = f"compute and reward have different lengths ({c.size} vs {y.size})"
        empty.compute, empty.reward, empty.used = np.zeros(0), np.zeros(0), np.zeros(0, bool)
        return empty
    excluded: dict[int, str] = {}
    finite = np.isfinite(c) & np.isfinite(y)
    if not finite.all():
        if not drop_nonfinite:
            empty.reason = f"input contains NaN or infinite values ({int((~finite).sum())} points)"
            return empty
        for i in np.flatnonzero(~finite):
            excluded[int(i)] = "not finite"
    if (c[finite] < 0).any():
        empty.reason = "compute must be >= 0 (found negative values)"
        return empty
    if ((y[finite] < 0) | (y[finite] > 1)).any():
        empty.reason = "rewards must be pass rates in [0, 1]"
        return empty
    if not finite.any():
        empty.reason = "no finite points"
        return empty

    if r0 is None:
        cmin = c[finite].min()
        start = finite & (c == cmin)
        r0_val = float(y[start].mean())
        n_r0 = int(start.sum())
        for i in np.flatnonzero(start):
            excluded[int(i)] = "start point (R0)"
    else:
        r0_val = float(r0)
        n_r0 = 0
        if not (math.isfinite(r0_val) and 0.0 <= r0_val <= 1.0):
            empty.reason = f"r0 must be a pass rate in [0, 1], got {r0!r}"
            return empty
    for i in np.flatnonzero(finite & (c <= 0)):
        excluded.setdefault(int(i), "compute <= 0 (R0 only)")
    for i in np.flatnonzero(finite & (c > 0) & (c < min_compute)):
        excluded.setdefault(int(i), "below min_compute")
    used = finite.copy()
    if excluded:
        used[list(excluded)] = False
    p = _Prepared(c, y, used, dict(sorted(excluded.items())), r0_val, n_r0)

    n = int(used.sum())
    if n < N_PARAMS:
        p.reason = f"only {n} points to fit after exclusions (need at least {N_PARAMS}, one per parameter)"
        return p
    if np.unique(c[used]).size < N_PARAMS:
        p.reason = f"fewer than {N_PARAMS} distinct compute values to fit"
        return p
    if r0_val >= 1.0:
        p.reason = "R0 is already 1.0: nothing to gain"
        return p
    # Flat or falling: the upper half of the compute range must rise above R0.
    cu, yu = c[used], y[used]
    late = yu[cu >= np.median(cu)]
    gain = float(late.mean() - r0_val)
    if gain < MIN_GAIN:
        p.reason = f"flat or falling curve: late rewards rise {gain:+.3f} above R0 (need >= {MIN_GAIN})"
        return p
    return p


# ------------------------------------------------------------------------------------------------
# Point estimates
# ------------------------------------------------------------------------------------------------


def _bounds(x: np.ndarray, r0: float, a_fixed: float | None = None):
    lo_u, hi_u = x.min() - U_MARGIN, x.max() + U_MARGIN
    if a_fixed is None:
        lower = np.array([r0, B_BOUNDS[0], lo_u])
        upper = np.array([1.0, B_BOUNDS[1], hi_u])
    else:
        lower = np.array([a_fixed, B_BOUNDS[0], lo_u])
        upper = np.array([a_fixed, B_BOUNDS[1], hi_u])
    return lower, upper


def _starts(x: np.ndarray, y: np.ndarray, r0: float, a_fixed: float | None = None) -> np.ndarray:
    ymax = float(np.max(y))
    gain = max(ymax - r0, 0.01)
    if a_fixed is None:
        a0 = [ymax + 0.01, r0 + 1.25 * gain, r0 + 2.0 * gain, (ymax + 1.0) / 2.0]
    else:
        a0 = [a_fixed]
    b0 = [0.7, 1.5, 3.0]
    xr = x.max() - x.min()
    u0 = [x.min(), x.min() + 0.5 * xr, x.max(), x.max() + 1.0]
    grid = np.array(np.meshgrid(a0, b0, u0, indexing="ij")).reshape(3, -1).T
    grid[:, 0] = np.clip(grid[:, 0], r0 + 1e-6 if a_fixed is None else a_fixed, 1.0)
    return grid


def _polish(x, y, r0, theta, lower, upper, free: Sequence[int] = (0, 1, 2), w=None):
    """scipy.optimize.least_squares (trf, bounded) from ``theta`` over the ``free`` parameters."""
    free = list(free)
    sw = None if w is None else np.sqrt(w)

    def full(p):
        t = np.array(theta, dtype=float)
        t[free] = p
        return t

    def fun(p):
        t = full(p)
        r = _solvers.model(x, r0, t[0], t[1], t[2]) - y
        return r if sw is None else r * sw

    def jac(p):
        t = full(p)
        J = _solvers.jacobian(x, r0, t[0], t[1], t[2])[:, free]
        return J if sw is None else J * sw[:, None]

    lo, hi = lower[free], upper[free]
    p0 = np.clip(np.asarray(theta, dtype=float)[free], lo, hi)
    # least_squares needs strictly feasible starts with lo < hi.
    span = hi - lo
    p0 = np.clip(p0, lo + 1e-10 * span, hi - 1e-10 * span)
    from scipy.optimize import least_squares

    try:
        res = least_squares(fun, p0, jac=jac, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=200)
    except (ValueError, np.linalg.LinAlgError):
        return np.asarray(theta, dtype=float), math.inf
    t = full(res.x)
    return t, float(2.0 * res.cost)


def _fit_direct(x, y, r0, *, a_fixed=None, w=None):
    lower, upper = _bounds(x, r0, a_fixed)
    starts = _starts(x, y, r0, a_fixed)
    m = len(starts)
    theta, sse = _solvers.batched_lm(
        x, np.broadcast_to(y, (m, y.size)), np.full(m, r0), starts, lower, upper, w=w, max_iter=60
    )
    order = np.argsort(sse)
    free = (0, 1, 2) if a_fixed is None else (1, 2)
    best_t, best_s = theta[order[0]], sse[order[0]]
    tried = []
    for k in order[:3]:
        t = theta[k]
        if any(np.allclose(t, s, rtol=1e-3, atol=1e-4) for s in tried):
            continue
        tried.append(t)
        pt, ps = _polish(x, y, r0, t, lower, upper, free, w)
        if ps < best_s:
            best_t, best_s = pt, ps
    return best_t, best_s


def _grid_axes(x, y, r0, grid_A=None, grid_C_mid=None):
    """The grid's A and log C_mid values. Default ranges follow the data: A from 0.05 below the best
    observed reward to 1 in steps of 0.005, C_mid log-spaced over the data's compute range and one
    decade either side. ``grid_A=(low, high, step)``, ``grid_C_mid=(low, high, n)`` (linearly
    spaced, as in the paper): fixed ranges (:data:`PAPER_GRID_A`, :data:`PAPER_GRID_C_MID`)."""
    if grid_A is None:
        ymax = float(np.max(y))
        a_lo = max(r0 + GRID_A_STEP, math.floor((ymax - 0.05) / GRID_A_STEP) * GRID_A_STEP)
        a_vals = np.arange(a_lo, 1.0 + 1e-9, GRID_A_STEP)
    else:
        lo, hi, step = (float(v) for v in grid_A)
        a_vals = np.arange(lo, hi + step * 1e-6, step)
    a_vals = a_vals[(a_vals > r0) & (a_vals <= 1.0)]
    if a_vals.size == 0:
        a_vals = np.array([1.0])
    if grid_C_mid is None:
        u_vals = np.linspace(x.min() - math.log(10.0), x.max() + math.log(10.0), GRID_N_CMID)
    else:
        lo, hi, n = float(grid_C_mid[0]), float(grid_C_mid[1]), int(grid_C_mid[2])
        u_vals = np.log(np.linspace(lo, hi, n))
    return a_vals, u_vals


def _check_grid(grid_A, grid_C_mid):
    if grid_A is not None:
        lo, hi, step = (float(v) for v in grid_A)
        if not (0.0 <= lo <= hi <= 1.0 and step > 0):
            raise ValueError(
                f"grid_A must be (low, high, step) with 0 <= low <= high <= 1, step > 0: {grid_A!r}"
            )
    if grid_C_mid is not None:
        lo, hi, n = grid_C_mid
        if not (0 < float(lo) <= float(hi) and int(n) >= 1):
            raise ValueError(
                f"grid_C_mid must be (low, high, n) with 0 < low <= high, n >= 1: {grid_C_mid!r}"
            )


def _fit(x, y, r0, method, grid_A=None, grid_C_mid=None):
    if method == "direct":
        return _fit_direct(x, y, r0)
    return _fit_grid(x, y, r0, grid_A=grid_A, grid_C_mid=grid_C_mid)


def _fit_grid(x, y, r0, *, b_solver: str = "vectorized", grid_A=None, grid_C_mid=None):
    """The paper's procedure: grid over (A, C_mid), B least squares per pair, smallest SSE wins."""
    a_vals, u_vals = _grid_axes(x, y, r0, grid_A, grid_C_mid)
    aa, uu = (g.ravel() for g in np.meshgrid(a_vals, u_vals, indexing="ij"))
    if b_solver == "vectorized":
        b, sse = _solvers.fit_b_batched(x, y, r0, aa, uu, *B_BOUNDS)
    elif b_solver == "curve_fit":
        b, sse = _grid_b_curve_fit(x, y, r0, aa, uu)
    else:
        raise ValueError(f"unknown b_solver {b_solver!r}")
    k = int(np.nanargmin(sse))
    return np.array([aa[k], b[k], uu[k]]), float(sse[k])


def _grid_b_curve_fit(x, y, r0, aa, uu):
    """The literal per-pair ``scipy.optimize.curve_fit`` of the paper (slow: for checks)."""
    from scipy.optimize import curve_fit

    b_out = np.empty(aa.size)
    s_out = np.empty(aa.size)
    for i, (a, u) in enumerate(zip(aa, uu)):

        def f(xx, b, a=a, u=u):
            return _solvers.model(xx, r0, a, b, u)

        best = (math.nan, math.inf)
        for b0 in (0.5, 1.5, 4.0):
            try:
                (bb,), _ = curve_fit(f, x, y, p0=[b0], bounds=B_BOUNDS)
            except (RuntimeError, ValueError):
                continue
            s = float(np.sum((f(x, bb) - y) ** 2))
            if s < best[1]:
                best = (bb, s)
        b_out[i], s_out[i] = best
    return b_out, s_out


# ------------------------------------------------------------------------------------------------
# Bootstrap
# ------------------------------------------------------------------------------------------------


def _bootstrap(x, y, r0, theta, *, groups, r0_runs, r0_n, n_boot, rng, a_fixed=None, resample_runs=True):
    """Residual bootstrap, warm-started batched refits.

    ``groups``: integer run id per point (all zeros for a single run). With several runs the
    runs are resampled with replacement first (seed-level variation, entering as point weights;
    ``resample_runs`` False: every run kept once, for the uncertainty of these runs' own curve),
    then residuals are resampled within each run.
    ``r0_runs``: the observed start reward of each run id (None when R0 was given); with several
    runs R0 is re-drawn as the mean over the resampled runs.  ``r0_n``: for a single run, how many
    evaluations R0 was averaged from (0 = given): R0 gets a resampled residual / sqrt(r0_n).
    Returns (n_boot, 4) replicates of (A, B, C_mid, R0).
    """
    n = y.size
    fitted = _solvers.model(x, r0, *theta)
    resid = y - fitted
    n_params = 2 if a_fixed is not None else 3
    if n <= n_params:
        return None
    resid = (resid - resid.mean()) * math.sqrt(n / (n - n_params))
    run_ids = np.unique(groups)
    n_runs = run_ids.size
    members = [np.flatnonzero(groups == g) for g in run_ids]
    ystar = np.empty((n_boot, n))
    w = np.ones((n_boot, n))
    r0_star = np.full(n_boot, r0)
    for k in range(n_boot):
        if n_runs > 1 and resample_runs:
            pick = rng.integers(0, n_runs, n_runs)
            counts = np.bincount(pick, minlength=n_runs)
            for j, idx in enumerate(members):
                w[k, idx] = counts[j]
            if r0_runs is not None:
                r0_star[k] = float(np.mean(np.asarray(r0_runs)[run_ids[pick]]))
        for idx in members:
            ystar[k, idx] = fitted[idx] + rng.choice(resid[idx] if n_runs > 1 else resid, idx.size)
        if n_runs == 1 and r0_n > 0:
            r0_star[k] = r0 + rng.choice(resid) / math.sqrt(r0_n)
    r0_star = np.clip(r0_star, 0.0, 1.0 - 1e-6)
    lower, upper = _bounds(x, r0, a_fixed)
    lower_b = np.tile(lower, (n_boot, 1))
    upper_b = np.tile(upper, (n_boot, 1))
    if a_fixed is None:
        lower_b[:, 0] = r0_star
    start = np.tile(theta, (n_boot, 1))
    start[:, 0] = np.clip(start[:, 0], lower_b[:, 0], upper_b[:, 0])
    th, _ = _solvers.batched_lm(x, ystar, r0_star, start, lower_b, upper_b, w=w, max_iter=60)
    return np.column_stack([th[:, 0], th[:, 1], np.exp(th[:, 2]), r0_star])


def _ci(boot: np.ndarray, level: float) -> dict[str, tuple[float, float]]:
    q = (1.0 - level) / 2.0
    out = {}
    for j, name in enumerate(("A", "B", "C_mid")):
        lo, hi = np.quantile(boot[:, j], [q, 1.0 - q])
        out[name] = (float(lo), float(hi))
    return out


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------


def _failed(p: _Prepared, method, min_compute, level, reason=None, run_index=None) -> SigmoidFit:
    return SigmoidFit(
        R0=p.r0,
        ok=False,
        reason=reason or p.reason,
        method=method,
        min_compute=float(min_compute),
        n_points=int(p.used.sum()) if p.used.size else 0,
        compute=p.compute,
        reward=p.reward,
        used=p.used,
        excluded=p.excluded,
        run_index=run_index,
        level=level,
    )


def _check_args(method, level, bootstrap):
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    level = _check_level(level)
    if int(bootstrap) < 0:
        raise ValueError(f"bootstrap must be >= 0, got {bootstrap!r}")
    return level


def _finish(
    p,
    theta,
    sse,
    *,
    method,
    min_compute,
    level,
    bootstrap,
    seed,
    groups,
    r0_runs,
    r0_n,
    run_index,
    a_fixed=None,
    x=None,
    y=None,
    w=None,
    resample_runs=True,
):
    n = int(p.used.sum())
    fit = SigmoidFit(
        A=float(theta[0]),
        B=float(theta[1]),
        C_mid=float(math.exp(theta[2])),
        R0=p.r0,
        ok=True,
        reason="",
        method=method,
        min_compute=float(min_compute),
        n_points=n,
        compute=p.compute,
        reward=p.reward,
        used=p.used,
        excluded=p.excluded,
        run_index=run_index,
        level=level,
        sse=float(sse),
        rmse=float(math.sqrt(sse / max(n if w is None else float(np.sum(w)), 1))),
        fixed_A=a_fixed is not None,
    )
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        boot = _bootstrap(
            x,
            y,
            p.r0,
            theta,
            groups=groups,
            r0_runs=r0_runs,
            r0_n=r0_n,
            n_boot=int(bootstrap),
            rng=rng,
            a_fixed=a_fixed,
            resample_runs=resample_runs,
        )
        if boot is not None:
            fit.boot = boot
            fit.ci = _ci(boot, level)
    return fit


def fit_sigmoid(
    compute,
    reward,
    r0: float | None = None,
    min_compute: float = 0.0,
    method: str = DEFAULT_METHOD,
    *,
    bootstrap: int = 200,
    level: float = 0.9,
    seed: int = 0,
    drop_nonfinite: bool = False,
    grid_A=None,
    grid_C_mid=None,
) -> SigmoidFit:
    """Fit ``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)`` to one run's evaluations.

    ``r0=None``: R0 is the reward at the smallest compute (the step-0 evaluation); that point and
    any point with ``C <= 0`` are used for R0 only.  Points with ``0 < C < min_compute`` are left out
    (``fit.excluded`` says which and why).  ``method``: "direct" (bounded least squares over
    A, B, log C_mid from several starts, polished with scipy's ``least_squares``) or "grid" (the
    paper's grid over A and C_mid with B fitted per pair).  ``bootstrap``: residual-bootstrap
    resamples for ``fit.ci`` and ``fit.predict_band`` (0 = none).  ``drop_nonfinite``: leave NaN/inf
    points out (recorded in ``fit.excluded``) instead of failing.  ``grid_A``, ``grid_C_mid``: the
    grid method's ranges (see :func:`_grid_axes`; default: from the data).
    """
    level = _check_args(method, level, bootstrap)
    _check_grid(grid_A, grid_C_mid)
    p = _prepare(compute, reward, r0, min_compute, drop_nonfinite)
    if p.reason:
        return _failed(p, method, min_compute, level)
    x = np.log(p.compute[p.used])
    y = p.reward[p.used]
    theta, sse = _fit(x, y, p.r0, method, grid_A, grid_C_mid)
    return _finish(
        p,
        theta,
        sse,
        method=method,
        min_compute=min_compute,
        level=level,
        bootstrap=bootstrap,
        seed=seed,
        groups=np.zeros(y.size, dtype=int),
        r0_runs=None,
        r0_n=p.r0_from_data,
        run_index=None,
        x=x,
        y=y,
    )


def fit_sigmoid_runs(
    runs: Sequence[tuple[Sequence[float], Sequence[float]]],
    r0: float | None = None,
    min_compute: float | Sequence[float] = 0.0,
    method: str = DEFAULT_METHOD,
    *,
    bootstrap: int = 200,
    level: float = 0.9,
    seed: int = 0,
    drop_nonfinite: bool = False,
    grid_A=None,
    grid_C_mid=None,
    resample_runs: bool = True,
) -> SigmoidFit:
    """Fit one curve to several runs (seeds) of the same recipe, pooling their points.

    R0 (when not given) is the mean of the runs' start rewards.  The bootstrap resamples runs
    with replacement, then residuals within each run, so the intervals include seed-to-seed
    variation: the uncertainty of the recipe's curve. ``resample_runs`` False keeps every run once
    and resamples residuals alone: the uncertainty of these runs' own mean curve (what a prediction
    of these same seeds' later evaluations needs; their seed-to-seed spread is already in the data).
    ``fit.run_index`` tells which run each point of ``fit.compute`` came from.
    ``min_compute``: one cut for every run, or one per run (e.g. :func:`early_cutoff` of each run's
    steps: the compute at a given step differs between seeds).
    """
    level = _check_args(method, level, bootstrap)
    _check_grid(grid_A, grid_C_mid)
    runs = list(runs)
    cuts = [float(m) for m in min_compute] if np.ndim(min_compute) else [float(min_compute)] * len(runs)
    if len(cuts) != len(runs):
        raise ValueError(f"min_compute: {len(cuts)} cuts for {len(runs)} runs")
    min_compute = max(cuts, default=0.0)
    if not runs:
        return _failed(
            _Prepared(np.zeros(0), np.zeros(0), np.zeros(0, bool), {}, math.nan, 0),
            method,
            min_compute,
            level,
            reason="no runs given",
        )
    preps = [_prepare(c, y, r0, cut, drop_nonfinite) for (c, y), cut in zip(runs, cuts)]
    # A run is only unusable for bad data, not for having few points of its own.
    for j, p in enumerate(preps):
        if p.fatal:
            return _failed(p, method, min_compute, level, reason=f"run {j}: {p.reason}")
    pooled, ri, r0s = _pool(preps, r0)
    problem = _pooled_problem(pooled)
    if problem:
        return _failed(pooled, method, min_compute, level, reason=problem, run_index=ri)
    c_all, y_all, used_all, r0_val = pooled.compute, pooled.reward, pooled.used, pooled.r0
    x = np.log(c_all[used_all])
    y = y_all[used_all]
    theta, sse = _fit(x, y, r0_val, method, grid_A, grid_C_mid)
    return _finish(
        pooled,
        theta,
        sse,
        method=method,
        min_compute=min_compute,
        level=level,
        bootstrap=bootstrap,
        seed=seed,
        groups=ri[used_all],
        r0_runs=None if r0 is not None else r0s,
        r0_n=0,
        run_index=ri,
        x=x,
        y=y,
        resample_runs=resample_runs,
    )


def _pool(preps: Sequence[_Prepared], r0: float | None) -> tuple[_Prepared, np.ndarray, list[float]]:
    """The runs' prepared points as one: (the pooled points, which run each point came from, the
    runs' own R0s). The pooled R0 is ``r0`` when given, else the mean of the runs' (then listed)."""
    excluded: dict[int, str] = {}
    offset = 0
    for j, p in enumerate(preps):
        for i, why in p.excluded.items():
            excluded[offset + i] = f"run {j}: {why}"
        offset += p.compute.size
    r0s = [p.r0 for p in preps] if r0 is None else []
    pooled = _Prepared(
        np.concatenate([p.compute for p in preps]),
        np.concatenate([p.reward for p in preps]),
        np.concatenate([p.used for p in preps]),
        excluded,
        float(r0) if r0 is not None else float(np.mean(r0s)),
        0,
    )
    ri = np.concatenate([np.full(p.compute.size, j) for j, p in enumerate(preps)])
    return pooled, ri, r0s


def _pooled_problem(p: _Prepared) -> str:
    """Why the pooled points cannot be fitted ('' when they can): the sanity checks of one run's
    points (enough points, distinct compute values, a rising curve), made again on the pool."""
    c, y, used = p.compute, p.reward, p.used
    n = int(used.sum())
    if n < N_PARAMS:
        return f"only {n} points to fit after exclusions (need at least {N_PARAMS}, one per parameter)"
    if np.unique(c[used]).size < N_PARAMS:
        return "fewer than 3 distinct compute values to fit"
    late = y[used][c[used] >= np.median(c[used])]
    gain = float(late.mean() - p.r0)
    if gain < MIN_GAIN:
        return f"flat or falling curve: late rewards rise {gain:+.3f} above R0 (need >= {MIN_GAIN})"
    return ""


def fit_fixed_A(
    compute,
    reward,
    A: float,
    r0: float | None = None,
    min_compute: float = 0.0,
    *,
    bootstrap: int = 0,
    level: float = 0.9,
    seed: int = 0,
    drop_nonfinite: bool = False,
) -> SigmoidFit:
    """Refit B and C_mid with the ceiling A held fixed (the paper's leave-one-out comparison:
    average A over the sweep, refit every run with that A, compare B)."""
    level = _check_args("direct", level, bootstrap)
    p = _prepare(compute, reward, r0, min_compute, drop_nonfinite)
    if p.reason:
        return _failed(p, "fixed_A", min_compute, level)
    a = float(A)
    if not (math.isfinite(a) and p.r0 < a <= 1.0):
        return _failed(
            p, "fixed_A", min_compute, level, reason=f"fixed A={A!r} must lie in (R0={p.r0:.3f}, 1]"
        )
    x = np.log(p.compute[p.used])
    y = p.reward[p.used]
    theta, sse = _fit_direct(x, y, p.r0, a_fixed=a)
    fit = _finish(
        p,
        theta,
        sse,
        method="fixed_A",
        min_compute=min_compute,
        level=level,
        bootstrap=bootstrap,
        seed=seed,
        groups=np.zeros(y.size, dtype=int),
        r0_runs=None,
        r0_n=p.r0_from_data,
        run_index=None,
        a_fixed=a,
        x=x,
        y=y,
    )
    if fit.ci:
        fit.ci["A"] = (a, a)
    return fit


def linearised(fit: SigmoidFit, compute=None, reward=None) -> tuple[np.ndarray, np.ndarray]:
    """The paper's linearisation: ``F(R) = C_mid**B / ((A - R0) / (R - R0) - 1)`` equals ``C**B`` on
    the curve, so ``log F`` against ``log C`` is a line of slope B through the origin.

    Returns (log C, log F) for the fit's used points (or the given ones); points with R outside
    (R0, A) have no F and are dropped.
    """
    if compute is None:
        compute, reward = fit.compute[fit.used], fit.reward[fit.used]
    c = np.asarray(compute, dtype=float)
    r = np.asarray(reward, dtype=float)
    keep = (c > 0) & (r > fit.R0) & (r < fit.A)
    c, r = c[keep], r[keep]
    denom = (fit.A - fit.R0) / (r - fit.R0) - 1.0
    log_f = fit.B * math.log(fit.C_mid) - np.log(denom)
    return np.log(c), log_f
