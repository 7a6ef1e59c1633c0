"""What a run prints: its progress lines (loop/progress.py), and at its end (loop/summary.py) its
lines and its caveats on the fit."""

from __future__ import annotations

import json
import math

from scalerl.loop.summary import fit_caveat, no_fit_line
from scalerl.storage import write_json


def test_summary_names_the_fit_with_its_intervals():
    from scalerl.loop.summary import summary_lines

    fit = {"fit/ok": 1.0, "fit/A": 0.612, "fit/A_lo": 0.55, "fit/A_hi": 0.68, "fit/B": 1.8}
    fit.update({"fit/B_lo": 1.5, "fit/B_hi": 2.1})
    base = {"steps": 200, "wall_seconds": 90.0, "pass_rate_start": 0.1, "pass_rate_final": 0.45}
    base.update({"out_dir": "/o", "run_id": "abc", "tracking_uri": "http://127.0.0.1:5000"})
    lines = summary_lines({**base, "fit": fit})
    assert lines[:3] == [
        "done: 200 steps in 90 s",
        "held-out pass rate: 0.100 -> 0.450",
        "scaling fit: A = 0.612 [0.55, 0.68], B = 1.8 [1.5, 2.1] (90% intervals of this run's points; "
        "a repeat can land outside them: compare seeds)",
    ]
    assert lines[-1] == "open it: http://127.0.0.1:5000"  # a server: its own UI
    assert not any(line.startswith("scaling fit") for line in summary_lines({**base, "fit": {"fit/ok": 0.0}}))
    # no fit says why: the README's 20-step example ended with no line about its fit at all
    failed = {**base, "evals": [{}] * 5, "fit": {"fit/ok": 0.0, "fit/n_points": 4.0}}
    assert summary_lines(failed)[2] == (
        "no scaling fit: the sigmoid did not fit the 4 points past the early cut (scaling.min_step)"
    )
    assert summary_lines({**base, "evals": [{}] * 3, "fit": {}})[2] == (
        "no scaling fit: 3 held-out evaluations, a fit needs 4 (a larger trainer.total_steps or a "
        "smaller eval.every)"
    )
    # three points after the early cut: an exact fit through them, no ceiling, nothing judged
    exact = {"fit/ok": 1.0, "fit/A": 1.0, "fit/B": 1.75, "fit/n_points": 3.0}
    exact.update({"fit/A_lo": math.nan, "fit/A_hi": math.nan, "fit/B_lo": math.nan, "fit/B_hi": math.nan})
    assert summary_lines({**base, "fit": exact})[2] == (
        "scaling fit: A = 1, B = 1.75 (fitted on 3 points for 3 parameters: nothing is left to check the curve "
        "against, so A is not a measured ceiling and nothing is extrapolated from it; A at its bound 1)"
    )


