"""How the cost of a step grows with the work, and what each of the loop's speed-ups is worth.

    python benchmarks/bench_scaling_cost.py                # scaling table (~10 min on 2 busy cores)
    python benchmarks/bench_scaling_cost.py --steps 6      # quicker, noisier
    python benchmarks/bench_scaling_cost.py components     # each speed-up on / off, same batches (~3 min)

``scaling``: time per optimiser step of our loop (``async_mode=sync``, and ``pipeline_rl`` for the
base point) as prompts per step, generations per prompt and the maximum new tokens double, on the
benchmark's work (see ``bench_trl.py``: the embedded model and task, CISPO, fp32, no length
control beyond the hard limit). Each point is a fresh subprocess running the real loop; the table
gives the median wall seconds per step (the first two steps left out), CPU seconds per step (all
processes), the generation and training seconds per step, and the mean completion length (the
task ends most completions by eos near 43 tokens, so the maximum length costs only while it cuts
them). Writes ``benchmarks/results/scaling_cost.{md,json}``.

``components``: the speed-ups of the loop measured in isolation on the same real batches, each
switched off and on in one process (CPU seconds, so other jobs on the machine matter less):
length-bucketed training, a group's prompt computed once in training (``trainer.share_prompts``),
finished rows leaving the decode batch, rounded weights cached under emulated bf16, and the
pipeline generator batching the work waiting for it. Writes
``benchmarks/results/components.{md,json}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_trl  # same folder
import common

HERE = common.HERE

RESULTS = HERE / "results"


# ----------------------------------------------------------------------------------- scaling
def run_point(a, system: str, prompts: int, gens: int, max_new: int) -> dict:
    args = [
        f"--steps={a.steps}",
        f"--prompts={prompts}",
        f"--gens={gens}",
        f"--max-new-tokens={max_new}",
        f"--threads={a.threads}",
        f"--lr={a.lr}",
        "--eval-every=1000000",
        "--eval-prompts=8",
        "--eval-k=1",
    ]
    cmd = [sys.executable, str(HERE / "bench_trl.py"), "_child", "--system", system, *args]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(a.threads))
    la = common.loadavg()[0]
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        proc = subprocess.run([*cmd, "--json-out", f.name], env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise RuntimeError(f"{system} {prompts}x{gens}x{max_new} failed")
        r = json.loads(Path(f.name).read_text())
    t = [0.0, *r["step_times"]]
    per_step = [b - a_ for a_, b in zip(t[:-1], t[1:])]
    steady = per_step[2:] or per_step
    n = len(per_step)
    return {
        "system": system,
        "prompts": prompts,
        "gens": gens,
        "max_new_tokens": max_new,
        "s_per_step": statistics.median(steady),
        "cpu_s_per_step": r["cpu_s"] / n,
        "gen_s_per_step": r["generator_busy"] * r["wall_s"] / n,
        "train_s_per_step": r["trainer_busy"] * r["wall_s"] / n,
        "mean_completion": r["completion_tokens"] / (n * prompts * gens),
        "load": la,
    }


def scaling(a) -> None:
    base = (a.prompts, a.gens, a.max_new_tokens)
    P, G, L = base
    points = [
        ("base", P, G, L),
        ("2x prompts", 2 * P, G, L),
        ("4x prompts", 4 * P, G, L),
        ("2x generations", P, 2 * G, L),
        ("4x generations", P, 4 * G, L),
        ("1/2 max length", P, G, L // 2),
        ("2x max length", P, G, 2 * L),
    ]
    rows = []
    for name, p, g, length in points:
        r = run_point(a, "ours_sync", p, g, length)
        r["point"] = name
        rows.append(r)
        print(
            f"[scaling] {name:15s} {p:3d}x{g:2d} max {length:3d}: {r['s_per_step']:.3f} s/step "
            f"cpu {r['cpu_s_per_step']:.3f}  gen {r['gen_s_per_step']:.3f} train {r['train_s_per_step']:.3f}  "
            f"len {r['mean_completion']:.1f}  load {r['load']:.1f}",
            flush=True,
        )
    pipe = []
    for name, p, g, length in points[:2]:
        r = run_point(a, "ours_pipeline", p, g, length)
        r["point"] = name
        pipe.append(r)
        print(f"[scaling] pipeline {name}: {r['s_per_step']:.3f} s/step", flush=True)
    info = bench_trl.machine_info()
    b = rows[0]
    L_ = [
        f"### Cost per step as the work doubles ({info['date']}, {info['cpu']}, {info['cores']} cores)\n",
        f"Our loop, async_mode=sync, {a.threads} torch thread(s), {a.steps} steps per point (median of steps 3+), "
        "the benchmark's work (embedded model, 1- to 4-digit addition, CISPO, fp32, length_control=none). "
        f"Load average {min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f} (other jobs).\n",
        "| work | prompts x gens | max new tokens | mean completion | s/step | x base | CPU s/step | generation s | training s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        L_.append(
            f"| {r['point']} | {r['prompts']} x {r['gens']} | {r['max_new_tokens']} | {r['mean_completion']:.1f} | "
            f"{r['s_per_step']:.3f} | {r['s_per_step'] / b['s_per_step']:.2f} | {r['cpu_s_per_step']:.3f} | "
            f"{r['gen_s_per_step']:.3f} | {r['train_s_per_step']:.3f} |"
        )
    L_.append("\npipeline_rl (k=8, generator and trainer one thread each) at the same points:\n")
    L_.append("| work | s/step | CPU s/step | generator busy s/step | trainer busy s/step |")
    L_.append("|---|---:|---:|---:|---:|")
    for r in pipe:
        L_.append(
            f"| {r['point']} ({r['prompts']} x {r['gens']}) | {r['s_per_step']:.3f} | {r['cpu_s_per_step']:.3f} | "
            f"{r['gen_s_per_step']:.3f} | {r['train_s_per_step']:.3f} |"
        )
    md = "\n".join(L_) + "\n"
    out = Path(a.out or RESULTS / "scaling_cost")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(
        json.dumps({"machine": info, "args": vars(a), "sync": rows, "pipeline": pipe}, indent=1)
    )
    print(md)


# ----------------------------------------------------------------------------------- components
def components(a) -> None:
    """Each speed-up switched off / on, on the same real batches, CPU seconds (one thread)."""
    import torch

    from scalerl import algo
    from scalerl.generator import HFGenerator
    from scalerl.model.precision import Precision
    from scalerl.rollout.prompts import PromptSampler
    from scalerl.trainer import collate

    torch.set_num_threads(1)
    ns = argparse.Namespace(
        **{
            **vars(a),
            "steps": 1,
            "eval_every": 1,
            "eval_prompts": 128,
            "seed": 0,
            "override": [],
            "model": "tiny",
        }
    )
    rows = []

    def cpu(fn, reps):
        fn()  # warm-up
        best = []
        for _ in range(reps):
            t = time.thread_time()
            fn()
            best.append(time.thread_time() - t)
        return statistics.median(best)

    def one_precision(prec_name: str) -> None:
        over = [o for o in bench_trl.work_overrides(ns) if not o.startswith("precision=")]
        _, config = common.options([*over, f"precision={prec_name}", "out_dir=/tmp/scalerl-components"])
        task = common.task(config)
        model, tok, _ = common.loaded_policy(config, task)
        prec = Precision.for_device(config.precision.body, config.precision.head, "cpu")
        prec.prepare(model)
        gen = HFGenerator(model, tok, prec, config.length_control, temperature=1.0, seed=0)
        sampler = PromptSampler(task.train_prompts(), seed=0)
        batches = [sampler.next(a.prompts) for _ in range(a.batches)]

        def generate_all(chunk=a.prompts):
            gen.manual_seed(0)
            out = []
            for pr in batches:
                groups = []
                for i in range(0, len(pr), chunk):
                    groups.extend(gen.generate(pr[i : i + chunk], a.gens, version=0))
                out.append(groups)
            return out

        default_min_rows = gen.compact_min_rows

        def with_compaction(on):
            gen.compact_min_rows = default_min_rows if on else 1 << 30

        def with_cache(on):
            gen.cache_rounded_weights = on

        def off_on(component: str, switch, fn) -> None:
            """CPU seconds of ``fn(on)`` with the speed-up off, on, off, on (alternating, so drift
            hits both), then leave it on."""
            for on in (False, True, False, True):
                switch(on)
                t = cpu(functools.partial(fn, on), 1)
                rows.append(
                    {"precision": prec_name, "component": component, "on": on, "cpu_s": t / a.batches}
                )
            switch(True)

        off_on("generator: finished rows leave the decode batch", with_compaction, lambda on: generate_all())
        if prec_name != "fp32":
            off_on(
                "generator: emulated-bf16 weights rounded once per version",
                with_cache,
                lambda on: generate_all(),
            )
        off_on(
            "pipeline generator: waiting work decoded as one batch (vs chunks of 4 prompts)",
            lambda on: None,
            lambda on: generate_all(a.prompts if on else 4),
        )
        # trainer: length buckets
        groups_list = generate_all()
        trainer = common.trainer(config, model, prec, temperature=1.0, device=torch.device("cpu"))
        tbatches = []
        for pr, groups in zip(batches, groups_list):
            for p, g in zip(pr, groups):
                for s in g:
                    s.reward = task.score(p, s.text)
            flat = [s for g in groups for s in g]
            r = torch.tensor([s.reward for s in flat])
            gi = torch.tensor([i for i, g in enumerate(groups) for _ in g])
            tbatches.append(collate(groups, algo.compute_advantages(r, gi, "none"), tok.pad_token_id))
        state = {k: v.clone() for k, v in model.state_dict().items()}
        opt_state = trainer.optimizer.state_dict()

        def train_all():
            for b in tbatches:
                model.load_state_dict(state)
                trainer.optimizer.load_state_dict(opt_state)
                trainer.step(b)

        def with_buckets(on):
            trainer.bucket_lengths = on

        off_on(
            "trainer: length-bucketed forward/backward (no padding waste)",
            with_buckets,
            lambda on: train_all(),
        )

        def with_shared_prompts(on):
            trainer.options.share_prompts = on

        off_on(
            "trainer: a group's prompt through the model once (trainer.share_prompts)",
            with_shared_prompts,
            lambda on: train_all(),
        )
        widths = [tuple(b.input_ids.shape) for b in tbatches]
        print(f"[components] {prec_name}: training batch shapes {widths}", flush=True)

    for prec_name in ("fp32", "fp32_head"):
        one_precision(prec_name)

    info = bench_trl.machine_info()
    L_ = [
        f"### Speed-ups in isolation ({info['date']}, {info['cpu']}, 1 thread, CPU seconds per batch of "
        f"{a.prompts} prompts x {a.gens} generations, median of 2 alternating off/on measurements over {a.batches} real batches)\n",
        "| precision | speed-up | before (CPU s) | after (CPU s) | change |",
        "|---|---|---:|---:|---:|",
    ]
    keys = []
    for r in rows:
        k = (r["precision"], r["component"])
        if k not in keys:
            keys.append(k)
    summary = []
    for k in keys:
        off = statistics.median(
            [r["cpu_s"] for r in rows if (r["precision"], r["component"]) == k and not r["on"]]
        )
        on = statistics.median(
            [r["cpu_s"] for r in rows if (r["precision"], r["component"]) == k and r["on"]]
        )
        summary.append({"precision": k[0], "component": k[1], "before": off, "after": on})
        L_.append(f"| {k[0]} | {k[1]} | {off:.3f} | {on:.3f} | {100 * (on - off) / off:+.0f}% |")
    md = "\n".join(L_) + "\n"
    out = Path(a.out or RESULTS / "components")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(
        json.dumps({"machine": info, "rows": rows, "summary": summary}, indent=1)
    )
    print(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", nargs="?", default="scaling", choices=["scaling", "components"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8, help="base prompts per step (components: per batch)")
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--min-digits", type=int, default=1)
    ap.add_argument("--batches", type=int, default=6, help="components: real batches per measurement")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.cmd == "components":
        if a.prompts == 8 and "--prompts" not in " ".join(sys.argv):
            a.prompts = 16
        if "--max-new-tokens" not in " ".join(sys.argv):
            a.max_new_tokens = 64
        components(a)
    else:
        scaling(a)


if __name__ == "__main__":
    main()
