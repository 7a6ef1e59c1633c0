"""Generation speed of the default run against its counted-FLOP limit (issue 54): today's decode
path (the slot cache through transformers' modules) against the lean path
(``scalerl.generator.lean``) with torch's attention ops and with the compiled decode attention
(``scalerl.generator.kernels``), alternating in one process, and the machine's fp32 matmul rate
measured in the same run.

    python benchmarks/bench_speed.py            # about 2 minutes on 2 cores

The work: what the default run's engine does each step (``python train.py``: pipeline_rl, one
engine, continuous generation, ``max_running`` 0 = one training batch): a session of
``trainer.batch_size`` slots given one training batch of prompts (``batch_size /
generations_per_prompt`` prompts x ``generations_per_prompt`` samples) of the default task, drained,
from the warm-started default model (``load_policy``, cached) under the default precision
(``fp32_head``: emulated bf16 body on a CPU), ``--threads`` torch threads (an engine's share of 2
cores). Per path and round (the order alternating): wall seconds per batch (= per training step's
generation), decode steps, generated tokens, tokens/s and seconds per decode step; medians over
``--rounds``.

The limit: the project counts ``2 x non-embedding parameters`` FLOPs per generated token
(``loop/accounting.py``); divided by the fp32 matmul rate of ``--mm``-square matrices on the same
threads (measured before each round, median), it is the time a step's generation would take at
that rate. ``x limit`` = measured / limit (the issue's goal: within 3x). Times are the thread's CPU
seconds (``time.thread_time``: on a shared machine wall time counts the other load; with one
torch thread the thread's CPU time is the work done), wall seconds beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common

common.use_checkout()

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mm", type=int, default=2048, help="matmul size for the fp32 rate")
    ap.add_argument("override", nargs="*", help="config overrides (default: the default run)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from scalerl.model.build import num_params
    from scalerl.rollout.prompts import PromptSampler

    _, config = common.options([*a.override, "out_dir=/tmp/scalerl-bench-speed"])
    task = common.task(config)
    model, tok, prec = common.policy(config, task, torch.device("cpu"), trained=False)
    n_params = num_params(model, exclude_embeddings=True)
    per_prompt = int(config.trainer.generations_per_prompt)
    rows = int(config.trainer.batch_size)
    prompts = PromptSampler(task.train_prompts(), seed=0).next(rows // per_prompt)
    gens = {}
    # today: the slot cache through transformers' modules; lean: the forward over the weights with
    # torch's attention ops; fused: the same with the compiled decode attention
    # (scalerl.generator.kernels, what the lean path uses by default on one thread)
    for name, lean in (("today", False), ("lean", True), ("fused", True)):
        g = common.generator(config, model, tok, prec, seed=0)
        g.lean = lean
        gens[name] = g

    def run(gen) -> dict:
        gen.manual_seed(0)
        sess = gen.session(rows=rows)
        sess.add(prompts, per_prompt, tag=0)
        t, c = time.perf_counter(), time.thread_time()
        done = sess.drain()
        wall, cpu = time.perf_counter() - t, time.thread_time() - c
        tokens = sum(len(s.completion_ids) for g in done[0][1] for s in g)
        return {
            "wall": wall,
            "cpu": cpu,
            "steps": sess.steps,
            "tokens": tokens,
            "lean": sess.lean is not None,
            "fused": sess.lean is not None and sess.lean.fused_attention() is not None,
        }

    for name, g in gens.items():  # warm-up (first-call allocations, the kernel's compilation)
        run(g)
        if name == "lean":
            g._lean.use_kernel = False
    res: dict[str, list[dict]] = {k: [] for k in gens}
    rates = []
    for r in range(a.rounds):
        rates.append(common.matmul_rate(a.mm))
        for name in common.in_turn(list(gens), r):
            res[name].append(run(gens[name]))
    rate = statistics.median(rates)

    print(f"# generation speed: {common.utc_now()}, commit {common.commit()}")
    print(f"machine: {common.machine()}; load {common.load()}; torch threads {a.threads}")
    print(
        f"config: default{' ' + ' '.join(a.override) if a.override else ''}; {len(prompts)} prompts x "
        f"{per_prompt} samples a step; arch {config.model.arch}, {n_params} non-embedding parameters; "
        f"precision body {prec.body} ({prec.impl}), head {prec.head}"
    )
    print(
        f"fp32 matmul {a.mm}^2: {rate / 1e9:.1f} GFLOP/s (median of {len(rates)}: "
        f"{', '.join(f'{x / 1e9:.1f}' for x in rates)})\n"
    )
    print(
        "| path | CPU s / step | wall s / step | decode steps | tokens | tokens/s (CPU) | CPU ms / decode step "
        "| counted GFLOP / step | limit s / step | x limit (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = {}
    for name, rs in res.items():
        assert all(x["lean"] == (name != "today") and x["fused"] == (name == "fused") for x in rs)
        cpu = statistics.median(x["cpu"] for x in rs)
        wall = statistics.median(x["wall"] for x in rs)
        tokens = statistics.median(x["tokens"] for x in rs)
        steps = statistics.median(x["steps"] for x in rs)
        flops = 2.0 * n_params * tokens
        limit = flops / rate
        med[name] = (cpu, wall)
        each = ", ".join(f"{x['cpu']:.2f}" for x in rs)
        print(
            f"| {name} | {cpu:.3f} ({each}) | {wall:.3f} | {steps:.0f} | {tokens:.0f} | {tokens / cpu:.0f} | "
            f"{1e3 * cpu / steps:.2f} | {flops / 1e9:.2f} | {limit:.4f} | {cpu / limit:.1f}x |"
        )
    print()
    for a_, b_ in (("lean", "today"), ("fused", "today"), ("fused", "lean")):
        print(
            f"{a_} vs {b_}: {med[b_][0] / med[a_][0]:.2f}x less CPU time, "
            f"{med[b_][1] / med[a_][1]:.2f}x less wall time a step (medians)"
        )
    print(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()
