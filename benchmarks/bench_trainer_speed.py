"""The trainer's step on the embedded default: its paths side by side, and against its counted-FLOP limit.

Captures the default recipe's real batches (``async_mode=sync``, seed 0: its first steps, with the
trainer's weights before them), then builds trainers over the same weights in one process and
alternates their steps on the same batches (the order turns each round): ``plain``, the emulated
bf16 body through plain hooks (``precision.LEAN_EMULATION=False``, no weight cache) with fp32 GEMMs;
``lean``, the lean hooks and weight cache with fp32 GEMMs; ``bf16``, the lean path with its linear
layers' GEMMs in bf16 (``precision.LOW_PRECISION_KERNELS=True``, the default on a CPU with AMX or
AVX512-BF16: the same arithmetic up to the order of fp32 sums). Reports per step: wall
and thread CPU seconds (medians), the counted training FLOPs (``6 x parameters x trained tokens``,
as ``scalerl.loop.accounting`` counts them), the machine's fp32 matmul rate on large square
matrices measured here with the same threads, and the step's time over the limit those give.

    python benchmarks/bench_trainer_speed.py [--steps 6] [--rounds 4] [--threads 1] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import common
import torch
from omegaconf import OmegaConf

import scalerl.model.precision as precision_module
from scalerl.config import compose, typed
from scalerl.loop import build
from scalerl.loop.run import train_step


def capture(steps: int, tmp: str):
    """(config, the trainer's weights before step 1, the step batches, counted FLOPs per batch)."""
    cfg = compose(
        [
            "async_mode=sync",
            "seed=0",
            "progress=log",
            f"out_dir={tmp}/run",
            f"tracking.uri=sqlite:///{tmp}/m.db",
        ]
    )
    OmegaConf.resolve(cfg)
    run = build(cfg)
    state = copy.deepcopy(run.trainer.module.state_dict())
    batches, real = [], run.trainer.step

    def keep(batch):
        batches.append(copy.deepcopy(batch))
        return real(batch)

    run.trainer.step = keep
    for _ in range(steps):
        train_step(run)
    # the accounting's training FLOPs: 6 x non-embedding parameters x (prompt + completion) tokens
    flops = [6.0 * run.n_params * float((b.input_ids != run.tokenizer.pad_token_id).sum()) for b in batches]
    return cfg, state, batches, flops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg, state, batches, flops = capture(args.steps, tmp)
    torch.set_num_threads(args.threads)
    config = typed(cfg)
    task = common.task(config)
    trainers = {}
    paths = {"plain": (False, False), "lean": (True, False), "bf16": (True, True)}  # (lean, bf16 GEMMs)
    for name, (lean, kernels) in paths.items():
        precision_module.LEAN_EMULATION = lean
        precision_module.LOW_PRECISION_KERNELS = kernels
        model, _, precision = common.policy(config, task, torch.device("cpu"))
        model.load_state_dict(state)
        tr = common.trainer(config, model, precision, device=torch.device("cpu"))
        tr.engine.round_weights_once = lean
        tr.step(batches[0])  # first-call costs out of the timing
        trainers[name] = tr
    precision_module.LEAN_EMULATION = True
    wall = {k: [] for k in trainers}
    cpu = {k: [] for k in trainers}
    loads = [common.load().split()[0]]
    for r in range(args.rounds):
        for b in batches:
            for k in common.in_turn(list(paths), r):
                precision_module.LOW_PRECISION_KERNELS = paths[k][1]
                t, c = time.perf_counter(), time.thread_time()
                trainers[k].step(b)
                wall[k].append(time.perf_counter() - t)
                cpu[k].append(time.thread_time() - c)
        loads.append(common.load().split()[0])
    precision_module.LOW_PRECISION_KERNELS = None
    rate = common.matmul_rate(best=True)
    limit = statistics.mean(flops) / rate

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(cpu[a], cpu[b], strict=True))

    lines = [
        f"date {common.utc_now()}, commit {common.commit()}, {common.cpu_model()}, "
        f"{torch.get_num_threads()} thread(s), load average (1 min) over the timing: {' '.join(loads)}",
        "",
        f"{len(batches)} default batches x {args.rounds} rounds, {', '.join(paths)} alternated step by step;"
        f" counted training FLOPs per step {statistics.mean(flops) / 1e9:.1f} G; fp32 matmul rate "
        f"(2048^2, thread CPU time) {rate / 1e9:.1f} GFLOP/s; limit {limit:.3f} s/step",
        "",
        "| path | wall s/step (median) | thread CPU s/step (median) | CPU / counted-FLOP limit |",
        "|---|---|---|---|",
    ]
    for k in trainers:
        c = statistics.median(cpu[k])
        lines.append(f"| {k} | {statistics.median(wall[k]):.3f} | {c:.3f} | {c / limit:.2f}x |")
    lines += [
        "",
        f"thread CPU, median of the step-by-step ratios: lean / plain {ratio('lean', 'plain'):.3f}, "
        f"bf16 / lean {ratio('bf16', 'lean'):.3f}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
