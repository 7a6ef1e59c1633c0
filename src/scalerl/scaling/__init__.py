"""Scaling-curve science: the sigmoid fit of reward against compute (ScaleRL section 1).

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

``fit_sigmoid`` / ``fit_sigmoid_runs`` / ``fit_fixed_A`` fit, ``FitProtocol`` holds the settings every
fit of a run or sweep is made with (built once from the ``scaling`` config), ``plot_fit`` / ``plot_linearised``
draw (imported lazily: matplotlib is only loaded when a plot is asked for), ``scalerl.scaling.live``
has the calls the training loop makes.
"""

from scalerl.scaling.protocol import FitProtocol, FitProtocolError
from scalerl.scaling.sigmoid import (
    DEFAULT_METHOD,
    METHODS,
    SigmoidFit,
    fit_fixed_A,
    fit_sigmoid,
    fit_sigmoid_runs,
    linearised,
)

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "FitProtocol",
    "FitProtocolError",
    "SigmoidFit",
    "fit_fixed_A",
    "fit_sigmoid",
    "fit_sigmoid_runs",
    "linearised",
    "plot_fit",
    "plot_linearised",
]


def __getattr__(name):
    if name in ("plot_fit", "plot_linearised"):
        from scalerl.scaling import plot

        return getattr(plot, name)
    raise AttributeError(f"module 'scalerl.scaling' has no attribute {name!r}")
