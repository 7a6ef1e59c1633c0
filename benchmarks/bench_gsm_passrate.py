"""How often SmolLM2-135M-Instruct (``model=smollm2``) solves ``task=gsm`` training problems, per
template: the measurement behind docs/real-model.md's choice of ``task.templates`` / ``task.number_scale``.

    python benchmarks/bench_gsm_passrate.py --number-scale 0.1 --per-template 2 --samples 8 \\
        --temperature 0.6 --out /tmp/passrate.json     # every template: ~11 min on 2 cores
    python benchmarks/bench_gsm_passrate.py --templates 0 3 5 37 38 41 96 --number-scale 0.1 ...

Problems come from :class:`~scalerl.task.GsmTask` (so the same draws, chat-template prompts and
math-verify scorer as training), sampled by a vLLM engine over the converted SmolLM2 folder in one
process (many prompts at once: the engine's start is paid once). ``--dtype bfloat16`` (the default) runs
vLLM's bf16 kernels, several times faster than float32 on a CPU with AMX, close to what training with
``precision=fp32_head`` (the recipe's default: bf16 body, fp32 head) generates with. Prints a per-template table and the overall share of correct samples, and how
many completions write ``\\boxed{}`` (the scorer otherwise takes the last number).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--templates", type=int, nargs="*", default=[], help="template numbers (default: all)")
    ap.add_argument("--number-scale", type=float, default=1.0)
    ap.add_argument("--per-template", type=int, default=1, help="problems drawn per template")
    ap.add_argument("--samples", type=int, default=4, help="samples per problem")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=1234, help="task.seed")
    ap.add_argument(
        "--cache-dir", default=os.environ.get("SCALERL_CACHE", os.path.expanduser("~/.cache/scalerl"))
    )
    ap.add_argument("--out", help="JSON with every completion and its score")
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm
    from transformers import AutoTokenizer

    from scalerl.generator.base import encode_prompt
    from scalerl.model.build import smollm2_folder
    from scalerl.task import GsmTask

    folder = smollm2_folder(args.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    n_templates = len(args.templates) or 100
    task = GsmTask(
        seed=args.seed,
        num_train=args.per_template * n_templates,
        templates=args.templates,
        number_scale=args.number_scale,
    )
    task.use_tokenizer(tokenizer)
    prompts = task.train_prompts()
    llm = vllm.LLM(
        model=str(folder),
        dtype=args.dtype,
        enforce_eager=True,
        seed=0,
        max_model_len=2048,
        kv_cache_memory_bytes=2 * 2**30,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,  # seeded requests on a CPU cannot be partially prefilled
        max_num_batched_tokens=8192,
    )
    params = vllm.SamplingParams(
        n=args.samples, temperature=args.temperature, max_tokens=args.max_new_tokens, seed=args.seed
    )
    print(
        f"# {common.utc_now()}, commit {common.commit()}; {common.machine()}, load {common.load()}",
        flush=True,
    )
    t0 = time.time()
    outs = llm.generate([{"prompt_token_ids": encode_prompt(tokenizer, p)} for p in prompts], params)
    seconds = time.time() - t0
    rows, per = [], defaultdict(list)
    for p, t, o in zip(prompts, task.train_templates, outs):
        scores = [task.score(p, c.text) for c in o.outputs]
        per[t] += scores
        rows.append(
            {
                "template": t,
                "answer": p.answer,
                "completions": [c.text for c in o.outputs],
                "tokens": [len(c.token_ids) for c in o.outputs],
                "scores": scores,
            }
        )
    texts = [c for r in rows for c in r["completions"]]
    tokens = [n for r in rows for n in r["tokens"]]
    print("| template | samples | correct |\n|---|---|---|")
    for t in sorted(per):
        print(f"| {t} | {len(per[t])} | {sum(per[t]) / len(per[t]):.2f} |")
    correct = sum(s for r in rows for s in r["scores"])
    boxed = sum("\\boxed" in c for c in texts)
    print(
        f"\n{len(texts)} samples: {correct / len(texts):.3f} correct; {boxed} write "
        f"\\boxed{{}}; {sum(n >= args.max_new_tokens for n in tokens)} cut at {args.max_new_tokens} tokens; "
        f"{sum(tokens) / seconds:.0f} generated tokens/s over {seconds:.0f} s"
    )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "args": vars(args),
                    "machine": common.machine(),
                    "commit": common.commit(),
                    "seconds": seconds,
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
