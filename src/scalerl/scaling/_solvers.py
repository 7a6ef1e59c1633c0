"""Numerical kernels for the sigmoid fit, vectorised over many problems at once.

All solvers work in ``x = log C`` and ``u = log C_mid`` so that compute in FLOPs (1e20) and in
GPU-hours (1e3) are equally well conditioned.  The model is::

    f(x) = R0 + (A - R0) * s,   s = 1 / (1 + (C_mid / C) ** B) = expit(B * (x - u))

Derivatives (``g = s * (1 - s)``)::

    df/dA = s,   df/dB = (A - R0) * g * (x - u),   df/du = -(A - R0) * g * B
"""

from __future__ import annotations

import numpy as np


def expit(z):
    """scipy's logistic function, imported when a fit first needs it: scipy takes most of a second
    to import, and a run or sweep that is refused, or never fits, should not pay for it."""
    from scipy.special import expit as _expit

    return _expit(z)


def model(x: np.ndarray, r0, a, b, u) -> np.ndarray:
    """Sigmoid in log-compute. Parameters broadcast against ``x``."""
    return r0 + (a - r0) * expit(b * (x - u))


def jacobian(x: np.ndarray, r0, a, b, u) -> np.ndarray:
    """d model / d(A, B, u), stacked on a new last axis."""
    s = expit(b * (x - u))
    g = s * (1.0 - s)
    gain = a - r0
    d = x - u
    return np.stack(np.broadcast_arrays(s, gain * g * d, -gain * g * b), axis=-1)


