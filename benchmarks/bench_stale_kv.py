"""What ``generator.stale_kv=recompute`` costs against ``keep``: generation with an in-flight weight
update every N decode steps, the two settings alternated on the same generator, same prompts.

    python benchmarks/bench_stale_kv.py --out /tmp/stale_kv.json                 # tiny, HF and vLLM
    python benchmarks/bench_stale_kv.py --size 135m --generators hf --every 16 64

At every update ``recompute`` prefills each running sequence again (prompt + tokens so far), where
``keep`` goes on over its cache. The update itself loads no weights here (``weight_update`` returns a
new version and the weights stay as they are): loading them costs the same in both settings, so the
difference is the cache's alone. Random weights (``bench_vllm.build``: the embedded default's model
or SmolLM2-135M's architecture), no eos: every sequence samples exactly ``--new-tokens`` tokens in
both settings. Per generator, N and setting, over ``--rounds`` calls: the fastest and the median
wall seconds a call (on a shared machine the fastest is the least disturbed), tokens/s, the
process's CPU seconds a call, the median decode step against the steps an update came before
(within one call, so that the machine's load mostly cancels: the excess of those steps is the
recompute's cost), the updates a call, the extra prefill positions a call (the generators'
``stale_kv_recomputed_tokens``) against the tokens generated and against the prompts' own prefill.
Rounds alternate the order (keep first, then recompute first). Prints the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import common
import torch

common.use_checkout()

from bench_vllm import build, prompts  # noqa: E402


def _updates_every(n: int, updated: list[int] | None = None):
    """A ``weight_update`` that announces a new version before every ``n``-th decode step (appending
    the step's index to ``updated``)."""
    calls = [0]

    def weight_update():
        calls[0] += 1
        if calls[0] > 1 and (calls[0] - 1) % n == 0:
            if updated is not None:
                updated.append(calls[0] - 1)
            return (calls[0] - 1) // n
        return None

    return weight_update


def _call(gen, ps, n: int, every: int) -> dict:
    before = gen.stale_kv_recomputed_tokens
    updated: list[int] = []
    ends: list[float] = []  # when each decode step ended
    t, cpu = time.perf_counter(), time.process_time()
    groups = gen.generate(
        ps,
        n,
        version=0,
        weight_update=_updates_every(every, updated),
        on_step=lambda: ends.append(time.perf_counter()),
    )
    dt, dcpu = time.perf_counter() - t, time.process_time() - cpu
    samples = [s for g in groups for s in g]
    # each step's seconds (the first, the prompts' prefill, left out): those an update came before
    # against the others of the same call, so that a change of the machine's load cancels out
    steps = [b - a for a, b in zip(ends, ends[1:])]
    at_update = [steps[i - 1] for i in updated if 0 < i <= len(steps)]
    others = [x for i, x in enumerate(steps, 1) if i not in set(updated)]
    step_s = statistics.median(others)
    return {
        "s": dt,
        "cpu_s": dcpu,
        "step_s": step_s,
        "update_step_s": statistics.median(at_update) if at_update else 0.0,
        # what the steps an update came before cost beyond an ordinary step, all updates of the call
        "update_excess_s": sum(at_update) - len(at_update) * step_s,
        "tokens": sum(s.num_tokens for s in samples),
        "updates": max(max(s.versions) for s in samples),
        "extra_prefill": gen.stale_kv_recomputed_tokens - before,
    }


def _table(rows: list[dict]) -> str:
    lines = [
        "| generator | N | stale_kv | wall s / call, min (median) | tokens/s (min) | recompute / keep "
        "(min, median) | CPU s / call, min | recompute / keep (CPU min) | decode step ms | step after "
        "an update ms | an update, in decode steps | updates' excess / call | updates / call "
        "| extra prefill tokens / call "
        "| / generated | / prompt prefill |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['generator']} | {r['every']} | {r['stale_kv']} | {r['s_min']:.3f} ({r['s']:.3f}) "
            f"| {r['tokens_per_s']:.0f} | {r['ratio_min']:.2f}, {r['ratio']:.2f} | {r['cpu_min']:.3f} "
            f"| {r['cpu_ratio_min']:.2f} | {r['step_s'] * 1e3:.1f} "
            f"| {r['update_step_s'] * 1e3:.1f} | {r['update_in_steps']:.1f} | {r['update_excess']:.1%} "
            f"| {r['updates']} "
            f"| {r['extra_prefill']} | {r['per_generated']:.2f} | {r['per_prompt_prefill']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generators", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--size", default="tiny", choices=["tiny", "135m"])
    ap.add_argument("--every", type=int, nargs="+", default=[8, 32], help="decode steps between updates")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, help="JSON of every call")
    a = ap.parse_args()

    from scalerl.model.precision import Precision

    result = {
        "date": common.utc_now(),
        "commit": common.commit(),
        "machine": common.machine(),
        "load_start": common.load(),
        "torch_threads": torch.get_num_threads(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "calls": [],
    }
    print(f"# {result['date']}, commit {result['commit']}, {result['machine']}", flush=True)
    print(f"# start: load average {result['load_start']}", flush=True)
    lc = common.length_limit(a.new_tokens)
    model, tok = build(a.size)
    # no eos anywhere: vLLM would stop at the model config's (its generation config), the HF sampler not
    model.config.eos_token_id = None
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
    ps = prompts(model, a.prompts, a.prompt_len)
    prompt_prefill = a.prompts * a.n * a.prompt_len
    rows = []
    for name in a.generators:
        if name == "hf":
            from scalerl.generator.hf import HFGenerator

            gen = HFGenerator(model, tok, Precision(), lc, temperature=1.0, seed=0, stale_kv_samples=0)
        else:
            from scalerl.generator.vllm_gen import VLLMGenerator

            gen = VLLMGenerator(
                model, tok, Precision(), lc, temperature=1.0, seed=0, kv_cache_gib=2.0, stale_kv_samples=0
            )
            gen.drop_model()
        gen.generate(ps, a.n, version=0)  # warm-up
        for every in a.every:
            calls: dict[str, list[dict]] = {"keep": [], "recompute": []}
            for r in range(a.rounds):
                for mode in common.in_turn(("keep", "recompute"), r):
                    gen.stale_kv = mode
                    c = _call(gen, ps, a.n, every)
                    calls[mode].append(c)
                    result["calls"].append(
                        {"generator": name, "every": every, "stale_kv": mode, "round": r, **c}
                    )
                    print(
                        f"{name} N={every} {mode}: {c['s']:.3f} s ({c['cpu_s']:.3f} s CPU), "
                        f"{c['tokens'] / c['s']:.0f} tok/s, "
                        f"{c['updates']} updates, {c['extra_prefill']} extra prefill tokens",
                        flush=True,
                    )
            keep_s = statistics.median(c["s"] for c in calls["keep"])
            keep_min = min(c["s"] for c in calls["keep"])
            keep_cpu_min = min(c["cpu_s"] for c in calls["keep"])
            for mode in ("keep", "recompute"):
                cs = calls[mode]
                s = statistics.median(c["s"] for c in cs)
                s_min, cpu_min = min(c["s"] for c in cs), min(c["cpu_s"] for c in cs)
                excess = statistics.median(c["update_excess_s"] / c["s"] for c in cs)
                extra = int(statistics.median(c["extra_prefill"] for c in cs))
                tokens = cs[0]["tokens"]
                rows.append(
                    {
                        "generator": name,
                        "every": every,
                        "stale_kv": mode,
                        "s": s,
                        "s_min": s_min,
                        "tokens_per_s": tokens / s_min,
                        "ratio": s / keep_s,
                        "ratio_min": s_min / keep_min,
                        "cpu_min": cpu_min,
                        "cpu_ratio_min": cpu_min / keep_cpu_min,
                        "step_s": statistics.median(c["step_s"] for c in cs),
                        "update_step_s": statistics.median(c["update_step_s"] for c in cs),
                        "update_excess": excess,
                        # the step after an update over an ordinary step of the same call
                        "update_in_steps": statistics.median(c["update_step_s"] / c["step_s"] for c in cs),
                        "updates": cs[0]["updates"],
                        "extra_prefill": extra,
                        "per_generated": extra / tokens,
                        "per_prompt_prefill": extra / prompt_prefill,
                    }
                )
        gen.stale_kv = "keep"
    result["load_end"] = common.load()
    result["summary"] = rows
    print(f"# end: load average {result['load_end']}", flush=True)
    print(
        f"\n{a.size} model, {a.prompts} prompts x {a.n} samples, prompts of {a.prompt_len} tokens, "
        f"{a.new_tokens} new tokens a sequence ({prompt_prefill} prompt tokens prefilled a call); "
        "the fastest call of the rounds (the least disturbed by other jobs) and the median; recompute / "
        "keep: the ratio of seconds a call (wall, and the process's CPU seconds); medians over the "
        "rounds of: decode step: the median step of a call without an update before it; step after "
        "an update: the median of those, and over an ordinary step of the same call (what an update "
        "costs in decode steps); updates' excess: what the steps after updates took beyond ordinary "
        "steps, as a share of the call (within a call: the least disturbed by other jobs)\n"
    )
    print(_table(rows))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
