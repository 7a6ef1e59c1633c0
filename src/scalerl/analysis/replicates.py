"""Replicate studies side by side: the same study (one sweep file) run again on other seeds or
machines, each with its ``report.json`` (:func:`~scalerl.analysis.reporting.report_json`). Per
variant: how often each verdict came, the spread of the fitted ceiling A across the studies, and
how the half-budget predictions did against the observed ends and against persistence (the first
half's last value), counted over the studies where the prediction was supported.

    python -m scalerl.analysis replicates outputs/study-a outputs/study-b ... [--out DIR]

A study is named by its sweep folder (``<folder>/report/report.json``), its report folder or the
file itself. One study's verdict is one draw: a call that comes in 2 of 5 replicates is a call this
design makes 2 times in 5, which is what a reader needs before trusting any single study's.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalerl.analysis.reporting import REPORT_SCHEMA
from scalerl.analysis.verdicts import LABELS, mse_skill

WITHIN = 0.03
"""A prediction is "within" when its error is at most this (issue 53's goal: 0.03)."""


class ReplicatesError(ValueError):
    """A report that cannot be read as a study's ``report.json``: one line naming it and why."""


@dataclass
class Study:
    """One study's report: where it came from and its ``report.json`` document."""

    path: Path
    doc: dict

    @property
    def label(self) -> str:
        """The study's name in the table: its sweep folder's (or the report's folder's) name, or a
        report kept under a name of its own (``<study>_report.json``), that name."""
        if self.path.name != "report.json":
            return self.path.stem
        folder = self.path.parent
        return (folder.parent if folder.name == "report" else folder).name or str(self.path)


def find_report(arg: str) -> Path:
    """The ``report.json`` that ``arg`` names: the file, a report folder holding it, or a sweep
    folder whose ``report/`` holds it."""
    p = Path(arg)
    for cand in (p, p / "report.json", p / "report" / "report.json"):
        if cand.is_file():
            return cand
    raise ReplicatesError(
        f"{arg!r}: no report.json there (expected the file, a report folder or a sweep folder with report/)"
    )


def load_study(arg: str) -> Study:
    """``arg``'s report, checked: strict JSON, this schema version, a list of variants each named
    and with a verdict from the vocabulary."""
    path = find_report(arg)
    try:
        doc = json.loads(path.read_text(), parse_constant=_refuse)
    except (OSError, ValueError) as e:
        raise ReplicatesError(f"{path}: not readable as JSON ({e})") from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != REPORT_SCHEMA:
        raise ReplicatesError(
            f"{path}: schema_version {version!r}, expected {REPORT_SCHEMA} (a report.json this version wrote)"
        )
    variants = doc.get("variants")
    if not isinstance(variants, list) or not variants:
        raise ReplicatesError(f"{path}: 'variants' is {variants!r}, expected a non-empty list")
    for i, v in enumerate(variants):
        name = v.get("variant") if isinstance(v, dict) else None
        if not isinstance(name, str) or v.get("verdict") not in LABELS:
            got = v.get("verdict") if isinstance(v, dict) else v
            raise ReplicatesError(
                f"{path}: variants[{i}] ({name!r}) has verdict {got!r}, expected one of {', '.join(LABELS)}"
            )
    return Study(path, doc)


def _refuse(const: str):
    raise ValueError(f"{const} is not JSON")


@dataclass
class Replicated:
    """One variant over the studies: the per-study values, and summaries of them."""

    variant: str
    studies: int = 0
    verdicts: Counter = field(default_factory=Counter)
    A: list[float] = field(default_factory=list)  # the studies' A where it was shown
    A_censored_studies: int = 0  # studies whose A is its censored seeds' mean (half or more at 1)
    errors: list[float] = field(default_factory=list)  # predicted - observed, supported predictions
    persistence: list[float | None] = field(default_factory=list)  # persistence - observed (None: not given)
    covered: int = 0  # observed ends inside their band
    unsupported: int = 0  # predictions made where the half window had not passed the horizon

    def row(self, within: float = WITHIN) -> dict:
        """The summary: verdict counts, A's mean and standard deviation across studies, and the
        scored predictions' mean signed and absolute error, count within ``within``, band coverage,
        persistence's mean signed and absolute error and the studies where the fit beat it."""
        n = len(self.errors)
        paired = [(e, p) for e, p in zip(self.errors, self.persistence, strict=True) if p is not None]
        pers = [p for _, p in paired]
        return {
            "variant": self.variant,
            "studies": self.studies,
            "verdicts": dict(self.verdicts.most_common()),
            "A_mean": statistics.fmean(self.A) if self.A else None,
            "A_sd": statistics.stdev(self.A) if len(self.A) > 1 else None,
            "A_min": min(self.A, default=None),
            "A_max": max(self.A, default=None),
            "A_censored_studies": self.A_censored_studies,
            "predictions": n,
            "unsupported": self.unsupported,
            "error_mean": statistics.fmean(self.errors) if n else None,
            "error_abs_mean": statistics.fmean(abs(e) for e in self.errors) if n else None,
            "within": sum(abs(e) <= within for e in self.errors),
            "covered": self.covered,
            "persistence_error_mean": statistics.fmean(pers) if pers else None,
            "persistence_abs_mean": statistics.fmean(abs(e) for e in pers) if pers else None,
            "persistence_scored": len(pers),
            "fit_better": sum(abs(e) < abs(p) for e, p in paired),
            "mse_skill": _finite(mse_skill([e for e, _ in paired], pers)),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _paired(studies: Sequence[Study]) -> tuple[list[float], list[float]]:
    """The supported predictions of ``studies`` that have a persistence forecast: their errors
    (predicted - observed) and persistence's (persistence - observed), in order."""
    errs, pers = [], []
    for study in studies:
        for v in study.doc["variants"]:
            p = v.get("prediction") or {}
            pred, obs, q = (_number(p.get(k)) for k in ("predicted", "observed", "persistence"))
            if p.get("supported") is True and None not in (pred, obs, q):
                errs.append(pred - obs)
                pers.append(q - obs)
    return errs, pers


def _skill(errs: list[float], pers: list[float]) -> dict:
    return {
        "supported": len(errs),
        "fit_beats": sum(abs(e) < abs(q) for e, q in zip(errs, pers, strict=True)),
        "mse_skill": _finite(mse_skill(errs, pers)),
    }


def study_skill(study: Study) -> dict:
    """One study's supported predictions against persistence: ``supported`` (paired), ``fit_beats``
    and ``mse_skill`` (:func:`~scalerl.analysis.verdicts.mse_skill`; None where not defined)."""
    return _skill(*_paired([study]))


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def a_bounded(v: dict) -> bool:
    """Whether a report's A for the variant is a ceiling its seeds bound below 1: not where half or
    more of its seeds (with an A) were censored at 1, whose mean is not averaged across studies.
    This is not the report's ``A_shown``, which is false for a single usable seed too (a study of
    one seed cannot compare its A: no spread), while that one seed's bounded A is averaged here."""
    censored = v.get("A_censored") or 0
    seeds = [
        s for s in v.get("per_seed") or [] if isinstance(s, dict) and s.get("ok") and not s.get("A_unusable")
    ]
    n = len(seeds) if seeds else v.get("seeds") or 0
    return not (censored and 2 * censored >= n)


def summarise(studies: Sequence[Study]) -> list[Replicated]:
    """Each variant over ``studies``, in the order the variants first appear."""
    out: dict[str, Replicated] = {}
    for s in studies:
        for v in s.doc["variants"]:
            r = out.setdefault(v["variant"], Replicated(v["variant"]))
            r.studies += 1
            r.verdicts[v["verdict"]] += 1
            a = _number(v.get("A"))
            if a is not None and a_bounded(v):
                r.A.append(a)
            elif a is not None:
                r.A_censored_studies += 1
            p = v.get("prediction") or {}
            pred, obs, pers = (_number(p.get(k)) for k in ("predicted", "observed", "persistence"))
            if pred is None or obs is None:
                continue
            if p.get("supported") is not True:
                r.unsupported += 1
                continue
            r.errors.append(pred - obs)
            r.persistence.append(None if pers is None else pers - obs)
            lo, hi = _number(p.get("lo")), _number(p.get("hi"))
            r.covered += lo is not None and hi is not None and lo <= obs <= hi
    return list(out.values())


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def to_markdown(studies: Sequence[Study], reps: Sequence[Replicated], within: float = WITHIN) -> str:
    """The replicate table: one row a variant, then the studies it was read from."""
    lines = [
        f"# {len(studies)} replicate studies\n",
        "| variant | studies | verdicts | A mean (sd) [min, max] | predictions scored (not supported) "
        f"| error mean / mean abs | within {within:g} | inside band | persistence error mean / mean abs "
        "| fit beats persistence | skill score |",
        "|---|---:|---|---|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in reps:
        x = r.row(within)
        verdicts = ", ".join(f"{k} {n}" for k, n in x["verdicts"].items())
        a = f"{_f(x['A_mean'], '.3f')} ({_f(x['A_sd'], '.3f')}) [{_f(x['A_min'], '.3f')}, {_f(x['A_max'], '.3f')}]"
        if x["A_censored_studies"]:
            a += f"; censored at 1 in {x['A_censored_studies']}"
        n = x["predictions"]
        score = (
            f"{_f(x['error_mean'], '+.3f')} / {_f(x['error_abs_mean'], '.3f')}",
            f"{x['within']}/{n}",
            f"{x['covered']}/{n}",
            f"{_f(x['persistence_error_mean'], '+.3f')} / {_f(x['persistence_abs_mean'], '.3f')}",
            f"{x['fit_better']}/{x['persistence_scored']}",
            _f(x["mse_skill"], "+.2f"),
        )
        if not n:
            score = ("-",) * len(score)
        lines.append(
            f"| {r.variant} | {x['studies']} | {verdicts} | {a} | {n} ({x['unsupported']}) | "
            + " | ".join(score)
            + " |"
        )
    lines += [
        "",
        "Errors are predicted - observed end (the half-budget fit's prediction of the mean of the "
        "last tenth of the compute), over the studies where that prediction was supported (its "
        "window past the horizon); persistence forecasts the first half's last value. A is each "
        "study's A (the mean of its seeds' fitted ceilings, as its report gives it) over the studies "
        "whose seeds bound it below 1; sd across studies; a study whose A is its censored seeds' mean "
        "(half or more of them at 1) is counted ('censored at 1 in k'), not averaged. The skill score is 1 - "
        "MSE / MSE(persistence) over the same predictions (above 0: the fit's squared error smaller).",
        "",
        _skill_line(studies),
        "",
        "Studies: "
        + "; ".join(
            f"{s.label} (commit {(s.doc.get('commit') or 'several')[:7]}"
            + (f", {s.doc['wall_s'] / 60:.1f} min" if _number(s.doc.get("wall_s")) else "")
            + ")"
            for s in studies
        ),
    ]
    return "\n".join(lines) + "\n"


def _skill_line(studies: Sequence[Study]) -> str:
    """Each study's skill against persistence, and all studies' supported predictions pooled."""
    per = [study_skill(s) for s in studies]
    pooled = _skill(*_paired(studies))
    return (
        f"Skill against persistence, all supported predictions pooled: the fit beats it on "
        f"{pooled['fit_beats']} of {pooled['supported']}, skill score {_f(pooled['mse_skill'], '+.2f')}; "
        "per study: "
        + "; ".join(
            f"{s.label} {_f(k['mse_skill'], '+.2f')} ({k['fit_beats']}/{k['supported']})"
            for s, k in zip(studies, per, strict=True)
        )
    )


def to_json(studies: Sequence[Study], reps: Sequence[Replicated], within: float = WITHIN) -> dict:
    """The table as data: ``report_schema_version`` (of the reports read), ``within``, ``studies``
    (path, commit, wall_s, skill: :func:`study_skill`) and ``variants`` (:meth:`Replicated.row`)."""
    return {
        "report_schema_version": REPORT_SCHEMA,
        "within": within,
        "studies": [
            {
                "path": str(s.path),
                "commit": s.doc.get("commit"),
                "wall_s": s.doc.get("wall_s"),
                "skill": study_skill(s),
            }
            for s in studies
        ],
        "variants": [r.row(within) for r in reps],
    }