def batched_lm(
    x: np.ndarray,
    y: np.ndarray,
    r0: np.ndarray,
    theta0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    *,
    w: np.ndarray | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Bounded Levenberg-Marquardt on many independent 3-parameter problems at once.

    ``x``: (n,) or (m, n) log-compute; ``y``: (m, n) targets; ``r0``: (m,) fixed starts;
    ``theta0``: (m, 3) starting (A, B, u); bounds: (3,) or (m, 3).
    ``w``: optional (m, n) non-negative weights (cost = sum w * residual**2); bounds with
    ``lower == upper`` hold that parameter fixed.
    Returns (theta (m, 3), sse (m,)). Variables sitting on a bound whose gradient pushes outwards
    are frozen for the step (a simple active-set rule), the others take a damped Gauss-Newton step
    that is then clipped into the box; a step is kept only if it lowers the cost.
    """
    y = np.atleast_2d(np.asarray(y, dtype=float))
    m = y.shape[0]
    x = np.broadcast_to(np.asarray(x, dtype=float), y.shape)
    r0 = np.asarray(r0, dtype=float).reshape(m, 1)
    theta = np.clip(np.array(theta0, dtype=float).reshape(m, 3), lower, upper)
    lower = np.broadcast_to(np.asarray(lower, dtype=float), (m, 3))
    upper = np.broadcast_to(np.asarray(upper, dtype=float), (m, 3))
    sw = None if w is None else np.sqrt(np.broadcast_to(np.asarray(w, dtype=float), y.shape))
    fixed = (upper - lower) <= 0
    lam = np.full(m, 1e-3)
    eye = np.eye(3)

    res, sse = cost_rows(x, y, r0, theta, sw)
    active_rows = np.ones(m, dtype=bool)
    for _ in range(max_iter):
        idx = np.flatnonzero(active_rows)
        if idx.size == 0:
            break
        th = theta[idx]
        J = jacobian(x[idx], r0[idx], th[:, :1], th[:, 1:2], th[:, 2:3])  # (k, n, 3)
        if sw is not None:
            J = J * sw[idx][:, :, None]
        g = np.einsum("knp,kn->kp", J, res[idx])  # descent direction J^T r (res is weighted)
        span = upper[idx] - lower[idx]
        at_lo = (th <= lower[idx] + 1e-12 * span) & (g < 0)
        at_hi = (th >= upper[idx] - 1e-12 * span) & (g > 0)
        frozen = at_lo | at_hi | fixed[idx]
        J = np.where(frozen[:, None, :], 0.0, J)
        g = np.where(frozen, 0.0, g)
        H = np.einsum("knp,knq->kpq", J, J)
        diag = np.einsum("kpp->kp", H)
        damp = lam[idx, None] * np.maximum(diag, 1e-12) + frozen * 1.0
        M = H + damp[:, :, None] * eye
        try:
            step = np.linalg.solve(M, g[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = g / np.maximum(np.einsum("kpp->kp", M), 1e-12)
        new = np.clip(th + step, lower[idx], upper[idx])
        new_res, new_sse = cost_rows(x[idx], y[idx], r0[idx], new, None if sw is None else sw[idx])
        better = new_sse < sse[idx]
        rel = (sse[idx] - new_sse) / np.maximum(sse[idx], 1e-300)
        theta[idx[better]] = new[better]
        res[idx[better]] = new_res[better]
        sse[idx[better]] = new_sse[better]
        lam[idx] = np.where(better, np.maximum(lam[idx] / 3.0, 1e-9), np.minimum(lam[idx] * 4.0, 1e9))
        stepsize = np.max(np.abs(new - th) / np.maximum(span, 1e-12), axis=1)
        done = (better & (rel < tol)) | (stepsize < 1e-12) | (lam[idx] >= 1e9)
        active_rows[idx[done]] = False
    return theta, sse


def cost_rows(x, y, r0, th, sw=None):
    """Residuals (weighted by ``sw`` = sqrt(w) when given) and their sum of squares, per row."""
    f = model(x, r0, th[:, :1], th[:, 1:2], th[:, 2:3])
    res = y - f
    if sw is not None:
        res = res * sw
    return res, np.einsum("ij,ij->i", res, res)


def fit_b_batched(
    x: np.ndarray,
    y: np.ndarray,
    r0: float,
    a: np.ndarray,
    u: np.ndarray,
    b_lo: float,
    b_hi: float,
    *,
    n_init: int = 16,
    max_iter: int = 30,
    tol: float = 1e-9,
) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares B for each (A, u) pair with A and u held fixed (the paper's inner fit).

    This is the same one-dimensional problem ``scipy.optimize.curve_fit`` solves per grid pair,
    solved for all pairs at once: a coarse log-spaced scan of B picks the start, then bounded
    Gauss-Newton steps (halved until the cost drops) on the pairs that have not converged.
    ``a`` and ``u`` are flat arrays of equal length. Returns (B, sse) per pair.
    """
    a = np.asarray(a, dtype=float)[:, None]
    u = np.asarray(u, dtype=float)[:, None]
    x = np.asarray(x, dtype=float)[None, :]
    y = np.asarray(y, dtype=float)[None, :]
    gain = a - r0
    d = x - u  # (pairs, n)
    dev = y - r0

    def sse_rows(rows, b):
        res = dev - gain[rows] * expit(b[:, None] * d[rows])
        return np.einsum("ij,ij->i", res, res)

    all_rows = np.arange(a.shape[0])
    scan = np.geomspace(b_lo, b_hi, n_init)
    b = np.full(a.shape[0], scan[0])
    sse = np.full(a.shape[0], np.inf)
    for bv in scan:
        s = sse_rows(all_rows, np.full(a.shape[0], bv))
        take = s < sse
        sse[take] = s[take]
        b[take] = bv
    rows = all_rows
    for _ in range(max_iter):
        if rows.size == 0:
            break
        br = b[rows]
        dr = d[rows]
        s = expit(br[:, None] * dr)
        res = dev - gain[rows] * s
        j = gain[rows] * s * (1.0 - s) * dr
        step = np.einsum("ij,ij->i", j, res) / np.maximum(np.einsum("ij,ij->i", j, j), 1e-300)
        t = 1.0
        pending = np.ones(rows.size, dtype=bool)
        improved = np.zeros(rows.size)
        for _half in range(6):
            idx = np.flatnonzero(pending)
            if idx.size == 0:
                break
            cand = np.clip(br[idx] + t * step[idx], b_lo, b_hi)
            cs = sse_rows(rows[idx], cand)
            ok = cs < sse[rows[idx]]
            good = idx[ok]
            improved[good] = (sse[rows[good]] - cs[ok]) / np.maximum(sse[rows[good]], 1e-300)
            b[rows[good]] = cand[ok]
            sse[rows[good]] = cs[ok]
            pending[good] = False
            t *= 0.25
        # Keep iterating only on pairs that still improve noticeably.
        rows = rows[improved > tol]
    return b, sse
