"""The HF generator's decode with the default cache against ``generator.static_cache`` (one CUDA graph
a step on a GPU): speed, and agreement of the two.

    python benchmarks/bench_static_decode.py --device cuda --out /tmp/static.json   # ~1 min on an H100
    python benchmarks/bench_static_decode.py --device cpu --shape tiny               # checks the script

A randomly initialised model of a real shape (no download; ``--shape``, from ``bench_memory.SHAPES``)
decodes ``--prompts`` x ``--samples`` rows from prompts of random lengths (left-padded, as the GSM
prompts are) for ``--new-tokens`` tokens (length control off; a random model rarely samples eos, so
every row runs to the limit: the decode loop's worst case). Per cache: seconds a call (after one
warm-up call that also captures the graph), tokens/s, and, with greedy decoding, the share of tokens
the two caches agree on and the largest log-prob difference on the agreeing prefix; each cache's
log-probs are also checked against one full forward pass of prompt + completion (teacher forcing).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import common
import torch

common.use_checkout()

from bench_memory import SHAPES, shape_cfg  # noqa: E402

from scalerl.generator import HFGenerator  # noqa: E402
from scalerl.model.build import build_model  # noqa: E402
from scalerl.model.precision import Precision  # noqa: E402


@dataclass
class _Prompt:
    uid: int
    prompt_ids: list[int]


class _Tokenizer:
    """What the generator asks of a tokenizer, for a model whose vocabulary has no text: eos and pad
    ids, no ``</think>`` token, and empty texts."""

    eos_token_id, pad_token_id = 1, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2, 3]}

    def batch_decode(self, rows, **kw):
        return ["" for _ in rows]


@dataclass
class _LC:
    name: str = "none"
    max_new_tokens: int = 256


def _model(shape: str, device: torch.device, max_len: int, impl: str = "auto"):
    sh = SHAPES[shape]
    mcfg = shape_cfg(shape, max_len)
    with torch.device(device):
        model = build_model(mcfg, sh["vocab"], seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("bf16", "fp32", device, impl)
    precision.prepare(model)
    return model.eval(), precision, sh["vocab"]


@torch.no_grad()
def _teacher_forced_error(model, precision, samples, temperature: float) -> float:
    err = 0.0
    body = model.get_decoder()
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids], device=next(model.parameters()).device)
        with precision.autocast(model):
            hidden = body(input_ids=ids).last_hidden_state[0]
        p = len(s.prompt_ids)
        logp = precision.log_softmax(precision.logits(model, hidden[p - 1 : -1]), temperature)
        ref = logp.gather(1, ids[0, p:, None]).squeeze(1).float().cpu()
        err = max(err, (torch.tensor(s.logprobs) - ref).abs().max().item())
    return err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--shape", default=None, help="bench_memory.SHAPES (default: smollm2-135m, tiny on a CPU)"
    )
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one static call")
    ap.add_argument(
        "--impl",
        default="auto",
        choices=["auto", "native", "emulated"],
        help="the bf16 body's precision.impl (auto: native on a GPU, emulated on a CPU)",
    )
    ap.add_argument("--out")
    a = ap.parse_args()
    device = torch.device(a.device)
    shape = a.shape or ("smollm2-135m" if device.type == "cuda" else "tiny")
    if device.type == "cpu" and a.shape is None:
        a.prompts, a.samples, a.new_tokens, a.repeats = 4, 2, 16, 1
    g = torch.Generator().manual_seed(0)
    model, precision, vocab = _model(shape, device, 160 + a.new_tokens + 64, a.impl)
    lens = torch.randint(60, 160, (a.prompts,), generator=g).tolist()
    prompt_ids = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lens]
    prompts = [_Prompt(i, ids) for i, ids in enumerate(prompt_ids)]
    lc = _LC(max_new_tokens=a.new_tokens)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "machine": common.machine(),
        "commit": common.commit(),
        "load": common.load(),
        "torch": torch.__version__,
        "shape": shape,
        "rows": a.prompts * a.samples,
        "new_tokens": a.new_tokens,
        "prompt_lengths": [min(lens), max(lens)],
    }
    greedy = {}
    # the static cache twice where the body runs under autocast over fp32 master weights: with its
    # matrix weights cast once per batch (the default) and cast at every step (cast_once=False)
    variants = [("dynamic", False, True), ("static", True, True)]
    if getattr(model, "_scalerl_autocast", None) is not None:
        variants.insert(1, ("static_cast_every_step", True, False))
    for name, static, cast_once in variants:
        gen = HFGenerator(
            model, _Tokenizer(), precision, lc, temperature=1.0, device=device, static_cache=static
        )
        gen.cast_once = cast_once
        t0 = time.time()
        gen.generate(prompts, a.samples, version=0)  # warm-up (and the graph's capture)
        sync()
        first = time.time() - t0
        times = []
        for _ in range(a.repeats):
            sync()
            t0 = time.time()
            groups = gen.generate(prompts, a.samples, version=0)
            sync()
            times.append(time.time() - t0)
        tokens = sum(len(s.completion_ids) for grp in groups for s in grp)
        gen_g = HFGenerator(
            model, _Tokenizer(), precision, lc, temperature=0.0, device=device, static_cache=static
        )
        gen_g.cast_once = cast_once
        greedy[name] = [s for grp in gen_g.generate(prompts, 1, version=0) for s in grp]
        samples = [s for grp in groups for s in grp]
        if static:  # is the graph there, and what do a replay and an eager step cost alone?
            dec = next(iter(gen._static.values()))
            result["graph_captured"] = dec.graph is not None
            print(name, "graph captured:", result["graph_captured"], flush=True)
            if not result["graph_captured"] and device.type == "cuda":
                import traceback

                try:  # why not: the capture again, with its traceback
                    dec._capture(dec._param_ptrs())
                except Exception:
                    traceback.print_exc()
            for what, fn in (
                ("replay", dec.graph.replay if dec.graph is not None else None),
                ("eager", dec._decode_fn),
            ):
                if fn is None:
                    continue
                sync()
                t0 = time.time()
                with torch.no_grad():  # (with grad, the cache's in-place writes would chain the steps)
                    for _ in range(20):
                        fn()
                sync()
                result[f"{name}_{what}_ms"] = round((time.time() - t0) / 20 * 1e3, 2)
        result[name] = {
            "first_call_s": round(first, 3),
            "call_s": [round(t, 3) for t in times],
            "tokens_per_s": round(tokens / min(times)),
            "teacher_forced_max_err": _teacher_forced_error(model, precision, samples[:4], 1.0),
        }
        print(name, json.dumps(result[name]), flush=True)
    agree, total, lp_diff = 0, 0, 0.0
    for d, s in zip(greedy["dynamic"], greedy["static"]):
        n = 0
        while (
            n < min(len(d.completion_ids), len(s.completion_ids))
            and d.completion_ids[n] == s.completion_ids[n]
        ):
            n += 1
        agree += n
        total += len(d.completion_ids)
        if n:
            lp_diff = max(lp_diff, max(abs(x - y) for x, y in zip(d.logprobs[:n], s.logprobs[:n])))
    if a.profile:  # where a static call's time goes, by function (Python's view)
        import cProfile
        import pstats

        gen = HFGenerator(
            model, _Tokenizer(), precision, lc, temperature=1.0, device=device, static_cache=True
        )
        gen.generate(prompts, a.samples, version=0)
        prof = cProfile.Profile()
        prof.enable()
        gen.generate(prompts, a.samples, version=0)
        sync()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    result["greedy_agreeing_prefix_share"] = round(agree / max(total, 1), 4)
    result["greedy_max_logprob_diff_on_prefix"] = lp_diff
    result["speedup"] = round(min(result["dynamic"]["call_s"]) / min(result["static"]["call_s"]), 2)
    if "static_cast_every_step" in result:  # casting once: how much faster, and the same samples?
        every = result["static_cast_every_step"]
        result["cast_once_speedup"] = round(min(every["call_s"]) / min(result["static"]["call_s"]), 3)
        result["cast_once_greedy_identical"] = all(
            a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
            for a, b in zip(greedy["static_cast_every_step"], greedy["static"], strict=True)
        )
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
