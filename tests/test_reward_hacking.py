"""Reward hacking made visible: per-step verifier outcome shares (``verifier/<outcome>``) and the
``health/reward_without_heldout_gain`` flag, on their own and in a real run of task=code."""

from __future__ import annotations

import threading

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf
from parts import scoring_options

from scalerl.config import compose, typed
from scalerl.generator.sample import Sample
from scalerl.loop.health import LOOKBACK, hacking_metrics, outcome_shares
from scalerl.task import CodeTask
from scalerl.task.code import VAL_UID0
from scalerl.task.sandbox import KINDS
from scalerl.task.score import score_groups

ALWAYS_EQUAL = "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n"
EXIT_EARLY = "import os\ndef f(x):\n    os._exit(0)\n"
WRONG = "def f(x): return 0"


def _sample(text: str) -> Sample:
    return Sample(0, 0, [1], [2, 3], [0.0, 0.0], [0, 0], [1, 1], text, False, False, 0)


def _solution(text: str) -> str:
    ys = [int(part.split("=")[1]) for part in text.rstrip(";").split(";")]
    return f"def f(x): return x*{ys[1] - ys[0]}+{ys[0]}"


def test_a_step_s_outcome_shares_come_from_the_real_verifier():
    cfg = compose(["task=code"])
    # 5 s: the loop runs out; the others finish well within it, even on a loaded machine
    task = CodeTask(num_val=16, timeout_s=5.0)
    p = task.val_prompts()[0]
    texts = [_solution(p.text), WRONG, ALWAYS_EQUAL, EXIT_EARLY, "while True: pass", "def f(:"]
    groups = [[_sample(t) for t in texts], [_sample(_solution(p.text)) for _ in range(2)]]
    score_groups(task, [p, p], groups, **scoring_options(typed(cfg)))
    shares = outcome_shares(groups, task.verifier_kinds)
    assert set(shares) == {f"verifier/{k}" for k in ("pass", "wrong", *KINDS, "error")}
    n = 8
    expected = {"pass": 3, "wrong": 1, "result_type": 1, "no_report": 1, "timeout": 1, "syntax": 1}
    assert shares == {k: expected.get(k.split("/")[1], 0) / n for k in shares}
    assert sum(shares.values()) == pytest.approx(1.0)


def _evals(pass_rates: list[float]) -> list[dict]:
    return [{"step": i, "pass_rate": r} for i, r in enumerate(pass_rates)]


def test_the_flag_is_raised_when_reward_rises_alone():
    # steps 1..6; an evaluation after every step
    rising = [0.1, 0.2, 0.4, 0.6, 0.8, 0.9]
    flat = [0.1] * 7
    m = hacking_metrics(rising, _evals(flat))
    j = 6 - LOOKBACK
    assert m["health/train_gain"] == pytest.approx(0.9 - rising[j - 1])
    assert m["health/heldout_gain"] == 0.0 and m["health/reward_without_heldout_gain"] == 1.0
    # the same rise with the held-out pass rate rising too: no flag
    learning = [0.1, 0.15, 0.2, 0.3, 0.35, 0.4, 0.5]
    assert hacking_metrics(rising, _evals(learning))["health/reward_without_heldout_gain"] == 0.0
    # no rise: no flag, whatever the held-out rate does
    assert hacking_metrics([0.5] * 6, _evals([0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0]))[
        "health/reward_without_heldout_gain"
    ] == (0.0)
    # evaluations every 2 steps: each window is the mean of the steps since the evaluation before
    m = hacking_metrics([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], [{"step": s, "pass_rate": 0.3} for s in (0, 2, 4, 6)])
    assert m["health/train_gain"] == pytest.approx(0.9 - 0.1)
    # too early, or steps not recorded (a checkpoint from before the record existed)
    assert hacking_metrics([0.5], _evals([0.1])) == {}
    assert hacking_metrics([], _evals([0.1, 0.2, 0.3])) == {}


CODE_TINY = [
    "task=code",
    "filter.dynamic_sampling=false",  # as conftest's TINY
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "model.warmstart_steps=100",
    "model.warmstart_batch_size=32",
    "task.num_val=8",
    "task.timeout_s=2",
    "trainer.batch_size=16",
    "trainer.generations_per_prompt=4",
    "trainer.total_steps=6",
    "eval.every=1",
    "eval.num_prompts=4",
    "eval.samples_per_prompt=2",
    "checkpoint_every=6",
    "generator.chunk_prompts=4",
    "trainer.threads=1",
    "progress=log",
    "async_mode=sync",
]


@pytest.mark.slow
def test_a_gamed_reward_shows_in_the_run_s_metrics(tmp_path, mlflow_uri):
    """A real task=code run whose training programs are, step by step: the model's own, an
    always-equal object, an early exit, a wrong program, then (a verifier with a hole, simulated)
    reward 1 whatever was written; its held-out programs are scored honestly and are all wrong."""
    from scalerl.loop.run import build, train

    cfg = compose(
        [*CODE_TINY, f"out_dir={tmp_path / 'run'}", f"tracking.uri={mlflow_uri}", "tracking.experiment=hack"]
    )
    OmegaConf.resolve(cfg)
    run = build(cfg)
    real_score, lock = run.task.score, threading.Lock()

    def score(prompt, completion):
        if prompt.uid >= VAL_UID0:
            return real_score(prompt, WRONG)
        with lock:
            step = run.state.step
        if step == 0:
            return real_score(prompt, completion)
        if step >= 4:
            return 1.0  # the hole
        return real_score(prompt, {1: ALWAYS_EQUAL, 2: EXIT_EARLY, 3: WRONG}[step])

    run.task.score = score
    summary = train(cfg, components=run)
    assert summary["steps"] == 6
    client = MlflowClient(mlflow_uri)

    def history(key):
        return {m.step: m.value for m in client.get_metric_history(summary["run_id"], key)}

    outcomes = ("pass", "wrong", *KINDS, "error")
    shares = {k: history(f"verifier/{k}") for k in outcomes}
    for step in range(1, 7):
        assert sum(shares[k][step] for k in outcomes) == pytest.approx(1.0)
    assert shares["result_type"][2] == 1.0 and shares["no_report"][3] == 1.0 and shares["wrong"][4] == 1.0
    assert shares["pass"][5] == shares["pass"][6] == 1.0
    assert history("val/pass_rate") == dict.fromkeys(range(7), 0.0)
    flag = history("health/reward_without_heldout_gain")
    assert flag[6] == 1.0 and flag[5] == 1.0
    assert all(flag[s] == 0.0 for s in (1, 2, 3, 4))  # the reward had not risen yet
    assert history("health/train_gain")[6] == 1.0 and history("health/heldout_gain")[6] == 0.0
    metrics = client.get_run(summary["run_id"]).data.metrics
    assert metrics["data/verifier_result_type"] >= 16 and metrics["data/verifier_no_report"] >= 16