def test_a_multi_task_run_ends_with_each_domains_fit_and_whether_it_extrapolates():
    """task=multi: after the whole curve's fit, each domain's (the paper fits math and code apart),
    with its own caveat and its own horizon and fall rules' line; a domain whose fit failed prints
    nothing."""
    from scalerl.loop.summary import summary_lines

    def fit(prefix, a, supported, fall, fall_se):
        out = {f"{prefix}ok": 1.0, f"{prefix}A": a, f"{prefix}B": 2.0, f"{prefix}n_points": 12.0}
        out.update(
            {f"{prefix}A_lo": a - 0.05, f"{prefix}A_hi": a + 0.05, f"{prefix}B_lo": 1.5, f"{prefix}B_hi": 2.5}
        )
        out.update({f"{prefix}supported": supported, f"{prefix}reach": 6.0, f"{prefix}more_compute": 1.0})
        out.update({f"{prefix}shape_bias": -0.004, f"{prefix}fall": fall, f"{prefix}fall_se": fall_se})
        return out

    metrics = {**fit("fit/", 0.7, 1.0, 0.02, 1.0), **fit("fit/math/", 0.9, 1.0, 0.01, 0.5)}
    metrics.update(fit("fit/logic/", 0.5, 0.0, 0.2, 5.0))
    metrics.update({"fit/code/ok": 0.0, "fit/code/A": math.nan})
    base = {"steps": 200, "wall_seconds": 90.0, "out_dir": "/o", "run_id": "abc", "tracking_uri": "http://h"}
    lines = summary_lines({**base, "fit": metrics})
    fits = [line for line in lines if line.startswith("scaling fit")]
    assert [line.split(":")[0] for line in fits] == ["scaling fit", "scaling fit, logic", "scaling fit, math"]
    assert fits[1].startswith("scaling fit, logic: A = 0.5 [0.45, 0.55], B = 2 [1.5, 2.5] (90% intervals")
    said = {line.split("'s window")[0]: line for line in lines if "'s window ends at" in line}
    assert sorted(said) == ["the logic fit", "the math fit", "the scaling fit"]
    assert "fell 0.200 inside it, 5.0 se: extrapolation not supported" in said["the logic fit"]
    assert (
        "extrapolation supported" in said["the math fit"]
        and "extrapolation supported" in said["the scaling fit"]
    )
    assert not any("code" in line for line in lines)


def test_fit_caveat_names_the_level_or_why_there_are_no_intervals():
    assert fit_caveat({"fit/A": 0.6, "fit/A_lo": 0.5, "fit/n_points": 9.0}, 0.8) == (
        "(80% intervals of this run's points; a repeat can land outside them: compare seeds)"
    )
    assert fit_caveat({"fit/A": 1.0, "fit/A_lo": math.nan, "fit/n_points": 4.0}, 0.9) == (
        "(no intervals: 4 points after the early cut leave none to estimate them; "
        "A at its bound 1: these points do not determine the ceiling)"
    )
    # a curve through as many points as it has parameters: no ceiling, nothing extrapolated
    assert fit_caveat({"fit/A": 0.55, "fit/A_lo": math.nan, "fit/n_points": 3.0}, 0.9) == (
        "(fitted on 3 points for 3 parameters: nothing is left to check the curve against, so A is not a "
        "measured ceiling and nothing is extrapolated from it)"
    )


def test_a_run_without_a_fit_says_what_it_lacked():
    assert no_fit_line({}, 3).startswith("no scaling fit: 3 held-out evaluations, a fit needs 4")
    assert no_fit_line({"fit/n_points": 2.0}, 5) == (
        "no scaling fit: 2 held-out evaluations at or after the early cut (scaling.min_step), a sigmoid "
        "needs 3 (a smaller scaling.min_step, a larger trainer.total_steps or a smaller eval.every)"
    )
    assert no_fit_line({"fit/n_points": 6.0}, 8) == (
        "no scaling fit: the sigmoid did not fit the 6 points past the early cut (scaling.min_step)"
    )


def test_a_summary_is_written_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"steps": 3})
    write_json(path, {"steps": 4, "fit": {}})
    assert json.loads(path.read_text()) == {"steps": 4, "fit": {}}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_logged_run_says_its_time_so_far_and_left_at_its_own_pace(monkeypatch, capsys):
    """Without a terminal (a sweep's or SLURM's log file) the step lines carry what the bar shows:
    the time since this process's first step and the rest at that pace (a resumed run's earlier
    steps not counted); the last line says none."""
    from scalerl.loop import progress

    clock = iter([1000.0, 1030.0, 1060.0, 1090.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = progress.Progress("log", every=10, total=60, initial=30)  # resumed at step 30
    stats = {"train/reward": 0.5, "perf/tokens_per_s": 100.0}
    for step in (40, 50, 60):
        bar.update(step, stats, 0.4)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[scalerl] step 40 reward=0.500 tokens/s=100 (30 s so far, about 60 s left)",
        "[scalerl] step 50 reward=0.500 tokens/s=100 (60 s so far, about 30 s left)",
        "[scalerl] step 60 reward=0.500 tokens/s=100",
    ]
