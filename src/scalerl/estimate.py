"""How long a run will take on this machine, said before it starts (``python train.py --cfg job``,
``python sweep.py --dry-run``).

The estimate is built from what the run will do and what this machine does per unit of that work:

* **The work** (:func:`work`), from the resolved config alone: optimiser steps; samples a step
  (``trainer.batch_size``) and the rows a decode step carries; the tokens a sample may generate
  (``length_control.max_new_tokens``, or under forced interruptions the budgets and the forced
  phrase where fewer) and the prompt's; how many batches a step generates
  (``async_mode=ppo_off_policy`` generates its minibatches' in one go, the same per step;
  ``filter.dynamic_sampling`` draws more groups as the policy solves prompts, up to
  ``filter.max_gen_batches``); the evaluations (``eval.every``, ``eval.num_prompts`` x
  ``eval.samples_per_prompt``); whether the warm-start must be trained first (not cached, not shipped).
* **The rate** (:func:`probe`), measured here and now: the configured architecture built with random
  weights (the same transformers class and sizes the run builds; no weights read), timed for about
  a second at the run's shapes and thread counts: one decode step of as many rows as the
  generator carries (through the HF generator's lean forward in the run's precision where the run
  decodes through it, else transformers' forward), and a forward + backward of training rows as
  long as the run's samples. The probe sees this machine's speed and its present load, which
  counted FLOPs alone cannot: on the embedded model a decode step is bound by attention over many
  short rows and by per-operation overhead, not by its matmuls
  (benchmarks/results/2026-12-01_7007612_generation-speed.md).
* **How a step combines them**: ``sync`` and ``ppo_off_policy`` generate, then train (the sum);
  ``pipeline_rl`` runs its engine beside the trainer, so a step costs the slower of the two where
  each has cores of its own, the sum where they share them.

The loop does more than the probe times (the samples' bookkeeping, the verifier, weight pushes,
logging, checkpoints) and some of it faster (the project's own decode path, shared prompts), so each
phase's probe time may be scaled by a factor; compared with whole runs on this machine kind
(benchmarks/results/2026-12-01_98d4ed4_walltime-estimate.md; with the lean decode timed,
benchmarks/results/2026-12-04_da11bec_loo-study-time-and-estimate.md) the unscaled sum already
lands at or somewhat above the measured wall time, so the factors stay 1. The printed range is a
spread around it together with what the config cannot say in advance (how long the samples will
be, how many extra batches dynamic sampling will draw). What the estimate cannot know it says instead of guessing: a
GPU this machine does not have, a SLURM queue's wait, vLLM's engine start.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

# How much longer the run's loop takes than the probe's bare transformers calls, per phase (central
# value; MODEL_SPREAD covers the spread around it): generation carries the samples' bookkeeping,
# stopping rules and the verifier, training the loss, the bf16 emulation's rounding, the optimiser
# and the statistics, against the project's leaner decode and shared prompts. Compared with whole
# runs of the default and of the leave-one-out study's design, 1 and 1 leave the estimate at or
# somewhat above the measured time (benchmarks/results/2026-12-01_98d4ed4_walltime-estimate.md).
GEN_FACTOR = 1.0
TRAIN_FACTOR = 1.0
# The fraction of max_new_tokens a sample generates (decode steps a batch takes run to its longest
# sample; the trained tokens are the mean): the config bounds it, the policy sets it.
LENGTH_FRACTION = (0.6, 0.85, 1.0)
# Batches of groups generated a step under dynamic sampling (low, central, high): 1 while few groups
# are solved G of G, more as the policy learns, never above filter.max_gen_batches.
DYNAMIC_BATCHES = (1.0, 1.5, 2.5)
# Starting a run's process (imports, the model, the task, the tracking store, the engine's process):
# seconds, before its first step.
STARTUP_S = (8.0, 15.0, 30.0)
# The model's factor spread (whole runs against the probe's prediction) on top of the ranges above.
MODEL_SPREAD = (0.75, 1.35)
PROBE_BUDGET_S = 0.25  # each timed part of the probe runs about this long


@dataclass(frozen=True)
class Work:
    """What a run will do, from its config."""

    steps: int
    samples: int  # samples a step (trainer.batch_size)
    gen_rows: int  # rows a decode step carries while generating training batches
    prompt_tokens: int
    new_tokens: int  # max_new_tokens: the cap of a sample's completion
    gen_batches: tuple[float, float, float]  # batches generated a step (low, central, high)
    evals: int
    eval_samples: int  # samples an evaluation generates
    eval_rows: int  # rows a decode step carries while evaluating
    async_mode: str
    generator: str  # hf | vllm
    warmstart: tuple[int, int] = (0, 0)  # (steps, batch size) of a warm-start still to train; (0, 0) none
    notes: tuple[str, ...] = ()

    @property
    def tokens(self) -> float:
        """The token positions the run processes at most, central case: its training samples (each
        dynamic-sampling batch generated counted) and its evaluations' samples, each at its prompt
        and its longest completion. What orders a sweep's runs, longest first; no time."""
        samples = self.steps * self.samples * self.gen_batches[1] + self.evals * self.eval_samples
        return float(samples * (self.prompt_tokens + self.new_tokens))


