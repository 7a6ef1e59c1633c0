"""A prompt's samples reading its keys and values from one slot (``kernels.attention_bf16_shared``)
against each reading its own copy (``kernels.attention_bf16_held``), alternating in one process on
one thread (issue 54: the decode attention streams every slot's cache at every step, and the
prompt's rows are the same bits in each of its samples' slots).

    python benchmarks/bench_shared_prompt.py                          # the default run's settings
    python benchmarks/bench_shared_prompt.py task.min_digits=2 ...    # any overrides (a study's)

Two measurements, each round taking the two in turn (the order alternating), thread CPU time
(``time.thread_time``), medians over ``--rounds``:

* **the loop alone**: the default's decode shape (``trainer.batch_size`` slots, its heads of 32) as
  groups of ``trainer.generations_per_prompt`` slots sharing a prompt of ``--prompt`` positions,
  each slot ``--generated`` positions past it on average (drawn in [0, 2x)); microseconds a call,
  and whether both give the same output bits;
* **a training batch's generation**: a continuous session given one training batch of the task's
  prompts, drained (what ``bench_speed.py`` times as the fused path), with sharing on and off (the
  session's loop factory replaced); CPU seconds, and whether both sampled the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common

common.use_checkout()

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--prompt", type=int, default=8, help="prompt positions in the loop alone")
    ap.add_argument("--generated", type=int, default=14, help="mean positions past the prompt")
    ap.add_argument("override", nargs="*", help="config overrides (default: the default run)")
    a = ap.parse_args()
    torch.set_num_threads(1)

    from scalerl.generator import kernels
    from scalerl.rollout.prompts import PromptSampler

    _, config = common.options([*a.override, "out_dir=/tmp/scalerl-bench-shared-prompt"])
    slots, per_prompt = int(config.trainer.batch_size), int(config.trainer.generations_per_prompt)
    heads = int(config.model.num_heads)
    dim = int(config.model.hidden_size) // heads
    cap = a.prompt + 2 * a.generated + 1
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(slots, heads, cap, dim, generator=g).to(torch.bfloat16) for _ in range(2)]
    lead = (torch.arange(slots) // per_prompt) * per_prompt
    for x in kv:  # each group's prompt rows the same bits in all its slots
        x[:, :, : a.prompt] = x[lead, :, : a.prompt]
    shared = torch.full((slots,), a.prompt)
    pos = shared + torch.randint(0, 2 * a.generated, (slots,), generator=g)
    qkv = torch.randn(slots, 3 * heads * dim, generator=g).to(torch.bfloat16)
    scale = np.float32(dim**-0.5)
    held, share = kernels.attention_bf16_held(), kernels.attention_bf16_shared()

    def loop(name: str, out) -> None:
        args = (kernels.bits16(qkv), kernels.bits16(kv[0]), kernels.bits16(kv[1]), pos.numpy())
        if name == "own":
            held(*args, kernels.bits16(out), scale)
        else:
            share(*args, lead.numpy(), shared.numpy(), kernels.bits16(out), scale)

    outs = {n: torch.empty(slots, heads * dim, dtype=torch.bfloat16) for n in ("shared", "own")}
    for name, out in outs.items():
        loop(name, out)
    same_bits = torch.equal(outs["shared"].view(torch.int16), outs["own"].view(torch.int16))

    task = common.task(config)
    model, tok, prec = common.policy(config, task, torch.device("cpu"), trained=False)
    prompts = PromptSampler(task.train_prompts(), seed=0).next(slots // per_prompt)
    gen = common.generator(config, model, tok, prec, seed=0)
    factory = kernels.attention_bf16_shared

    def batch(name: str) -> tuple[float, list]:
        kernels.attention_bf16_shared = factory if name == "shared" else (lambda: None)
        try:
            gen.manual_seed(0)
            sess = gen.session(rows=slots)
            sess.add(prompts, per_prompt, tag=0)
            c = time.thread_time()
            done = sess.drain()
            cpu = time.thread_time() - c
            assert sess.lean is not None and sess.lean.kv_dtype() == torch.bfloat16
        finally:
            kernels.attention_bf16_shared = factory
        return cpu, [s.completion_ids for grp in done[0][1] for s in grp]

    tokens = {name: batch(name)[1] for name in outs}  # warm-up
    loop_us: dict[str, list[float]] = {k: [] for k in outs}
    batch_s: dict[str, list[float]] = {k: [] for k in outs}
    for r in range(a.rounds):
        for name in common.in_turn(list(outs), r):
            c = time.thread_time()
            for _ in range(a.calls):
                loop(name, outs[name])
            loop_us[name].append(1e6 * (time.thread_time() - c) / a.calls)
            batch_s[name].append(batch(name)[0])

    print(f"# a prompt's rows read once a group: {common.utc_now()}, {common.commit()}")
    print(
        f"machine: {common.machine()}; load {common.load()}; one torch thread; {a.rounds} rounds alternated"
    )
    print(
        f"config: default{' ' + ' '.join(a.override) if a.override else ''}; loop: {slots} slots in groups of "
        f"{per_prompt}, {heads} heads x {dim}, prompt {a.prompt} positions, {a.generated} past it on average; "
        f"same output bits: {same_bits}; the batch's sampled tokens the same: {tokens['shared'] == tokens['own']}\n"
    )
    print(
        "| prompt rows read | loop us / call (median; rounds) | CPU s / training batch's generation (median; rounds) |"
    )
    print("|---|---|---|")
    for name in outs:
        print(
            f"| {'once a group' if name == 'shared' else 'once a sample'} "
            f"| {statistics.median(loop_us[name]):.0f} ({', '.join(f'{x:.0f}' for x in loop_us[name])}) "
            f"| {statistics.median(batch_s[name]):.3f} ({', '.join(f'{x:.3f}' for x in batch_s[name])}) |"
        )
    ratio_loop = statistics.median(o / s for o, s in zip(loop_us["own"], loop_us["shared"], strict=True))
    ratio_batch = statistics.median(o / s for o, s in zip(batch_s["own"], batch_s["shared"], strict=True))
    print(f"\nown / shared, median of the rounds' ratios: loop {ratio_loop:.2f}x, batch {ratio_batch:.2f}x")
    print(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()
