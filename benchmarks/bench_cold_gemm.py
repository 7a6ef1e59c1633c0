"""Where the lean decode's bf16 GEMMs lose their time (issue 54): each linear layer of the default
model at a decode step's shape, timed alone (the same call repeated: its weights, code and oneDNN's
state in cache), right after the decode attention loop over a training batch's cache held as bf16
(what precedes the attention-output GEMM in every layer), right after a memory sweep of 0.5-8 MB,
and inside one training batch's generation (``lean._mm`` wrapped, every call timed).

    python benchmarks/bench_cold_gemm.py          # about a minute

One torch thread; wall microseconds per call (``time.perf_counter`` around the call alone), medians.
The shapes: ``trainer.batch_size`` rows and the default model's ``hidden_size`` and
``intermediate_size`` (qkv: hidden -> 3 x hidden, out: hidden -> hidden, fc: hidden ->
intermediate, proj: intermediate -> hidden); the attention loop over positions 15-85 of a cache of
the default's capacity, as ``bench_attention.py --held`` runs it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import common

common.use_checkout()

import numpy as np  # noqa: E402
import torch  # noqa: E402


def timed(call, before=None, n: int = 400) -> float:
    """Median microseconds of ``call()``, with ``before()`` (untimed) ahead of each."""
    out = []
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return 1e6 * statistics.median(out)


def in_generation(config, lean) -> dict[tuple[int, int], float]:
    """Median microseconds of each GEMM shape's calls during one training batch's generation."""
    from scalerl.rollout.prompts import PromptSampler

    task = common.task(config)
    model, tok, prec = common.policy(config, task, torch.device("cpu"), trained=False)
    per_prompt, slots = int(config.trainer.generations_per_prompt), int(config.trainer.batch_size)
    prompts = PromptSampler(task.train_prompts(), seed=0).next(slots // per_prompt)
    gen = common.generator(config, model, tok, prec, seed=0)
    calls: dict[tuple[int, int], list[float]] = defaultdict(list)
    plain = lean._mm

    def wrapped(wb, x):
        t = time.perf_counter()
        y = plain(wb, x)
        calls[(x.shape[1], y.shape[1])].append(time.perf_counter() - t)
        return y

    def batch() -> None:
        gen.manual_seed(0)
        sess = gen.session(rows=slots)
        sess.add(prompts, per_prompt, tag=0)
        sess.drain()

    batch()  # compiled loops loaded, buffers made
    lean._mm = wrapped
    try:
        batch()
        batch()
    finally:
        lean._mm = plain
    return {k: 1e6 * statistics.median(v) for k, v in calls.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("override", nargs="*", help="config overrides (default: the default run)")
    a = ap.parse_args()
    torch.set_num_threads(1)

    from scalerl.generator import kernels, lean

    _, config = common.options(["out_dir=/tmp/scalerl-bench-cold-gemm", *a.override])
    rows, hidden = int(config.trainer.batch_size), int(config.model.hidden_size)
    inter, heads = int(config.model.intermediate_size), int(config.model.num_heads)
    dim = hidden // heads
    cap = 16 + int(config.length_control.max_new_tokens) + int(config.length_control.answer_budget)
    g = torch.Generator().manual_seed(0)
    shapes = {
        "qkv": (hidden, 3 * hidden),
        "out": (hidden, hidden),
        "fc": (hidden, inter),
        "proj": (inter, hidden),
    }
    layers, inputs = {}, {}
    for name, (i, o) in shapes.items():
        w = torch.randn(i, o, generator=g).to(torch.bfloat16)
        layers[name] = lean._Linear(w, torch.randn(o, generator=g).to(torch.bfloat16), lean._packed(w))
        inputs[name] = torch.randn(rows, i, generator=g).to(torch.bfloat16)

    attend = kernels.attention_bf16_held()
    cache = kernels.bits16(torch.randn(rows, heads, cap, dim, generator=g).to(torch.bfloat16))
    qkv = torch.randn(rows, 3 * hidden, generator=g).to(torch.bfloat16)
    pos = torch.randint(15, 86, (rows,), generator=g).numpy()
    att = torch.empty(rows, hidden, dtype=torch.bfloat16)

    def attention() -> None:
        attend(kernels.bits16(qkv), cache, cache, pos, kernels.bits16(att), np.float32(dim**-0.5))

    sweeps = {mb: torch.zeros(int(mb * (1 << 20)) // 4) for mb in (0.5, 1, 2, 4, 8)}
    table = {}
    for name in shapes:

        def call(name=name):
            lean._mm(layers[name], inputs[name])

        row = {"alone": timed(call), "after the attention loop": timed(call, attention)}
        for mb, buf in sweeps.items():
            row[f"after a {mb:g} MB sweep"] = timed(call, lambda buf=buf: buf.add_(1.0))
        table[name] = row
    live = in_generation(config, lean)

    print(
        f"# bf16 GEMMs of the lean decode, alone and after other work: {common.utc_now()}, {common.commit()}"
    )
    print(
        f"machine: {common.machine()}; load {common.load()}; one torch thread; packed: {lean._packed_gemm_exact()}\n"
    )
    cols = list(next(iter(table.values()))) + ["in a batch's generation"]
    print("| GEMM (rows x in -> out) | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, (i, o) in shapes.items():
        cells = [f"{v:.1f}" for v in table[name].values()] + [f"{live.get((i, o), float('nan')):.1f}"]
        print(f"| {name} ({rows} x {i} -> {o}) | " + " | ".join(cells) + " |")
    print("\nmicroseconds a call, medians; the sweep: one in-place add over a buffer of that size")
    print(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()