@dataclass(frozen=True)
class Probe:
    """This machine's time for the run's unit operations on one thread of a quiet machine (seconds),
    measured by :func:`probe`."""

    decode_step_s: float  # one decode step of ``rows`` rows
    eval_decode_step_s: float  # one decode step of the evaluation's rows
    train_sample_s: float  # forward + backward of one sample of ``seq`` tokens
    rows: int
    seq: int
    seconds: float  # what the probe itself took


@dataclass(frozen=True)
class Estimate:
    """A run's wall time: ``total`` (central) and its range ``lo``-``hi``, in seconds."""

    total: float
    lo: float
    hi: float
    steps: int
    step_s: float
    evals: int
    eval_s: float
    startup_s: float
    where: str = "on this machine"
    notes: tuple[str, ...] = ()
    # the cores the run keeps busy on average (pipeline_rl: engine and trainer side by side)
    busy_threads: float = 1.0
    # how much longer than on a quiet machine, at the load the machine had when estimated
    stretch: float = 1.0
    load: float = 0.0
    cores: int = 1
    threads: int = 1  # the most threads one of its processes computes on

    def line(self) -> str:
        """``estimated wall time: about 6 min (4-9) on this machine: 300 steps x ~1.1 s, ...``
        (the per-step and per-evaluation figures are a quiet machine's)."""
        parts = [f"{self.steps} steps x ~{seconds_text(self.step_s)}"]
        if self.evals:
            parts.append(f"{self.evals} evaluations x ~{seconds_text(self.eval_s)}")
        parts.append(f"start ~{seconds_text(self.startup_s)}")
        s = self.stretch
        where = self.where
        if s > 1.05:
            quiet = span(self.total / s, self.lo / s, self.hi / s)
            where += f" at its present load ({self.load:.1f} on {self.cores} cores: x{s:.1f}; {quiet} quiet)"
        return f"estimated wall time: about {span(self.total, self.lo, self.hi)} {where}: " + ", ".join(parts)

    def lines(self) -> list[str]:
        return [self.line()] + [f"  ({n})" for n in self.notes]


@dataclass(frozen=True)
class Unknown:
    """An estimate this machine cannot make, and why."""

    why: str

    def line(self) -> str:
        return f"estimated wall time: not estimated here ({self.why})"

    def lines(self) -> list[str]:
        return [self.line()]


