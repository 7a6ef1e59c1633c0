"""Analysis of finished (or running) training runs: sigmoid fits of every run in an MLflow
experiment, recipe comparison tables, plots, and write-back of ``fit/*`` metrics.

Command line: ``python -m scalerl.analysis fit|compare --experiment NAME ...`` (see analysis/README.md).
Library: :func:`fit_experiment` (rows for the sweep report), :func:`rows_to_markdown`,
:func:`rows_to_csv`; :func:`analyse_runs` for the fits themselves.
"""

from scalerl.analysis.experiment import (
    MARGIN_A,
    ExperimentResult,
    analyse_runs,
    differing_params,
    fit_experiment,
    rows_to_csv,
    rows_to_markdown,
)
from scalerl.analysis.mlflow_io import AnalysisError, RunData, load_runs, make_client, resolve_tracking_uri

__all__ = [
    "MARGIN_A",
    "AnalysisError",
    "ExperimentResult",
    "RunData",
    "analyse_runs",
    "differing_params",
    "fit_experiment",
    "load_runs",
    "make_client",
    "resolve_tracking_uri",
    "rows_to_csv",
    "rows_to_markdown",
]
