"""pass@k (issue #57 item 4): the unbiased estimator, its metrics ``val/pass_at_<k>`` at every
evaluation, and ``scaling.metric``, the metric a run, a sweep and the analysis CLI fit."""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from scalerl.config import compose, typed
from scalerl.config.validate import ConfigError
from scalerl.scaling import FitProtocol, FitProtocolError
from scalerl.scaling.pass_at_k import mean_pass_at_k, metric_k, metric_name, pass_at_k
from scalerl.scaling.synthetic import TrueCurve


# ---------------------------------------------------------------------- the estimator
def brute_force(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def chen(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s numpy form."""
    if n - c < k:
        return 1.0
    return 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            got = pass_at_k(n, c, k)
            assert got == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)
            assert got == pytest.approx(chen(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edge_cases():
    assert pass_at_k(6, 0, 3) == 0.0  # nothing correct
    assert pass_at_k(6, 6, 3) == 1.0  # everything correct
    assert pass_at_k(6, 4, 3) == 1.0  # n - c < k: every 3 of 6 hold a correct one
    assert pass_at_k(6, 3, 6) == 1.0  # k = n: any correct sample
    assert pass_at_k(6, 0, 6) == 0.0
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    # large n stays finite and exact where the binomial coefficients would overflow a float
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-12)
    assert 0.0 < pass_at_k(2000, 1, 1) < 1.0
    # monotone in k and in c
    assert [pass_at_k(8, 2, k) for k in range(1, 9)] == sorted(pass_at_k(8, 2, k) for k in range(1, 9))
    assert [pass_at_k(8, c, 3) for c in range(9)] == sorted(pass_at_k(8, c, 3) for c in range(9))
    for bad in ((6, 2, 0), (6, 2, 7), (6, 7, 2), (6, -1, 2)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_pass_at_1_is_the_fraction_correct_bit_for_bit():
    for n in range(1, 17):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == c / n == sum([1.0] * c + [0.0] * (n - c)) / n
    assert mean_pass_at_k([0, 3, 6], 6, 1) == (0 / 6 + 3 / 6 + 6 / 6) / 3
    assert math.isnan(mean_pass_at_k([], 6, 2))


def test_metric_names():
    assert metric_k("pass_rate") == 1 and metric_k("pass_at_1") == 1 and metric_k("pass_at_16") == 16
    for bad in ("pass_at_0", "pass_at_", "pass_at_02", "pass_at_x", "pass@2", "val/pass_rate", "", None, 2):
        assert metric_k(bad) is None, bad
    assert metric_name(4) == "pass_at_4"


# ---------------------------------------------------------------------- the settings
@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["eval.pass_at_k=[8]"],
            "invalid config value eval.pass_at_k=[8]: must be integers k with 1 <= k <= "
            "eval.samples_per_prompt (6)",
        ),
        (["eval.pass_at_k=[0,2]"], "eval.pass_at_k=[0, 2]: must be integers k with 1 <= k"),
        (
            ["eval.samples_per_prompt=2", "eval.pass_at_k=[1,4]"],
            "eval.pass_at_k=[1, 4]: must be integers k with 1 <= k <= eval.samples_per_prompt (2)",
        ),
        (
            ["scaling.metric=pass_at_2"],
            "invalid config value scaling.metric='pass_at_2': must be pass_rate (a pass@k the evaluation "
            "logs: add its k to eval.pass_at_k, now [])",
        ),
        (
            ["scaling.metric=pass_at_2", "eval.pass_at_k=[1,4]"],
            "scaling.metric='pass_at_2': must be pass_rate, pass_at_1, pass_at_4 (a pass@k",
        ),
        (
            ["scaling.metric=pass@2"],
            "invalid config value scaling.metric='pass@2': must be pass_rate or pass_at_<k> with k an "
            "integer >= 1",
        ),
    ],
)
def test_a_bad_pass_at_k_setting_is_one_line(overrides, expected):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert "\n" not in str(e.value) and expected in str(e.value), str(e.value)


def test_the_defaults_fit_the_pass_rate_and_log_no_pass_at_k():
    cfg = compose([])
    assert list(cfg.eval.pass_at_k) == [] and cfg.scaling.metric == "pass_rate"
    p = FitProtocol.from_config(cfg.scaling)
    assert p == FitProtocol() and p.reward_key == "val/pass_rate"
    assert "of `val/pass_rate` against compute" in p.describe("flops")
    cfg = compose(["eval.pass_at_k=[2,6]", "scaling.metric=pass_at_6"])
    p = FitProtocol.from_config(cfg.scaling)
    assert p.metric == "pass_at_6" and p.reward_key == "val/pass_at_6"
    assert FitProtocol.from_config(p.to_config()) == p
    assert "of `val/pass_at_6` against compute" in p.describe("flops")
    with pytest.raises(FitProtocolError, match=r"^invalid fit setting scaling.metric='pass@2': must be "):
        FitProtocol(metric="pass@2")


# ---------------------------------------------------------------------- the evaluation
class _Generator:
    """Returns, for each prompt, samples whose text is "1" (correct) or "0" from a fixed table."""

    samples_from_trainer_module = False
    splits_work = False

    def __init__(self, correct: dict[int, list[int]]):
        self.correct = correct

    def rng_state(self):
        return None

    def set_rng_state(self, state):
        pass

    def manual_seed(self, seed):
        pass

    def generate(self, prompts, k, *, version):
        from scalerl.generator import Sample

        def sample(p, ok):
            return Sample(p.uid, 0, [1], [2], [0.0], [version], [1], str(ok), False, False, 0)

        return [[sample(p, ok) for ok in self.correct[p.uid][:k]] for p in prompts]


class _Task:
    def score(self, prompt, completion):
        return float(completion == "1")


def _evaluate(correct: dict[int, list[int]], domains: dict[int, str], pass_at_k_list, k: int):
    from scalerl.loop.evaluate import evaluate
    from scalerl.state import RunState
    from scalerl.task.base import Prompt

    cfg = compose([f"eval.samples_per_prompt={k}", f"eval.pass_at_k={pass_at_k_list}", "eval.log_samples=0"])
    OmegaConf.resolve(cfg)
    val = [Prompt(uid, f"q{uid}", "1", difficulty=1 + uid % 2, domain=domains[uid]) for uid in correct]
    o = typed(cfg)
    return evaluate(
        _Task(),
        val,
        _Generator(correct),
        contextlib.nullcontext,
        RunState(),
        None,
        options=o.eval,
        seed=o.seed,
        batch_size=o.trainer.batch_size,
        reward=o.reward,
        length_control=o.length_control,
        verifier_timeout_s=o.task.verifier_timeout_s,
        main=True,
    )


def test_evaluation_logs_pass_at_k_beside_the_pass_rate_and_per_domain():
    # 6 prompts x 4 samples: 0, 1, 2, 4 correct, and per domain
    correct = {
        0: [0, 0, 0, 0],
        1: [1, 0, 0, 0],
        2: [0, 1, 1, 0],
        3: [1, 1, 1, 1],
        4: [0, 0, 0, 1],
        5: [1, 1, 0, 1],
    }
    domains = {0: "math", 1: "math", 2: "math", 3: "code", 4: "code", 5: "code"}
    out = _evaluate(correct, domains, "[1,2,4]", 4)
    counts = {u: sum(v) for u, v in correct.items()}
    assert out["val/pass_at_1"] == out["val/pass_rate"]  # bit for bit
    for d in ("math", "code"):
        assert out[f"val/pass_at_1/{d}"] == out[f"val/pass_rate/{d}"]
    for k in (2, 4):
        want = np.mean([brute_force(4, c, k) for c in counts.values()])
        assert out[f"val/pass_at_{k}"] == pytest.approx(want, abs=1e-12)
        for d in ("math", "code"):
            mine = [brute_force(4, counts[u], k) for u in correct if domains[u] == d]
            assert out[f"val/pass_at_{k}/{d}"] == pytest.approx(np.mean(mine), abs=1e-12)
    assert out["val/pass_at_4"] == 5 / 6  # every prompt but the one with none correct
    assert out["val/pass_at_1"] <= out["val/pass_at_2"] <= out["val/pass_at_4"]
    # no difficulty variants of pass@k, and none at all without eval.pass_at_k
    assert not [k for k in out if k.startswith("val/pass_at_") and "_d" in k.rsplit("/", 1)[-1]]
    plain = _evaluate(correct, {u: "" for u in correct}, "[]", 4)
    assert not [k for k in plain if k.startswith("val/pass_at")]
    assert plain["val/pass_rate"] == out["val/pass_rate"]


def test_the_live_fit_fits_the_metric_the_protocol_names(tmp_path):
    from scalerl.scaling.live import evaluation_fits, fit_metrics

    c = np.linspace(0.0, 6e3, 12)
    low, high = TrueCurve(0.1, 0.5, 1.5, 1e3)(c), TrueCurve(0.3, 0.85, 1.5, 1e3)(c)
    evals = [
        {"step": 2 * i, "flops": float(x), "pass_rate": float(a), "pass_at_4": float(b)}
        for i, (x, a, b) in enumerate(zip(c, low, high))
    ]
    p = FitProtocol(metric="pass_at_4", bootstrap=0, min_step=0)
    got, _ = evaluation_fits(evals, p)
    want = fit_metrics(c, high, p, steps=[e["step"] for e in evals])[1]
    assert got == want and got["fit/A"] == pytest.approx(0.85, abs=0.01)
    assert got["fit/R0"] == pytest.approx(0.3, abs=0.001)  # its R0 is the metric's start
    default, _ = evaluation_fits(evals, FitProtocol(bootstrap=0, min_step=0))
    assert default["fit/A"] == pytest.approx(0.5, abs=0.01)


def test_the_live_fall_rule_counts_the_samples_of_the_fitted_metric():
    """The samples behind one evaluation that a run gives its live fit's fall rule: prompts x samples
    for the pass rate, the prompts alone for a pass@k, whose K samples a prompt make one estimate;
    a task=multi domain's curve, its own held-out prompts' share of them."""
    from types import SimpleNamespace

    from scalerl.config import typed
    from scalerl.loop.run import eval_trials, fall_trials

    config = typed(compose(["eval.num_prompts=8", "eval.samples_per_prompt=4", "eval.pass_at_k=[1,4]"]))
    # task=multi: a domain's curve has its own held-out prompts' share (here 3 math, 5 code)
    val = [SimpleNamespace(domain="math")] * 3 + [SimpleNamespace(domain="code")] * 5
    for metric, want, math_, code in (("pass_rate", 32.0, 12.0, 20.0), ("pass_at_4", 8.0, 3.0, 5.0)):
        run = SimpleNamespace(
            config=config, fit_protocol=FitProtocol(metric=metric), val=val, domains=["math", "code"]
        )
        assert eval_trials(run) == want
        assert (eval_trials(run, "math"), eval_trials(run, "code")) == (math_, code)
        assert fall_trials(run) == {"trials": want, "domain_trials": {"math": math_, "code": code}}


# ---------------------------------------------------------------------- a run
def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(x) and math.isnan(b[k])) if isinstance(x, float) and math.isnan(x) else x == b[k]
        for k, x in a.items()
    )


def test_a_run_logs_pass_at_k_and_fits_the_metric_it_names(tiny_overrides, tmp_path, capsys):
    """6 steps of the embedded model, evaluated at 0, 2, 4, 6 on 8 prompts x 2 samples, fitting
    pass@2: val/pass_at_1 is val/pass_rate, val/pass_at_2 is logged at every evaluation, and the
    run's fit/* (live and final, the summary's) are the fit of val/pass_at_2. The analysis CLI fits
    the same metric to the same numbers."""
    from mlflow.tracking import MlflowClient

    from scalerl.analysis.__main__ import main as analysis_main
    from scalerl.loop import train
    from scalerl.scaling.live import evaluation_fits

    overrides = [
        *tiny_overrides,
        "async_mode=sync",
        "trainer.total_steps=6",
        "eval.pass_at_k=[1,2]",
        "scaling.metric=pass_at_2",
        "scaling.min_step=0",
        "scaling.bootstrap=20",
    ]
    cfg = compose(overrides)
    summary = train(cfg)
    uri = next(o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri="))
    client = MlflowClient(uri)
    rid = summary["run_id"]
    rate, at1, at2 = (_history(client, rid, k) for k in ("val/pass_rate", "val/pass_at_1", "val/pass_at_2"))
    assert [s for s, _ in at2] == [0, 2, 4, 6] and at1 == rate
    assert all(b >= a for (_, a), (_, b) in zip(rate, at2))
    evals = summary["evals"]
    assert [e["pass_at_2"] for e in evals] == [v for _, v in at2]
    assert summary["fit_metric"] == "val/pass_at_2"
    assert (summary["pass_at_2_start"], summary["pass_at_2_final"]) == (at2[0][1], at2[-1][1])
    printed = capsys.readouterr().out
    assert f"held-out val/pass_at_2: {at2[0][1]:.3f} -> {at2[-1][1]:.3f}" in printed

    protocol = FitProtocol.from_config(cfg.scaling)
    # the samples behind one evaluation of pass@2, as the run passes them (the fall rule): the prompts
    want, _ = evaluation_fits(evals, protocol, out_dir=tmp_path / "refit", trials=float(cfg.eval.num_prompts))
    assert _same(summary["fit"], want)
    logged = client.get_run(rid).data.metrics
    assert all(logged[k] == v or (math.isnan(v) and math.isnan(logged[k])) for k, v in want.items()), (
        "the run's fit/* are the fit of val/pass_at_2"
    )
    if any(b > a for (_, a), (_, b) in zip(rate, at2)):  # a fit of the pass rate is another one
        of_rate, _ = evaluation_fits(
            evals, FitProtocol.from_config({**protocol.to_config(), "metric": "pass_rate"})
        )
        assert not _same({k: v for k, v in want.items() if k in of_rate}, of_rate)

    out = tmp_path / "analysis"
    rc = analysis_main(
        ["fit", "--tracking-uri", uri, "--runs", rid, "--metric", "pass_at_2", "--min-step", "0",
         "--bootstrap", "20", "--no-write-back", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert "of `val/pass_at_2` against compute" in (out / "fits.md").read_text()
    row = json.loads((out / "fits.json").read_text())[0]
    assert row["pass_rate_start"] == at2[0][1] and row["pass_rate_final"] == at2[-1][1]
    if want["fit/ok"] == 1.0:
        # the run's fit/* are rounded to what the data resolves (A to 0.001, B to 3 figures)
        assert row["A"] == pytest.approx(want["fit/A"], abs=5e-4)
        assert row["B"] == pytest.approx(want["fit/B"], rel=5e-3)


# ---------------------------------------------------------------------- analysis and sweeps
def _log(client, exp_id: str, name: str, curves: dict[str, np.ndarray], c: np.ndarray, **tags) -> str:
    from mlflow.entities import Metric, Param, RunTag

    r = client.create_run(exp_id, run_name=name, tags={"mlflow.runName": name, **tags})
    ts = int(time.time() * 1000)
    ms = [Metric("compute/flops", float(v), ts, 10 * i) for i, v in enumerate(c)]
    for key, y in curves.items():
        ms += [Metric(key, float(v), ts, 10 * i) for i, v in enumerate(y)]
    params = {"eval.num_prompts": "128", "eval.samples_per_prompt": "4", "seed": "0"}
    client.log_batch(
        r.info.run_id,
        metrics=ms,
        params=[Param(k, v) for k, v in params.items()],
        tags=[RunTag("mlflow.runName", name)],
    )
    client.set_terminated(r.info.run_id)
    return r.info.run_id


def _curves(rng, c):
    """A pass rate climbing to 0.5 and a pass@4 climbing to 0.85 (binomial noise of 512 trials)."""
    low = TrueCurve(0.1, 0.5, 1.5, 1e3)(c)
    high = TrueCurve(0.3, 0.85, 1.5, 1e3)(c)
    return {
        "val/pass_rate": rng.binomial(512, low) / 512,
        "val/pass_at_4": rng.binomial(512, high) / 512,
    }


def test_the_analysis_cli_fits_the_metric_it_is_given(tmp_path, new_store, capsys, refused):
    from mlflow.tracking import MlflowClient

    from scalerl.analysis.__main__ import main

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("pk", artifact_location=str(tmp_path / "artifacts"))
    rng = np.random.default_rng(0)
    c = np.linspace(0.0, 6e3, 31)
    _log(client, exp, "a", _curves(rng, c), c)
    _log(client, exp, "only_rate", {"val/pass_rate": _curves(rng, c)["val/pass_rate"]}, c)
    common = ["fit", "--tracking-uri", uri, "--experiment", "pk", "--bootstrap", "0", "--no-write-back"]

    assert main([*common, "--out", str(tmp_path / "rate")]) == 0
    rows = {r["run_name"]: r for r in json.loads((tmp_path / "rate" / "fits.json").read_text())}
    assert set(rows) == {"a", "only_rate"} and rows["a"]["A"] == pytest.approx(0.5, abs=0.07)
    md = (tmp_path / "rate" / "fits.md").read_text()
    assert "of `val/pass_rate` against compute" in md and "pass rate start → final" in md

    assert main([*common, "--metric", "pass_at_4", "--out", str(tmp_path / "at4")]) == 0
    capsys.readouterr()
    rows = json.loads((tmp_path / "at4" / "fits.json").read_text())
    fitted = {r["run_name"]: r for r in rows if r.get("ok")}
    assert set(fitted) == {"a"} and fitted["a"]["A"] == pytest.approx(0.85, abs=0.07)
    assert fitted["a"]["R0"] == pytest.approx(0.3, abs=0.03)  # the start of pass@4, not of the pass rate
    left = next(r for r in rows if r["run_name"] == "only_rate")
    assert left["left_out"] == "without val/pass_at_4"
    md = (tmp_path / "at4" / "fits.md").read_text()
    assert "of `val/pass_at_4` against compute" in md and "val/pass_at_4 start → final" in md

    refused(main, [*common, "--metric", "pass@4"], "--metric='pass@4': must be pass_rate or pass_at_<k>")
    refused(
        main, [*common, "--metric", "pass_at_2"], "no finished runs with val/pass_at_2 in experiment 'pk'"
    )


def test_a_sweep_fits_the_metric_its_file_sets(tmp_path, new_store, capsys):
    """A sweep whose base sets scaling.metric=pass_at_4: its plan carries the metric, its report fits
    val/pass_at_4 of every run; a variant may not fit another metric than the sweep's."""
    import yaml

    from scalerl.sweep import load_spec, make_plan
    from scalerl.sweep.cli import main
    from scalerl.sweep.spec import SweepError
    from scalerl.sweep.state import client_for, start_parent

    uri = new_store(tmp_path)
    base = [
        "trainer.total_steps=300",
        "eval.samples_per_prompt=4",
        "eval.pass_at_k=[4]",
        "scaling.metric=pass_at_4",
        "scaling.bootstrap=0",
    ]
    f = tmp_path / "pk.yaml"
    variants = {"base": [], "dapo": ["loss=dapo"]}
    f.write_text(
        yaml.safe_dump({"name": "pk", "base": base, "seeds": [0], "baseline": "base", "variants": variants})
    )
    sdir = tmp_path / "out"
    plan = make_plan(load_spec(f), [], sweep_dir=sdir, tracking_uri=uri)
    assert plan.scaling["metric"] == "pass_at_4"
    exp_id, parent = start_parent(plan)
    client = client_for(uri)
    rng = np.random.default_rng(1)
    c = np.linspace(0.0, 6e3, 31)
    for run in plan.runs:
        curves = _curves(rng, c)
        _log(client, exp_id, run.name, curves, c, **{"mlflow.parentRunId": parent, "variant": run.variant})
        Path(run.out_dir).mkdir(parents=True)
        summary = {"steps": run.total_steps, "pass_at_4_start": curves["val/pass_at_4"][0]}
        (Path(run.out_dir) / "summary.json").write_text(json.dumps(summary))
    assert main(["--report", str(f), "--out", str(sdir)]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader((sdir / "report" / "fits.csv").open()))
    assert len(rows) == 2 and all(float(r["A"]) == pytest.approx(0.85, abs=0.07) for r in rows)
    assert "of `val/pass_at_4` against compute" in (sdir / "report" / "fits.md").read_text()

    f.write_text(
        yaml.safe_dump(
            {"name": "pk", "base": base, "variants": {"base": [], "rate": ["scaling.metric=pass_rate"]}}
        )
    )
    with pytest.raises(SweepError, match=r"variant 'rate': scaling.metric=pass_rate: the sweep fits "):
        make_plan(load_spec(f), [], sweep_dir=tmp_path / "o", tracking_uri=uri)
