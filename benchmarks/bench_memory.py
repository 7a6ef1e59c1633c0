"""Peak process memory of a trainer step against model size, tokens per micro-batch and vocabulary,
with the LM head chunked (``trainer.logits_chunk_tokens``) or not and activation checkpointing on or off.

    python benchmarks/bench_memory.py --suite tiny --out /tmp/mem_tiny.json      # ~5 min on 2 cores
    python benchmarks/bench_memory.py --suite smollm2 --out /tmp/mem_135m.json   # ~15 min on 2 idle cores

Each configuration runs in a fresh process (``--child``), which reads its resident memory from
``/proc/self/status`` and resets the high-water mark (``/proc/self/clear_refs``) between phases:

* ``base``: Python, torch, transformers and scalerl imported;
* ``weights``: the model loaded (fp32) and prepared for the precision policy (``precision=fp32_head``
  as the recipe's default: bf16 body, emulated on CPU, fp32 head);
* ``optimizer``: what one small warm-up step leaves (AdamW's two moments and the gradients);
* ``step peak``: the high-water mark over one optimiser step on a batch shaped like docs/real-model.md's
  real-model command (prompts x samples, micro-batches of one group each, completions of the given
  length, a shared prompt per group), and ``transient`` = step peak - resident memory before the step
  (activations, logits and their gradients, at most one micro-batch's at a time).

The ``logits`` column is the size of one [target positions of a micro-batch, vocabulary] fp32
tensor, what the unchunked head holds several copies of; the difference between chunked and
unchunked peaks is what chunking saves, the difference with and without activation checkpointing
what the blocks' stored activations cost. Memory figures are in MB (10^6 bytes); the glibc
allocator keeps some freed memory, so they are what the process really held.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SMOLLM2_PROMPT = 190  # tokens: a GSM problem in SmolLM2's chat template with the system prompt (174-214)


def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss() -> float:
    return _status("VmRSS")


def peak() -> float:
    return _status("VmHWM")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def synthetic_batch(groups: int, per: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    """``groups`` prompts of ``prompt`` tokens, each with ``per`` completions: three quarters of the
    full ``completion`` length (cut at the limit, as most were in docs/real-model.md's run), the rest
    shorter; random token ids, behaviour log-probs and advantages."""
    import torch

    from scalerl.trainer import TrainBatch

    g = torch.Generator().manual_seed(seed)
    n, length = groups * per, prompt + completion
    ids = torch.zeros(n, length, dtype=torch.long)
    mask = torch.zeros(n, length - 1)
    for gi in range(groups):
        p_ids = torch.randint(2, vocab, (prompt,), generator=g)
        for j in range(per):
            r = gi * per + j
            c = completion if j < (3 * per) // 4 else int(completion * (0.6 + 0.1 * (j % 4)))
            ids[r, :prompt] = p_ids
            ids[r, prompt : prompt + c] = torch.randint(2, vocab, (c,), generator=g)
            mask[r, prompt - 1 : prompt - 1 + c] = 1.0
    return TrainBatch(
        input_ids=ids,
        mask=mask,
        gen_logp=-torch.rand(n, length - 1, generator=g) * mask * 3,
        versions=torch.zeros(n, length - 1, dtype=torch.long),
        advantages=torch.randn(n, generator=g),
        group_ids=torch.arange(groups).repeat_interleave(per),
        start=prompt - 1,
    )


def child(spec: dict) -> dict:
    """One configuration, measured in this process."""
    import torch

    torch.set_num_threads(spec.get("threads", 2))
    from omegaconf import OmegaConf

    from scalerl.config import compose
    from scalerl.model.build import build_model, smollm2_folder
    from scalerl.model.precision import Precision
    from scalerl.trainer import make_trainer

    out: dict = {"spec": spec, "base": rss()}
    if spec["model"] == "smollm2":
        from transformers import AutoModelForCausalLM

        folder = smollm2_folder(os.environ.get("SCALERL_CACHE", os.path.expanduser("~/.cache/scalerl")))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        h = spec["hidden"]
        mcfg = OmegaConf.create(
            dict(
                arch="llama",
                hidden_size=h,
                num_layers=spec["layers"],
                num_heads=h // 64,
                num_kv_heads=h // 64,
                intermediate_size=h * 8 // 3,
                max_position_embeddings=spec["prompt"] + spec["completion"] + 8,
                tie_word_embeddings=True,
            )
        )
        model = build_model(mcfg, spec["vocab"], seed=0, pad_token_id=0, eos_token_id=1)
    vocab = model.get_output_embeddings().weight.shape[0]
    body, head = spec.get("precision", ("bf16", "fp32"))
    precision = Precision.for_device(body, head, "cpu")
    precision.prepare(model)
    out["params"] = sum(p.numel() for p in model.parameters())
    out["vocab"] = vocab
    out["after_weights"] = rss()
    per = spec["per_group"]
    cfg = compose(
        [
            f"trainer.batch_size={spec['groups'] * per}",
            f"trainer.generations_per_prompt={per}",
            f"trainer.micro_batch_size={spec['micro_batch_size']}",
            f"trainer.logits_chunk_tokens={spec['chunk']}",
            f"trainer.activation_checkpointing={str(spec['ckpt']).lower()}",
            "trainer.lr=2e-5",
            "trainer.warmup_steps=0",
        ]
    )
    trainer = make_trainer(cfg, model, precision, temperature=0.6, device=torch.device("cpu"))
    trainer.step(synthetic_batch(1, per, 4, 4, vocab, seed=1))  # AdamW's moments and the gradients
    out["after_optimizer"] = rss()
    batch = synthetic_batch(spec["groups"], per, spec["prompt"], spec["completion"], vocab)
    reset_peak()
    before = rss()
    t0 = time.time()
    stats = trainer.step(batch)
    out["step_seconds"] = time.time() - t0
    out["step_peak"] = peak()
    out["before_step"] = before
    out["loss"] = stats.get("train/loss")
    positions = per * (spec["prompt"] + spec["completion"] - 1 - (spec["prompt"] - 1))
    out["positions_per_micro_batch"] = positions
    out["logits_mb"] = positions * vocab * 4 / 1e6
    return out


def suite(name: str) -> list[dict]:
    if name == "tiny":
        base = dict(
            model="tiny",
            hidden=256,
            layers=4,
            groups=2,
            per_group=8,
            micro_batch_size=8,
            prompt=32,
            ckpt=False,
        )
        return [
            {**base, "vocab": v, "completion": c, "chunk": k}
            for c in (128, 512)
            for v in (8192, 65536)
            for k in (0, 256)
        ]
    if name == "smollm2":
        # one group of 8 = one micro-batch of the README command (trainer.micro_batch_size=8): its
        # peak is the step's, as every micro-batch of a step is the same size (4 take 4x as long)
        base = dict(
            model="smollm2",
            groups=1,
            per_group=8,
            micro_batch_size=8,
            prompt=SMOLLM2_PROMPT,
            completion=256,
        )
        return [
            {**base, "chunk": 1024, "ckpt": False},
            {**base, "chunk": 1024, "ckpt": True},
            {**base, "chunk": 256, "ckpt": True},
            {**base, "chunk": 0, "ckpt": False},
        ]
    raise SystemExit(f"--suite {name!r}: one of tiny, smollm2")


def table(rows: list[dict]) -> str:
    head = (
        "| model | params | vocab | positions / micro-batch | logits (one copy) | chunk | act. ckpt | base "
        "| weights | optimizer + grads | step peak | transient | step s |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        s = r["spec"]
        lines.append(
            f"| {s['model']} | {r['params'] / 1e6:.1f}M | {r['vocab']} | {r['positions_per_micro_batch']} "
            f"| {r['logits_mb']:.0f} | {s['chunk'] or 'off'} | {'on' if s['ckpt'] else 'off'} | {r['base']:.0f} "
            f"| {r['after_weights'] - r['base']:.0f} | {r['after_optimizer'] - r['after_weights']:.0f} "
            f"| {r['step_peak']:.0f} | {r['step_peak'] - r['before_step']:.0f} | {r['step_seconds']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="tiny", help="tiny (vocabulary x tokens sweep) or smollm2 (135M)")
    ap.add_argument("--out", help="JSON with every measurement")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    rows = []
    for spec in suite(args.suite):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            print(f"failed: {spec}\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
