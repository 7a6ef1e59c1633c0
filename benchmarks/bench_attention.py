"""The lean decode's compiled attention, this checkout's against another's, alternating in one process
(issue 54: the loop that is a quarter of the default run's engine).

    python benchmarks/bench_attention.py --against /tmp/old-checkout      # about 2 minutes
    python benchmarks/bench_attention.py --against /tmp/old-checkout --held   # the bf16-held cache

Two measurements, each round taking the two kernels in turn (the order alternating), one torch
thread, the thread's CPU time (``time.thread_time``: on a shared machine the other load is not
counted):

* **the loop alone**: ``kernels.attention_bf16()`` (``--held``: ``kernels.attention_bf16_held()``,
  the loop over a cache held as bf16, which the default run's decode uses where its linear layers
  run as bf16 GEMMs and the head dim is 32) over the default run's decode shape (a
  training batch's slots, the default model's heads and head dim, the buffers' capacity of prompt
  plus ``max_new_tokens``), every slot at a position drawn in [15, 85] (prompts of about 15 tokens
  plus the generated ones), bf16 inputs; ``--calls`` calls a round; microseconds per call;
* **a training batch's generation**: what ``bench_speed.py`` calls the fused path (the default
  policy, a session of one training batch drained), with the other checkout's loop put in place of
  this one's (``kernels._attend16``, ``--held``: ``kernels._attend16_held16``; the session takes
  whichever its cache calls for); CPU seconds per batch, and whether both sampled the same tokens.

The two loops' outputs over the same inputs are compared too: the share of bf16 outputs whose bits
differ and the largest difference. Medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import common

common.use_checkout()

import numpy as np  # noqa: E402
import torch  # noqa: E402


def other_kernels(checkout: Path):
    """The other checkout's ``scalerl/generator/kernels.py`` as a module of its own."""
    path = checkout / "src" / "scalerl" / "generator" / "kernels.py"
    spec = importlib.util.spec_from_file_location("other_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", type=Path, required=True, help="the other checkout")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--held", action="store_true", help="the loop over a cache held as bf16")
    a = ap.parse_args()
    torch.set_num_threads(1)

    from scalerl.generator import kernels
    from scalerl.rollout.prompts import PromptSampler

    other = other_kernels(a.against)
    factory = "attention_bf16_held" if a.held else "attention_bf16"
    loops = {"this": getattr(kernels, factory)(), "other": getattr(other, factory)()}

    _, config = common.options(["out_dir=/tmp/scalerl-bench-attention"])
    slots = int(config.trainer.batch_size)
    heads = int(config.model.num_heads)
    dim = int(config.model.hidden_size) // heads
    cap = 16 + int(config.length_control.max_new_tokens) + int(config.length_control.answer_budget)
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(slots, heads, cap, dim, generator=g).to(torch.bfloat16)
    cache = kernels.bits16(kv) if a.held else kv.float().numpy()
    qkv = torch.randn(slots, 3 * heads * dim, generator=g).to(torch.bfloat16)
    pos = torch.randint(15, 86, (slots,), generator=g).numpy()
    scale = np.float32(dim**-0.5)

    def call(loop, out) -> None:
        loop(kernels.bits16(qkv), cache, cache, pos, kernels.bits16(out), scale)

    outs = {}
    for name, loop in loops.items():  # compiled (or loaded from numba's cache) before timing
        outs[name] = torch.empty(slots, heads * dim, dtype=torch.bfloat16)
        call(loop, outs[name])
    differ = float((outs["this"].view(torch.int16) != outs["other"].view(torch.int16)).float().mean())
    largest = float((outs["this"].float() - outs["other"].float()).abs().max())

    task = common.task(config)
    model, tok, prec = common.policy(config, task, torch.device("cpu"), trained=False)
    per_prompt = int(config.trainer.generations_per_prompt)
    prompts = PromptSampler(task.train_prompts(), seed=0).next(slots // per_prompt)
    gen = common.generator(config, model, tok, prec, seed=0)
    fn = "_attend16_held16" if a.held else "_attend16"
    own = getattr(kernels, fn)

    def batch(name: str) -> tuple[float, list]:
        setattr(kernels, fn, own if name == "this" else getattr(other, fn))
        try:
            gen.manual_seed(0)
            sess = gen.session(rows=slots)
            sess.add(prompts, per_prompt, tag=0)
            c = time.thread_time()
            done = sess.drain()
            cpu = time.thread_time() - c
            assert sess.lean is not None and sess.lean.fused_attention() is not None
        finally:
            setattr(kernels, fn, own)
        return cpu, [s.completion_ids for grp in done[0][1] for s in grp]

    tokens = {name: batch(name)[1] for name in loops}  # warm-up
    loop_us: dict[str, list[float]] = {k: [] for k in loops}
    batch_s: dict[str, list[float]] = {k: [] for k in loops}
    for r in range(a.rounds):
        for name in common.in_turn(list(loops), r):
            out = torch.empty(slots, heads * dim, dtype=torch.bfloat16)
            c = time.thread_time()
            for _ in range(a.calls):
                call(loops[name], out)
            loop_us[name].append(1e6 * (time.thread_time() - c) / a.calls)
            batch_s[name].append(batch(name)[0])

    print(
        f"# decode attention: {common.utc_now()}, this {common.commit()}, other {common.commit(root=a.against)}"
    )
    print(
        f"machine: {common.machine()}; load {common.load()}; one torch thread; {a.rounds} rounds alternated\n"
    )
    print(
        f"loop: kernels.{factory}; shape: {slots} slots x {heads} heads x head dim {dim}, capacity {cap}, "
        "positions 15-85; "
        f"outputs differing in bits: {differ:.2%}, largest difference {largest:.3g}; "
        f"the batch's sampled tokens the same: {tokens['this'] == tokens['other']}\n"
    )
    print("| loop | us / call (median; rounds) | CPU s / training batch's generation (median; rounds) |")
    print("|---|---|---|")
    for name in loops:
        print(
            f"| {name} | {statistics.median(loop_us[name]):.0f} ({', '.join(f'{x:.0f}' for x in loop_us[name])}) "
            f"| {statistics.median(batch_s[name]):.3f} ({', '.join(f'{x:.3f}' for x in batch_s[name])}) |"
        )
    ratio_loop = statistics.median(o / t for o, t in zip(loop_us["other"], loop_us["this"], strict=True))
    ratio_batch = statistics.median(o / t for o, t in zip(batch_s["other"], batch_s["this"], strict=True))
    print(f"\nother / this, median of the rounds' ratios: loop {ratio_loop:.2f}x, batch {ratio_batch:.2f}x")
    print(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()
