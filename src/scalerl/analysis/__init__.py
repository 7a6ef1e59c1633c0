"""Analysis of finished (or running) training runs: sigmoid fits of every run in an MLflow
experiment, recipe comparison tables against a baseline variant, plots, and write-back of
``fit/*`` metrics.

Command line: ``python -m scalerl.analysis fit|compare --experiment NAME ...`` (see analysis/README.md).
Library: :func:`report` (the one report pipeline: table, files, plots, write-back; the analysis CLI
and the sweep report both call it, each with a :class:`ReportInput`), :func:`fit_experiment` (rows
only: one typed :class:`RunRow` per run), :func:`analyse_runs` (the
fits and comparison, all made with one :class:`FitProtocol`), :func:`rows_to_markdown`, :func:`rows_to_csv`.
"""

from scalerl.analysis.experiment import (
    Baseline,
    ExperimentResult,
    FitCells,
    HalfCheck,
    PooledRow,
    RunRow,
    analyse_runs,
    choose_baseline,
    differing_params,
    fit_experiment,
    rows_to_csv,
    rows_to_markdown,
)
from scalerl.analysis.mlflow_io import AnalysisError, RunData, load_runs, make_client, resolve_tracking_uri
from scalerl.analysis.reporting import Report, ReportInput, report
from scalerl.analysis.verdicts import MARGIN_A  # the one margin on A: the verdicts' (figures draw it)
from scalerl.scaling.protocol import FitProtocol  # how every fit is made: report(protocol=...)

__all__ = [
    "MARGIN_A",
    "AnalysisError",
    "Baseline",
    "ExperimentResult",
    "FitProtocol",
    "FitCells",
    "HalfCheck",
    "PooledRow",
    "Report",
    "ReportInput",
    "RunRow",
    "RunData",
    "analyse_runs",
    "choose_baseline",
    "differing_params",
    "fit_experiment",
    "load_runs",
    "make_client",
    "report",
    "resolve_tracking_uri",
    "rows_to_csv",
    "rows_to_markdown",
]
