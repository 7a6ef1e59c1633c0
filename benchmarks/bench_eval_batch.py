"""The held-out evaluation of the default run: its decode batch as a training batch's rows against
all the held-out prompts at once (issue 54), alternating in one process.

    python benchmarks/bench_eval_batch.py [--rounds 3] [--sizes 21 43 128] [--out FILE.md]

The work: one evaluation as the loop runs it (``scalerl.loop.evaluate.evaluate``: ``eval.num_prompts``
held-out prompts x ``eval.samples_per_prompt`` samples of the default task, seeded by the step) with
the warm-started default model under the default precision, on the run's own generator (the lean
decode), one torch thread (the trainer's share of 2 cores). ``--sizes``: prompts a decode batch
(``eval.batch_prompts``); 21 = 128 training rows / 6 samples, the rule before the KV budget; 128 =
all of them, what ``eval.batch_prompts=0`` now gives the embedded model. Per size: the thread's CPU
seconds an evaluation (median over ``--rounds``, the order turning each round) and the pass rate it
measured (the same prompts and distribution; the draws differ with the batching).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time

import common

common.use_checkout()

import torch  # noqa: E402


class _NoTracker:
    def log_artifact_text(self, *args) -> None:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[21, 43, 128])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from scalerl.loop.evaluate import evaluate
    from scalerl.state import RunState

    _, config = common.options(["out_dir=/tmp/scalerl-bench-eval"])
    task = common.task(config)
    model, tok, prec = common.policy(config, task, torch.device("cpu"))
    gen = common.generator(config, model, tok, prec, seed=0)
    val = task.val_prompts()[: int(config.eval.num_prompts)]

    def run(size: int) -> tuple[float, float]:
        options = dataclasses.replace(config.eval, batch_prompts=size)
        c = time.thread_time()
        out = evaluate(
            task,
            val,
            gen,
            contextlib.nullcontext,
            RunState(),
            _NoTracker(),
            options=options,
            seed=0,
            batch_size=config.trainer.batch_size,
            reward=config.reward,
            length_control=config.length_control,
            verifier_timeout_s=config.task.verifier_timeout_s,
            main=True,
        )
        return time.thread_time() - c, out["val/pass_rate"]

    for s in a.sizes:  # warm-up: first-call allocations, the loops' disk cache
        run(s)
    res: dict[int, list[tuple[float, float]]] = {s: [] for s in a.sizes}
    loads = [common.load()]
    for r in range(a.rounds):
        for s in common.in_turn(a.sizes, r):
            res[s].append(run(s))
        loads.append(common.load())
    K = int(config.eval.samples_per_prompt)
    lines = [
        f"# the default's held-out evaluation by decode batch: {common.utc_now()}, commit {common.commit()}",
        f"machine: {common.machine()}; torch threads {a.threads}; load over the timing: {'; '.join(loads)}",
        f"{len(val)} prompts x {K} samples, step 0 of the warm-started default; {a.rounds} rounds",
        "",
        "| prompts a decode batch | rows | CPU s an evaluation (median; each) | val/pass_rate (each) |",
        "|---|---|---|---|",
    ]
    for s, rs in res.items():
        cpu = statistics.median(x[0] for x in rs)
        lines.append(
            f"| {s} | {min(s, len(val)) * K} | {cpu:.3f} ({', '.join(f'{x[0]:.2f}' for x in rs)}) | "
            f"{', '.join(f'{x[1]:.3f}' for x in rs)} |"
        )
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
