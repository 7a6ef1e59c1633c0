"""Held-out evaluation: pass rate over K samples per validation prompt at the training temperature,
and pass@k from the same samples for each k of ``eval.pass_at_k``."""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from scalerl.loop.batch import mean
from scalerl.model.kv_cache import kv_bytes_per_row
from scalerl.scaling.pass_at_k import metric_name, pass_at_k
from scalerl.state import RunState
from scalerl.task.score import score_groups

if TYPE_CHECKING:
    from scalerl.config.groups.reward import RewardScale
    from scalerl.config.options import Option
    from scalerl.config.schema import EvalConfig
    from scalerl.loop.components import Components


@torch.no_grad()
def evaluate(
    task,
    val,
    generator,
    gathered,
    state: RunState,
    tracker,
    *,
    options: EvalConfig,
    seed: int,
    batch_size: int,
    reward: RewardScale,
    length_control: Option,
    verifier_timeout_s: float,
    main: bool,
) -> dict[str, float]:
    """``val/*`` metrics at ``state.step`` (rank 0; other ranks return {}), as the ``eval`` section
    (``options``) asks. Draws its own samples, seeded by the run's ``seed`` and the step, and leaves
    the generator's training stream where it was; ``batch_size``: the trainer's (a training batch's
    rows per decode, or more: :meth:`EvalConfig.decode_prompts`); ``reward``, ``length_control`` and
    ``verifier_timeout_s``: how the samples are scored (:func:`~scalerl.task.score.score_groups`)."""
    K = int(options.samples_per_prompt)
    if not main:  # several trainer processes: rank 0 evaluates; under ZeRO-3 the gather is
        if generator.samples_from_trainer_module:  # collective, so every rank enters it
            with gathered():
                pass
        return {}
    rng = generator.rng_state()
    generator.manual_seed(seed * 1_000_003 + state.step)
    # a generator over the trainer's module needs it whole (ZeRO-3); engines elsewhere do not
    whole = gathered() if generator.samples_from_trainer_module else contextlib.nullcontext()
    with whole:
        groups = []
        bs = _decode_prompts(generator, options, batch_size, len(val))
        for i in range(0, len(val), bs):
            groups.extend(generator.generate(val[i : i + bs], K, version=state.step))
    generator.set_rng_state(rng)
    state.count_verifier(
        score_groups(
            task,
            val,
            groups,
            reward=reward,
            length_control=length_control,
            verifier_timeout_s=verifier_timeout_s,
        )
    )
    per_prompt = {p.uid: sum(s.correct for s in g) / K for p, g in zip(val, groups)}
    out = {"val/pass_rate": sum(per_prompt.values()) / len(per_prompt)}
    # pass@k: a sample counts as solved as the verifier's "pass" does (score > 0; scores are 1/0)
    solved = {p.uid: sum(s.correct > 0 for s in g) for p, g in zip(val, groups)}
    at_k = {k: {u: pass_at_k(K, c, k) for u, c in solved.items()} for k in sorted(set(options.pass_at_k))}
    for k, est in at_k.items():  # summed as val/pass_rate is: pass@1 is it bit for bit
        out[f"val/{metric_name(k)}"] = sum(est.values()) / len(est)
    by_domain: dict[str, list] = defaultdict(list)
    for p in val:
        by_domain[p.domain].append(p)
    for domain, prompts in sorted(by_domain.items()):
        # task=multi: val/pass_rate/<domain> and val/pass_rate/<domain>_d<difficulty>; else val/pass_rate_d<d>
        name = f"val/pass_rate/{domain}" if domain else "val/pass_rate"
        if domain:
            out[name] = mean(per_prompt[p.uid] for p in prompts)
            for k, est in at_k.items():  # val/pass_at_<k>/<domain>
                out[f"val/{metric_name(k)}/{domain}"] = mean(est[p.uid] for p in prompts)
        by_diff: dict[int, list[float]] = defaultdict(list)
        for p in prompts:
            by_diff[p.difficulty].append(per_prompt[p.uid])
        for d, v in sorted(by_diff.items()):
            if len(by_diff) > 1:
                out[f"{name}_d{d}"] = sum(v) / len(v)
    if state.step == 0 and not state.step0_solved:
        state.step0_solved = per_prompt
    unsolved = [u for u, r in state.step0_solved.items() if r == 0]
    if unsolved:
        out["val/pass_rate_unsolved_at_start"] = sum(per_prompt.get(u, 0.0) for u in unsolved) / len(unsolved)
    out["val/truncation_rate"] = mean(s.truncated for g in groups for s in g)
    out["val/response_length"] = mean(s.num_tokens for g in groups for s in g)
    if options.log_samples:
        lines = []
        for p, g in zip(val, groups):
            for s in g:
                if len(lines) >= options.log_samples:
                    break
                sample = {
                    "prompt": p.text,
                    "output": s.text,
                    "answer": p.answer,
                    "reward": s.reward,
                    "versions": sorted(set(s.versions) - {-1}),
                    "interrupted": s.interrupted,
                    "truncated": s.truncated,
                }
                lines.append(json.dumps(sample))
        tracker.log_artifact_text(f"samples/step_{state.step:06d}.jsonl", "\n".join(lines) + "\n")
    return out


def _decode_prompts(generator, options: EvalConfig, batch_size: int, n_val: int) -> int:
    """Held-out prompts a decode batch takes: all of them for engines in other processes (they
    split the prompts), else ``eval.batch_prompts`` or the KV budget's rule over the generator's
    model (:meth:`EvalConfig.decode_prompts`)."""
    if getattr(generator, "splits_work", False):
        return n_val
    model_config = getattr(getattr(generator, "model", None), "config", None)
    row_bytes = kv_bytes_per_row(model_config) if model_config is not None else None
    return options.decode_prompts(batch_size, n_val, row_bytes)


def evaluate_run(run: Components) -> dict[str, float]:
    """:func:`evaluate` over a built run's parts, with the run's eval, reward and length-control
    options: the loop's held-out evaluation (tests and benchmarks evaluate a run the same way)."""
    c = run.config
    return evaluate(
        run.task,
        run.val,
        run.generator,
        run.trainer.gathered,
        run.state,
        run.tracker,
        options=c.eval,
        seed=c.seed,
        batch_size=c.trainer.batch_size,
        reward=c.reward,
        length_control=c.length_control,
        verifier_timeout_s=c.task.verifier_timeout_s,
        main=run.is_main,
    )