# ---------------------------------------------------------------------------- formatting
def seconds_text(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min"


def _unit(seconds: float) -> tuple[float, str]:
    if seconds < 120:
        return 1.0, "s"
    if seconds < 2 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def span(total: float, lo: float, hi: float) -> str:
    """``6 min (4-9)``: the central value and the range, in the central value's unit."""
    div, unit = _unit(total)

    def r(x: float) -> str:
        v = x / div
        return f"{v:.1f}" if unit == "h" and v < 10 else f"{v:.0f}"

    return f"{r(total)} {unit} ({r(lo)}-{r(hi)})"


# ---------------------------------------------------------------------------- the work
def _prompt_tokens(task) -> tuple[int, str]:
    """A prompt's tokens (``task``: the task option): the addition task's ``aaaa+bbbb=`` (the char
    tokenizer: one a character), else an assumption stated in the output."""
    if str(task.name) == "addition":
        return 2 * int(task.max_digits) + 2, ""
    return 64, f"prompts assumed 64 tokens (task={task.name} prompts are not read to estimate)"


def _warmstart_pending(model, task) -> tuple[int, int]:
    """(steps, batch size) of the tiny model's warm-start (``model``, ``task``: the options its
    cache key is made of) when neither the cache nor the package holds it (the run trains it
    first), else (0, 0)."""
    m = model
    if str(m.name) != "tiny" or int(m.warmstart_steps) <= 0:
        return 0, 0
    from pathlib import Path

    from scalerl.model.build import SHIPPED_BASE, _warmstart_key

    try:
        key = _warmstart_key(model, task)
    except Exception:  # a key that cannot be made: say nothing rather than guess
        return 0, 0
    name = f"warmstart-{key}"
    cached = Path(str(m.cache_dir)).expanduser() / name / "meta.json"
    if cached.is_file() or (SHIPPED_BASE / name / "meta.json").is_file():
        return 0, 0
    return int(m.warmstart_steps), int(m.warmstart_batch_size)


WORK_GROUPS = ("trainer", "generator", "async_mode", "filter", "eval", "length_control", "task", "model")
"""The groups whose options :func:`work` counts a run's work from (its parameters, by name)."""


def work(*, trainer, generator, async_mode, filter, eval, length_control, task, model) -> Work:
    """What a run will do (:class:`Work`), from its options alone (each the typed option of its
    group: :func:`scalerl.config.typed`)."""
    from scalerl.config import evaluates_at

    steps = int(trainer.total_steps)
    B = int(trainer.batch_size)
    gen = generator
    kind = str(gen.name)
    mode = str(async_mode.name)
    notes = []
    rows = B  # sync: a batch's samples decode together
    if mode == "ppo_off_policy":  # its minibatches' samples decode together
        rows = B * max(1, min(int(async_mode.minibatches), steps))
    if mode == "pipeline_rl" and bool(gen.continuous) and int(gen.max_running):
        rows = int(gen.max_running)
    f = filter
    if bool(f.dynamic_sampling) and bool(f.zero_variance):
        cap = float(f.max_gen_batches)
        batches = tuple(min(cap, b) for b in DYNAMIC_BATCHES)
        notes.append(
            f"dynamic sampling generates 1-{cap:g} batches a step as the policy solves prompts: "
            f"{batches[0]:g}-{batches[2]:g} assumed"
        )
    else:
        batches = (1.0, 1.0, 1.0)
    K = int(eval.samples_per_prompt)
    n_val = int(eval.num_prompts)
    if hasattr(
        task, "num_val"
    ):  # a task option with the field (champ validates a fraction; multi, its domains)
        n_val = min(n_val, int(task.num_val))
    evals = sum(evaluates_at(s, steps, int(eval.every)) for s in range(steps + 1))
    bs = eval.decode_prompts(B, n_val, _tiny_kv_bytes_per_row(model))
    prompt, note = _prompt_tokens(task)
    if note:
        notes.append(note)
    return Work(
        steps=steps,
        samples=B,
        gen_rows=rows,
        prompt_tokens=prompt,
        new_tokens=_decode_bound(length_control, model),
        gen_batches=batches,
        evals=evals,
        eval_samples=n_val * K,
        eval_rows=min(n_val, bs) * K,
        async_mode=mode,
        generator=kind,
        warmstart=_warmstart_pending(model, task),
        notes=tuple(notes),
    )


def _decode_bound(length_control, model) -> int:
    """The decode steps a completion can take (:attr:`LengthControl.longest
    <scalerl.generator.length.LengthControl.longest>`), its forced phrase counted with the embedded
    model's character tokenizer, and for another model, whose tokenizer is not read here, as about
    one token per four characters."""
    from scalerl.generator.length import LengthControl

    if str(model.name) == "tiny":
        from scalerl.model.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    else:

        def tokenizer(text: str, add_special_tokens: bool = False) -> dict:
            return {"input_ids": [0] * -(-len(text) // 4)}

    return LengthControl.build(length_control, tokenizer).longest


def _tiny_kv_bytes_per_row(model) -> int | None:
    """A row's KV cache bytes for the embedded model's option (None for another model: its config
    is not read here, and the evaluation's batch is then a training batch's rows)."""
    if str(getattr(model, "name", "")) != "tiny":
        return None
    from types import SimpleNamespace

    from scalerl.model.kv_cache import kv_bytes_per_row

    shape = SimpleNamespace(
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_kv_heads,
        hidden_size=model.hidden_size,
        max_position_embeddings=model.max_position_embeddings,
    )
    return kv_bytes_per_row(shape)


# ---------------------------------------------------------------------------- the probe
def _probe_model(model):
    """The run's architecture (``model``: its model option) with random weights (fp32, CPU), or a
    reason it cannot be built here."""
    import torch

    m = model
    name = str(m.name)
    if name == "tiny":
        from scalerl.model.build import build_model
        from scalerl.model.tokenizer import build_char_tokenizer

        tok = build_char_tokenizer()
        return build_model(m, len(tok), seed=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if name == "hf":
        from transformers import AutoConfig, AutoModelForCausalLM

        path = str(m.name_or_path)
        if not os.path.isdir(path):
            return f"model.name_or_path={path} is not a local folder this estimate reads"
        try:
            config = AutoConfig.from_pretrained(path)
        except Exception as e:  # a folder transformers cannot read: the run's preflight says why
            return f"cannot read the config of model.name_or_path={path} ({type(e).__name__})"
        with torch.device("cpu"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if name == "smollm2":
        from pathlib import Path

        from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

        done = sorted(Path(str(m.cache_dir)).expanduser().glob("smollm2-*/config.json"))
        # the converted folder's config when the run converted it once; else SmolLM2-135M's published
        # architecture (what the packaged GGUF file holds)
        config = (
            AutoConfig.from_pretrained(done[-1].parent)
            if done
            else LlamaConfig(
                hidden_size=576,
                intermediate_size=1536,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                vocab_size=49152,
                max_position_embeddings=8192,
                tie_word_embeddings=True,
            )
        )
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return f"model={name}: its architecture is not read to estimate"


def _timed(fn, budget: float, at_most: int = 20) -> float:
    """Seconds one call of ``fn`` takes on one thread of a quiet machine: one untimed call, then
    calls for about ``budget`` seconds, each timed by the thread's CPU time (the median). CPU time,
    not the clock: on a shared machine the clock counts the time others held the core, which
    :func:`load_stretch` accounts for once, from the load average."""
    fn()
    times, t_end = [], time.perf_counter() + budget
    while len(times) < at_most and (not times or time.perf_counter() < t_end):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    times.sort()
    return times[len(times) // 2]


def thread_speedup(threads: int) -> float:
    """How much faster ``threads`` threads run a step than one: the square root (an assumption, not
    a measurement: the embedded model's matmuls are small and its decode step is many small
    operations, which split across threads far from perfectly; a probe on several threads of a
    shared machine times the others' load, not ours)."""
    return max(1, threads) ** 0.5


# The probe's own work is capped at these FLOPs a timed call (about 0.1 s on one core): a larger model
# is timed on fewer rows (decode) or shorter rows (training) and scaled by the rows or tokens, which
# its matmuls, by then large enough to run near their rate, make nearly proportional.
PROBE_FLOPS = 6e9


def _decode_step_s(model, rows: int, prompt: int, new: int, n: int) -> float:
    """One decode step of ``rows`` rows halfway through a completion of ``new`` tokens, with the KV
    cache of what precedes it (transformers' path); ``n``: the model's non-embedding parameters."""
    import torch

    # the cache keyword by the installed transformers' name for it (``past_key_values`` warns from 5.2x)
    from scalerl.model.kv_cache import output_cache, with_cache

    vocab = model.config.vocab_size
    probe_rows = max(1, min(rows, int(PROBE_FLOPS / (2 * n))))
    ctx = prompt + max(1, new // 2)
    ctx = max(1, min(ctx, int(PROBE_FLOPS / (2 * n * probe_rows))))  # the prefill under the cap too
    ids = torch.randint(3, vocab, (probe_rows, ctx))
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        past = output_cache(out)
        nxt = torch.randint(3, vocab, (probe_rows, 1))

        def step():
            o = model(input_ids=nxt, use_cache=True, **with_cache(model, past))
            if hasattr(past, "crop"):  # keep the context where it was: each call times the same step
                past.crop(-1)
            return o

        return _timed(step, PROBE_BUDGET_S) * rows / probe_rows


def _train_sample_s(model, samples: int, seq: int, n: int) -> float:
    """Forward + backward of one sample of ``seq`` tokens, timed on as many rows as fit the budget
    (at most a batch's ``samples``), per sample."""
    import torch

    vocab = model.config.vocab_size
    probe_seq = max(2, min(seq, int(PROBE_FLOPS / (6 * n))))
    model.train()

    def fwd_bwd(rows: int):
        ids = torch.randint(3, vocab, (rows, probe_seq))
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    fwd_bwd(1)  # the first call allocates
    t0 = time.thread_time()
    fwd_bwd(1)
    one = max(time.thread_time() - t0, 1e-4)
    # rows as a micro-batch has them (up to 32), as many as fit the budget: per-sample time falls
    # with rows while the matmuls are small
    rows = max(1, min(samples, 32, int(PROBE_BUDGET_S / 2 / one)))
    t = _timed(lambda: fwd_bwd(rows), PROBE_BUDGET_S, at_most=5)
    model.eval()
    return t / rows * seq / probe_seq


def _lean_decoder(net, precision):
    """``net`` (prepared in place for ``precision``, the run's precision option) as the HF
    generator's lean forward (:mod:`scalerl.generator.lean`: the body over slot buffers with the
    compiled attention) with its precision, or None where the generator would not take that path
    here (an architecture or precision it does not know, no compiled loops)."""
    from scalerl.generator import lean
    from scalerl.model.precision import Precision

    prec = Precision.for_device(precision.body, precision.head, "cpu", impl=precision.impl)
    if lean.unsupported(net, prec, "cpu") is not None:
        return None
    body = lean.LeanModel(prec.prepare(net, master_weights=False), prec)
    return (body, prec) if body.fused_attention() is not None else None


def _lean_decode_step_s(decoder, rows: int, prompt: int, new: int, n: int) -> float:
    """One decode step of ``rows`` rows through ``decoder`` (:func:`_lean_decoder`) and the LM
    head's log-probs, halfway through a completion of ``new`` tokens."""
    import torch

    body, prec = decoder
    probe_rows = max(1, min(rows, int(PROBE_FLOPS / (2 * n))))
    ctx = prompt + max(1, new // 2)
    kv = body.buffers(probe_rows, ctx + 1, None)
    tok = torch.randint(3, body.model.config.vocab_size, (probe_rows,))
    pos = torch.full((probe_rows,), ctx)
    keymask = (torch.arange(ctx + 1)[None, :] <= pos[:, None])[:, None, None, :]

    def step():
        hidden = body.decode(kv, tok, pos, ctx + 1, keymask)
        return prec.log_softmax(prec.logits(body.model, hidden), 1.0)

    with torch.inference_mode():
        step()  # the loops compiled, or loaded from numba's cache
        return _timed(step, PROBE_BUDGET_S) * rows / probe_rows


def probe(model, w: Work, precision=None, lean: bool = False) -> Probe | str:
    """Time the unit operations of ``w`` on the architecture of ``model`` (the run's model option)
    on one thread of this machine (about a second), or say why it cannot. ``lean``: the run's
    generator decodes through its lean forward where that applies (``generator=hf`` without the
    static cache), timed in ``precision`` (the run's precision option); else, and where it does not
    apply, transformers' forward is timed."""
    import torch

    t0 = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net = _probe_model(model)
        if isinstance(net, str):
            return net
        from scalerl.model.build import num_params

        n = max(1, num_params(net, exclude_embeddings=True))
        mid = max(1, round(w.new_tokens * LENGTH_FRACTION[1]))
        seq = min(w.prompt_tokens + mid, int(getattr(net.config, "max_position_embeddings", 1 << 20)))
        train = _train_sample_s(net, w.samples, seq, n)
        step_s = functools.partial(_decode_step_s, net)
        # the lean path where it applies: after the training probe, since it prepares the model for
        # the precision (the emulation's hooks would slow the transformers forward timed above)
        decoder = _lean_decoder(net, precision) if lean and precision is not None else None
        if decoder is not None:
            step_s = functools.partial(_lean_decode_step_s, decoder)
        decode = step_s(w.gen_rows, w.prompt_tokens, w.new_tokens, n)
        eval_decode = (
            decode if w.eval_rows == w.gen_rows else step_s(w.eval_rows, w.prompt_tokens, w.new_tokens, n)
        )
    finally:
        torch.set_num_threads(before)
    return Probe(
        decode_step_s=decode,
        eval_decode_step_s=eval_decode,
        train_sample_s=train,
        rows=w.gen_rows,
        seq=seq,
        seconds=time.perf_counter() - t0,
    )


# ---------------------------------------------------------------------------- the estimate
def _threads(layout) -> tuple[int, int, bool, int]:
    """(generator threads, trainer threads, whether they have cores of their own, cores) of rank 0."""
    r0 = layout.ranks[0]
    trainer = max(1, int(r0.threads))
    engine = int(r0.engine_threads) or trainer
    has_engine_process = bool(layout.engines)
    apart = has_engine_process and engine + trainer <= max(1, int(r0.allotment))
    return engine, trainer, apart, max(1, int(r0.allotment))


def combine(
    w: Work, p: Probe, *, gen_threads: int = 1, train_threads: int = 1, apart: bool = False
) -> Estimate:
    """The run's wall time on a quiet machine from its work and this machine's unit times (see the
    module's docstring). ``apart``: the generator runs beside the trainer on cores of its own."""
    overlap = w.async_mode == "pipeline_rl" and apart
    gen_x, train_x = thread_speedup(gen_threads), thread_speedup(train_threads)
    out = []
    for i in range(3):  # low, central, high
        decode_steps = max(1.0, w.new_tokens * LENGTH_FRACTION[i])
        gen_batch = GEN_FACTOR * decode_steps * p.decode_step_s * w.samples / max(1, w.gen_rows) / gen_x
        gen = gen_batch * w.gen_batches[i]
        train = (
            TRAIN_FACTOR * w.samples * p.train_sample_s * (w.prompt_tokens + decode_steps) / p.seq / train_x
        )
        step = max(gen, train) if overlap else gen + train
        n_eval_batches = math.ceil(w.eval_samples / max(1, w.eval_rows))
        ev = GEN_FACTOR * n_eval_batches * decode_steps * p.eval_decode_step_s / gen_x
        ws_steps, ws_batch = w.warmstart
        startup = STARTUP_S[i] + ws_steps * ws_batch * p.train_sample_s / train_x
        out.append((w.steps * step + w.evals * ev + startup, step, ev, startup, gen, train))
    lo, mid, hi = out
    notes = list(w.notes)
    if w.warmstart[0]:
        notes.append(f"includes the warm-start's {w.warmstart[0]} steps (not cached yet)")
    from scalerl.generator.registry import generator_class

    if note := generator_class(w.generator).estimate_note:  # vLLM's: timed as transformers' path
        notes.append(note)
    if max(gen_threads, train_threads) > 1:
        notes.append(
            f"{max(gen_threads, train_threads)} threads assumed {thread_speedup(max(gen_threads, train_threads)):.1f}x "
            "one thread's speed (probed on one)"
        )
    gen, train = mid[4], mid[5]
    if overlap:  # each busy while it works: the engine's threads for gen, the trainer's for train
        busy = (gen * gen_threads + train * train_threads) / max(gen, train)
    else:
        busy = float(max(gen_threads, train_threads))
    return Estimate(
        total=mid[0],
        lo=lo[0] * MODEL_SPREAD[0],
        hi=hi[0] * MODEL_SPREAD[1],
        steps=w.steps,
        step_s=mid[1],
        evals=w.evals,
        eval_s=mid[2],
        startup_s=mid[3],
        notes=tuple(notes),
        busy_threads=busy,
        threads=max(gen_threads, train_threads),
    )


def _on_gpu(layout) -> bool:
    return bool(layout.on_gpu)


def machine_load() -> tuple[float, int]:
    """(the 1-minute load average, the cores this process may use)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this system: as if quiet
        load = 0.0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return load, max(1, cores)


def load_stretch(load: float, busy: float, cores: int) -> float:
    """How much longer work keeping ``busy`` cores busy takes where others keep ``load`` runnable
    on ``cores`` cores: the scheduler shares the cores among all runnable threads, so once there are
    more than cores each gets ``cores / (load + busy)`` of one (at least 1: a quiet machine)."""
    return max(1.0, (load + busy) / max(1, cores))


# A process computing on several threads where more threads are runnable than there are cores runs
# far slower than the cores' share says: each of its many small operations ends at a barrier that
# waits for every one of its threads to be scheduled. Measured on the embedded model (async_mode=sync,
# 2 threads, load 5-7 on 2 cores): 5.6x the wall time of the same run on one thread
# (benchmarks/results/2026-12-01_98d4ed4_walltime-estimate.md); one measurement, so its range is wide.
OVERSUBSCRIBED_THREADS = (3.0, 5.6, 8.0)


def oversubscribed(e: Estimate, stretch: float) -> tuple[float, float, float] | None:
    """(low, central, high) factors on ``e`` where its processes' threads would wait on each other
    (several threads a process, a machine with more runnable threads than cores); None where not."""
    if e.threads <= 1 or stretch <= 1.0:
        return None
    x = thread_speedup(e.threads)  # the estimate counted on that speed-up: none is left, and more
    return tuple(f * x for f in OVERSUBSCRIBED_THREADS)  # type: ignore[return-value]


def oversubscribed_note(threads: int) -> str:
    return (
        f"{threads} threads a process on a machine with more runnable threads than cores: its small "
        f"operations wait for all {threads} threads; measured {OVERSUBSCRIBED_THREADS[1]:g}x slower than "
        "one thread, counted; trainer.threads=1 avoids it"
    )


def at_load(e: Estimate, load: float, cores: int) -> Estimate:
    """``e`` (a quiet machine's) at ``load`` on ``cores`` cores."""
    s = load_stretch(load, e.busy_threads, cores)
    lo, mid, hi = oversubscribed(e, s) or (1.0, 1.0, 1.0)
    notes = e.notes + ((oversubscribed_note(e.threads),) if mid > 1.0 else ())
    return replace(
        e,
        total=e.total * s * mid,
        lo=e.lo * s * lo,
        hi=e.hi * s * hi,
        stretch=s * mid,
        load=load,
        cores=cores,
        notes=notes,
    )


def estimate(cfg, layout=None, *, probes: dict | None = None, load: bool = True) -> Estimate | Unknown:
    """The wall time of the run of ``cfg`` laid out as ``layout`` (default: as ``python train.py``
    would run it here), at the machine's present load (``load=False``: a quiet machine's, as a sweep
    wants its runs' to stretch them for its own concurrency). ``probes``: a cache of probe results
    shared by the runs of a sweep (one probe per architecture, shapes and threads)."""
    from scalerl import layout as layout_mod
    from scalerl.config import typed

    config = typed(cfg)  # read once; each step below gets its own options
    if layout is None:
        options = layout_mod.LayoutOptions.of(config)
        layout = layout_mod.plan(options, layout_mod.launch_from_launcher(config.launcher, config.trainer))
    if _on_gpu(layout):
        return Unknown(
            "the run would compute on GPUs, whose speed a probe on this machine's CPU does not tell"
        )
    if layout.launch.kind == "slurm":
        return Unknown("a SLURM job runs on its nodes, whose speed and queue this machine does not know")
    if layout.trainers > 1:
        return Unknown(f"{layout.trainers} trainer ranks: only a single trainer's step is probed")
    w = work(**{g: getattr(config, g) for g in WORK_GROUPS})
    gen_threads, train_threads, apart, _ = _threads(layout)
    # the HF generator decodes through its lean forward on one thread (its compiled loops are
    # single-threaded; the static cache is the GPU's path)
    lean = (
        w.generator == "hf"
        and not bool(getattr(config.generator, "static_cache", False))
        and gen_threads == 1
    )
    key = (
        repr(dataclasses.asdict(config.model)),
        repr(dataclasses.asdict(config.precision)),
        lean,
        w.gen_rows,
        w.eval_rows,
        w.prompt_tokens,
        w.new_tokens,
        w.samples,
    )
    cache = probes if probes is not None else {}
    if key not in cache:
        cache[key] = probe(config.model, w, config.precision, lean=lean)
    p = cache[key]
    if isinstance(p, str):
        return Unknown(p)
    quiet = combine(w, p, gen_threads=gen_threads, train_threads=train_threads, apart=apart)
    return at_load(quiet, *machine_load()) if load else quiet


# ---------------------------------------------------------------------------- sweeps
@dataclass(frozen=True)
class SweepEstimate:
    total: float
    lo: float
    hi: float
    runs: int
    at_once: int
    run_s: float  # the mean run's central estimate, when run alone
    stretch: float  # how much longer each run takes beside the others and the machine's load
    unknown: tuple[str, ...] = field(default_factory=tuple)
    load: float = 0.0
    cores: int = 1
    oversubscribed_threads: int = 0  # >1: its runs' threads wait on each other (counted; said)

    def line(self) -> str:
        if not self.runs:
            return "estimated wall time: not estimated here (" + "; ".join(self.unknown) + ")"
        shared = (
            f", each ~{self.stretch:.1f}x slower for the cores it shares (load {self.load:.1f} "
            f"on {self.cores} cores before the sweep)"
            if self.stretch > 1.05
            else ""
        )
        left = (
            f"; {len(self.unknown)} kind(s) of run not estimated: " + "; ".join(self.unknown)
            if self.unknown
            else ""
        )
        threads = (
            f" ({oversubscribed_note(self.oversubscribed_threads)})" if self.oversubscribed_threads else ""
        )
        return (
            f"estimated wall time: about {span(self.total, self.lo, self.hi)} on this machine: "
            f"{self.runs} runs x ~{seconds_text(self.run_s)} each alone on a quiet machine, {self.at_once} at once"
            f"{shared}{threads}{left}"
        )


def schedule(durations: Iterable[float], at_once: int) -> float:
    """Wall time of running ``durations`` in order, ``at_once`` at a time (a new one starts when one
    ends, as the local launcher does)."""
    slots = [0.0] * max(1, at_once)
    for d in durations:
        i = min(range(len(slots)), key=slots.__getitem__)
        slots[i] += d
    return max(slots)


def sweep_estimate(
    estimates: list[Estimate | Unknown], at_once: int, cores: int, load: float = 0.0
) -> SweepEstimate:
    """The wall time of a sweep's runs (their quiet-machine :class:`Estimate`, each with its thread
    share), ``at_once`` at a time on ``cores`` cores where others keep ``load`` runnable: runs side
    by side share the cores, so each is stretched by :func:`load_stretch` of the runs at once."""
    known = [e for e in estimates if isinstance(e, Estimate)]
    unknown = tuple(dict.fromkeys(e.why for e in estimates if isinstance(e, Unknown)))
    if not known:
        return SweepEstimate(0.0, 0.0, 0.0, 0, at_once, 0.0, 1.0, unknown)
    parallel = max(1, min(at_once, len(known)))
    busy = sum(e.busy_threads for e in known) / len(known)
    stretch = load_stretch(load, parallel * busy, cores)
    factors = [oversubscribed(e, stretch) or (1.0, 1.0, 1.0) for e in known]
    total, lo, hi = (
        schedule([getattr(e, a) * stretch * f[i] for e, f in zip(known, factors)], parallel)
        for i, a in ((1, "total"), (0, "lo"), (2, "hi"))
    )
    threads = max((e.threads for e, f in zip(known, factors) if f[1] > 1.0), default=0)
    run_s = sum(e.total for e in known) / len(known)
    return SweepEstimate(total, lo, hi, len(known), parallel, run_s, stretch, unknown, load, cores, threads)
