"""The trainer: recompute log-probs under the precision policy, apply the loss, take an optimiser step.

One step, written once over an :class:`~scalerl.trainer.engine.Engine` (plain PyTorch, DeepSpeed).
Loss and aggregation come from :mod:`scalerl.algo` (paper Sec. 3.2). A step's forward passes skip
the padding waste (rows grouped by length into a few buckets) and run a group's shared prompt once
(``trainer.share_prompts``). Memory: the LM head runs over ``trainer.logits_chunk_tokens`` positions
at a time, each chunk recomputed in the backward (:func:`~scalerl.model.precision.head_logprobs`),
so a micro-batch's [tokens, vocabulary] logits are never held at once; ``trainer.activation_checkpointing``
recomputes the transformer blocks in the backward too.

Several processes (data parallel, ``world`` > 1): each rank trains on its own groups, and the step
equals one optimiser step on the union of all ranks' groups:

* the aggregation denominators (tokens, sequences or groups of the whole step) are summed over the
  ranks, and each rank's loss is multiplied by the world size, because the engine *averages*
  gradients: the averaged gradient is then that of the global ``prompt``/``sample``/``token`` mean;
* every rank makes the same model calls, forward and backward (ZeRO-3 gathers a submodule's
  parameters collectively around each of its forwards and backwards): the ranks agree, in one
  all-reduce, on a plan of passes per micro-batch (how many length buckets, and whether each runs
  its shared prompts separately); a rank with fewer micro-batches or buckets runs padding passes
  over a tiny dummy batch, whose output enters the loss with weight 0 so that its backward runs too;
* a non-finite loss on any rank makes every rank's gradient non-finite (the local loss is poisoned
  with NaN, and the finite flag is all-reduced), so every rank skips the same step;
* the statistics returned are those of the whole step (summed or token-weighted over the ranks).

In one process all of this reduces to the plain step: the plan is the rank's own and the
collectives are identities.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from scalerl import algo
from scalerl.config.groups.correction import CorrectionOption
from scalerl.config.groups.loss import LossOption
from scalerl.config.groups.trainer import TorchTrainerOption
from scalerl.config.options import Option
from scalerl.distributed import merge_stats
from scalerl.model.kv_cache import decoder, output_cache, with_cache
from scalerl.model.precision import head_logprobs
from scalerl.model.weights import PolicyWeights
from scalerl.trainer.batch import TrainBatch
from scalerl.trainer.engine import Engine


class NonFiniteError(RuntimeError):
    """Too many consecutive optimiser steps had a non-finite loss or gradient."""


def loss_params(loss) -> dict:
    """The loss function's keyword parameters from its ``loss`` option (the registry names them)."""
    spec = algo.LOSSES[loss.name]
    return {k: getattr(loss, k) for k in spec.params}


@dataclass
class _Pass:
    """One forward pass of a micro-batch: some of its rows, cut to their own length."""

    batch: TrainBatch
    rows: list[int] | None  # their indices in the micro-batch (None: every row, uncut)
    width: int  # target positions [0, width) of the micro-batch it covers
    prefixes: tuple[torch.Tensor, torch.Tensor] | None  # shared prompt prefixes it can use


class Trainer:
    # a length bucket costs one more (small) forward/backward: worth about this many padded tokens
    bucket_overhead_tokens = 256
    max_buckets = 4

    def __init__(
        self,
        engine: Engine,
        precision,
        *,
        trainer: TorchTrainerOption,
        loss: LossOption,
        aggregation: Option,
        correction: CorrectionOption,
        temperature: float,
    ):
        """``trainer``, ``loss``, ``aggregation``, ``correction``: the run's options of those groups;
        the correction option says what a field it lacks (``none``'s threshold) amounts to."""
        self.engine = engine
        self.precision = engine.adapt_precision(precision)
        self.options = trainer
        self.loss_name = loss.name
        self.loss_kwargs = loss_params(loss)
        self.correction = correction.correction()
        self.aggregation = aggregation.name
        self.temperature = temperature
        self.nonfinite_total = 0
        self.nonfinite_consecutive = 0
        # rows grouped by length into buckets, each run only up to its own last trained token
        self.bucket_lengths = True
        # the LM head runs over this many positions at a time (0: a micro-batch's all at once)
        self.logits_chunk_tokens = int(self.options.logits_chunk_tokens)
        self.activation_checkpointing = bool(self.options.activation_checkpointing)
        if self.activation_checkpointing:
            enable_activation_checkpointing(self.module)
        mmap_mb = int(self.options.malloc_mmap_threshold_mb)
        # glibc hands freed memory back: large blocks at once (mmap), the heap after each micro-batch
        self._trim = mmap_mb > 0 and self.device.type == "cpu" and set_malloc_mmap_threshold(mmap_mb)

    # ------------------------------------------------------------------ what the loop sees
    @property
    def module(self) -> nn.Module:
        """The plain policy (an engine may wrap it)."""
        return self.engine.module

    def weights_finite(self) -> bool:
        """Whether every weight, on every rank, is finite (collective)."""
        local = all(bool(torch.isfinite(w).all()) for w in self.engine.local_weights())
        return self.engine.all_reduce([1.0 if local else 0.0], "min")[0] == 1.0

    @property
    def world(self) -> int:
        return self.engine.world

    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.engine.optimizer

    @property
    def scheduler(self):
        return self.engine.scheduler

    def gathered(self):
        """Context in which every parameter of :attr:`module` is whole (ZeRO-3: gathered, collective)."""
        return self.engine.gathered()

    def policy_weights(self) -> PolicyWeights:
        return PolicyWeights(self.module, self.engine.gathered, self.engine.gather_params)

    # ------------------------------------------------------------------ log-probs
    def token_logprobs(self, batch: TrainBatch, *, with_entropy: bool = False):
        """Log-prob (and entropy) of every target token from position ``batch.start`` on, under the
        precision policy, in one pass (shared prompts run once where :meth:`shared_prefixes` finds
        them). Not collective: under ZeRO-3 with several ranks, only where every rank calls it on a
        batch that takes the same path."""
        return self.engine.forward(self._logprobs, batch, with_entropy, self.shared_prefixes(batch))

    def _logprobs(self, batch: TrainBatch, with_entropy: bool, prefixes):
        model = self.module
        with self.precision.autocast(model):
            hidden = self.hidden_states(decoder(model), batch, prefixes)
        targets = batch.input_ids[:, batch.start + 1 :]
        return head_logprobs(
            self.precision,
            model,
            hidden,
            targets,
            self.temperature,
            with_entropy=with_entropy,
            chunk_tokens=self.logits_chunk_tokens,
        )

    def shared_prefixes(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the distinct first ``start`` tokens of the rows, each row's index into them) when
        ``trainer.share_prompts`` is on and some rows share them; else None."""
        ids, s = batch.input_ids, batch.start
        # a checkpointed layer would write the prefix's KV cache again when the backward replays it
        share = self.options.share_prompts and not self.activation_checkpointing
        if not (share and 0 < s < ids.shape[1] - 1 and ids.shape[0] > 1):
            return None
        prefixes, rows = torch.unique(ids[:, :s], dim=0, return_inverse=True)
        return (prefixes, rows) if prefixes.shape[0] < ids.shape[0] else None

    @staticmethod
    def hidden_states(
        body: nn.Module, batch: TrainBatch, prefixes: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """The body's last hidden states at target positions [start, L-1), the ones that predict
        completion tokens.

        With ``prefixes`` (:meth:`shared_prefixes`) the positions before ``start`` (every row's
        prompt, or its first ``min prompt length - 1`` tokens) are computed once per distinct
        prefix, not once per sample: the G samples of a group share their prompt. The prefix's KV
        cache is repeated for its rows (the backward sums their gradients back into it) and the
        rest of each row attends to it. The same values as one pass over every row, since causal
        attention never lets a prefix position see what follows it; with G=8 and the embedded
        task's 10-token prompts, 16% fewer positions go through the model. Two calls of ``body``
        instead of one."""
        ids, s = batch.input_ids, batch.start
        if prefixes is not None:
            distinct, rows = prefixes
            cache = output_cache(body(input_ids=distinct, use_cache=True))
            if cache is None:
                raise RuntimeError(
                    f"trainer.share_prompts=true needs {type(body).__name__} to return its KV cache "
                    "(use_cache); set trainer.share_prompts=false"
                )
            cache.reorder_cache(rows)  # one copy of its prefix's keys and values per row
            return body(input_ids=ids[:, s:-1], **with_cache(body, cache), use_cache=False).last_hidden_state
        return body(input_ids=ids[:, :-1], use_cache=False).last_hidden_state[:, s:]

    def passes(self, mb: TrainBatch) -> list[_Pass]:
        """The forward passes of a micro-batch: its rows grouped by length into a few buckets
        (:func:`length_buckets`), each cut to its own last trained token; one pass over every row
        where that saves nothing. The same values as one padded pass: right padding never reaches
        earlier positions through the causal attention."""
        width = mb.mask.shape[1]
        if self.bucket_lengths:
            need = _trained_lengths(mb)  # target positions [0, need) hold every trained token
            buckets = length_buckets(
                need.tolist(),
                start=mb.start,
                overhead=self.bucket_overhead_tokens,
                max_buckets=self.max_buckets,
            )
        else:
            buckets = [(list(range(mb.num_sequences)), width)]
        if len(buckets) == 1 and buckets[0][1] >= width:
            return [_Pass(mb, None, width, self.shared_prefixes(mb))]
        out = []
        for rows, m in buckets:
            sub = _rows_upto(mb, torch.as_tensor(rows, dtype=torch.long, device=mb.mask.device), m)
            out.append(_Pass(sub, rows, width, self.shared_prefixes(sub)))
        return out

    def _micro_batch_logprobs(self, passes: list[_Pass], shared: list[bool], with_entropy: bool):
        """(log-probs, entropy, padding) of a micro-batch from its ``passes`` and padding passes
        (``shared``: a flag per pass, real ones first: run the shared prompts separately; padding
        passes fill the rest).

        The padding passes' output enters the log-probs with weight 0; without real passes,
        (None, None, the sum of the padding passes' log-probs). Either way exactly one returned
        tensor needs a gradient: ZeRO-3 runs a backward hook per such output of a forward, and the
        ranks' hooks must match."""
        outs = [
            self._logprobs(p.batch, with_entropy, p.prefixes if share else None)
            for p, share in zip(passes, shared)
        ]
        pad = None
        for share in shared[len(passes) :]:
            dummy, prefixes = self._padding_batch()
            lp, _ = self._logprobs(dummy, False, prefixes if share else None)
            pad = lp.sum() if pad is None else pad + lp.sum()
        if not passes:
            return None, None, pad
        if passes[0].rows is None:
            logp, entropy = outs[0]
            return (logp if pad is None else logp + pad * 0.0), entropy, None
        width = passes[0].width
        device = passes[0].batch.mask.device
        parts, ents, order = [], [], []
        for p, (logp, entropy) in zip(passes, outs):
            cut = width - p.batch.mask.shape[1]
            parts.append(nn.functional.pad(logp, (0, cut)))
            if with_entropy:
                ents.append(nn.functional.pad(entropy, (0, cut)))
            order.extend(p.rows)
        inverse = torch.empty(len(order), dtype=torch.long, device=device)
        inverse[torch.as_tensor(order, dtype=torch.long, device=device)] = torch.arange(
            len(order), device=device
        )
        logp = torch.cat(parts)[inverse]
        entropy = torch.cat(ents)[inverse] if with_entropy else None
        return (logp if pad is None else logp + pad * 0.0), entropy, None

    def _padding_batch(self) -> tuple[TrainBatch, tuple[torch.Tensor, torch.Tensor]]:
        """A batch with no trained token for a padding pass, and its shared prefix: two rows of
        padding that share a one-token prompt, so that the pass can take either path."""
        dev = self.device
        ids = torch.zeros((2, 3), dtype=torch.long, device=dev)
        zeros = torch.zeros((2, 2), device=dev)
        batch = TrainBatch(
            input_ids=ids,
            mask=zeros,
            gen_logp=zeros.clone(),
            versions=torch.full((2, 2), -1, dtype=torch.long, device=dev),
            advantages=torch.zeros(2, device=dev),
            group_ids=torch.zeros(2, dtype=torch.long, device=dev),
            start=1,
        )
        return batch, (ids[:1, :1], torch.zeros(2, dtype=torch.long, device=dev))

    def _agree(self, passes: list[list[_Pass]]) -> list[list[bool]]:
        """Per micro-batch, one flag per pass that every rank runs (True: its shared prompts
        separately): as many passes as the rank with the most, a flag True where every rank's pass
        can share (a padding pass can either way). One all-reduce."""
        if self.world == 1:
            return [[p.prefixes is not None for p in ps] for ps in passes]
        k = self.max_buckets
        vec: list[float] = []
        for ps in passes:
            vec.append(float(len(ps)))
            vec.extend(1.0 if j < len(ps) and ps[j].prefixes is None else 0.0 for j in range(k))
        agreed = self.engine.all_reduce(vec, "max")
        out = []
        for i in range(len(passes)):
            row = agreed[i * (k + 1) : (i + 1) * (k + 1)]
            out.append([row[1 + j] == 0.0 for j in range(int(row[0]))])
        return out

    # ------------------------------------------------------------------ one step
    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        mbs = self.options.micro_batch_size
        G = batch.num_groups
        if not mbs or mbs >= batch.num_sequences:
            return [batch]
        gpm = max(1, mbs // self.options.generations_per_prompt)
        return [batch.slice_groups(lo, min(G, lo + gpm)) for lo in range(0, G, gpm)]

    def step(self, batch: TrainBatch | None) -> dict[str, float]:
        """One optimiser step on ``batch`` (this rank's share; None: nothing left on this rank);
        returns the step's training statistics. Collective when ``world`` > 1: every rank calls it
        at the same step.

        A non-finite loss or gradient skips the step (counted); ``max_nonfinite_steps`` consecutive
        ones raise :class:`NonFiniteError`.
        """
        eng = self.engine
        self.module.train()
        mbs: list[TrainBatch] = []
        local = [0.0, 0.0, 0.0]
        if batch is not None and batch.num_sequences:
            batch = batch.to(self.device)
            local = [float(batch.mask.sum()), float((batch.mask.sum(-1) > 0).sum()), float(batch.num_groups)]
            mbs = self.micro_batches(batch)
        tokens, sequences, groups = eng.all_reduce(local, "sum")
        totals = {"tokens": tokens, "sequences": sequences, "groups": groups}
        n_mb = int(eng.all_reduce([len(mbs)], "max")[0])
        if n_mb == 0:  # nothing to train on any rank
            return {"train/nonfinite_skipped": float(self.nonfinite_total), "train/step_skipped": 1.0}
        passes = [self.passes(mb) for mb in mbs] + [[] for _ in range(n_mb - len(mbs))]
        shared = self._agree(passes)

        acc, stats_acc = {"loss": 0.0, "ent_sum": 0.0, "ent_n": 0.0, "diff_sum": 0.0}, {}
        finite = True
        eng.zero_grad()
        for i in range(n_mb):
            mb = mbs[i] if i < len(mbs) else None
            eng.set_accumulation_boundary(i == n_mb - 1)
            logp, entropy, pad = eng.forward(self._micro_batch_logprobs, passes[i], shared[i], True)
            if mb is None:  # padding passes only: weight 0, but their backward runs
                eng.backward(pad * 0.0)
                continue
            scaled = loss = self._scaled_loss(mb, logp, totals)
            if not bool(torch.isfinite(loss)):
                # every rank's gradient becomes non-finite once the engine averages it: the step is
                # skipped on all ranks alike (0 * NaN is NaN, so every reached parameter is hit)
                finite = False
                loss = loss * float("nan")
            eng.backward(loss * self.world if self.world > 1 else loss)
            if finite:
                self._accumulate(acc, stats_acc, mb, logp, entropy, scaled)
            if self._trim:
                malloc_trim()
        if self.world > 1:
            finite = bool(eng.all_reduce([1.0 if finite else 0.0], "min")[0])
        parts = eng.gather_objects((acc, stats_acc))
        acc = merge_stats([p[0] for p in parts], summed={k for p in parts for k in p[0]})
        stats_acc = merge_stats(
            [p[1] for p in parts], summed={k for p in parts for k in p[1] if not k.endswith("_max")}
        )
        grad_norm = eng.clip_and_step(finite)
        ok = finite and math.isfinite(grad_norm)
        # the gradients are not kept until the next step: generation runs between the two, and on
        # one process (the HF generator) they would sit beside its KV cache (540 MB at 135M, fp32)
        eng.zero_grad()
        return self._step_stats(ok, grad_norm, acc, stats_acc)

    def _scaled_loss(self, mb: TrainBatch, logp: torch.Tensor, totals: dict) -> torch.Tensor:
        """The configured loss on one micro-batch, weighted for its share of the whole batch."""
        mask = mb.mask[:, mb.start :]
        loss = algo.policy_loss(
            self.loss_name,
            logp,
            mb.gen_logp[:, mb.start :],
            mb.advantages,
            mask,
            mb.group_ids,
            self.aggregation,
            correction=self.correction,
            **self.loss_kwargs,
        )
        return loss * algo.aggregation_weight(self.aggregation, mask, mb.group_ids, totals)

    def _accumulate(self, acc, stats_acc, mb: TrainBatch, logp, entropy, scaled) -> None:
        """Add one micro-batch's loss, loss statistics, entropy and generator/trainer mismatch."""
        mask = mb.mask[:, mb.start :]
        gen_logp = mb.gen_logp[:, mb.start :]
        acc["loss"] += float(scaled.detach())
        with torch.no_grad():
            st = algo.loss_stats(
                self.loss_name,
                logp.detach(),
                gen_logp,
                mb.advantages,
                mask,
                correction=self.correction,
                **self.loss_kwargs,
            )
            for k, v in algo.mismatch_sums(logp.detach(), gen_logp, mask, self.correction).items():
                acc[f"mismatch_{k}"] = acc.get(f"mismatch_{k}", 0.0) + v
            ntok = float(mask.sum())
            for k, v in st.items():
                if k.endswith("_max"):
                    stats_acc[k] = max(stats_acc.get(k, -math.inf), v)
                else:
                    stats_acc[k] = stats_acc.get(k, 0.0) + v * ntok
            acc["ent_sum"] += float((entropy * mask).sum())
            acc["diff_sum"] += float(((logp.detach() - gen_logp).abs() * mask).sum())
            acc["ent_n"] += ntok

    def _step_stats(self, ok: bool, grad_norm: float, acc: dict, stats_acc: dict) -> dict[str, float]:
        """The step's statistics; a skipped (non-finite) step is counted, and too many in a row raise."""
        if not ok:
            self.nonfinite_total += 1
            self.nonfinite_consecutive += 1
            if self.nonfinite_consecutive >= self.options.max_nonfinite_steps:
                raise NonFiniteError(
                    f"{self.nonfinite_consecutive} consecutive optimiser steps had a non-finite loss or "
                    f"gradient (trainer.max_nonfinite_steps={self.options.max_nonfinite_steps}); stopping"
                )
            return {"train/nonfinite_skipped": float(self.nonfinite_total), "train/step_skipped": 1.0}
        self.nonfinite_consecutive = 0
        n = max(acc["ent_n"], 1.0)
        out = {
            "train/loss": acc["loss"],
            "train/grad_norm": grad_norm,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/entropy": acc["ent_sum"] / n,
            "train/gen_train_logprob_diff": acc["diff_sum"] / n,
            "train/nonfinite_skipped": float(self.nonfinite_total),
            "train/step_skipped": 0.0,
        }
        for k, v in stats_acc.items():
            out[f"train/{k}"] = v if k.endswith("_max") else v / n
        sums = {k.removeprefix("mismatch_"): v for k, v in acc.items() if k.startswith("mismatch_")}
        if sums:
            out.update({f"mismatch/{k}": v for k, v in algo.finish_mismatch(sums).items()})
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """What the run's main checkpoint (rank 0's) holds: the engine's state (plain torch: model,
        optimiser, scheduler; DeepSpeed: nothing, its state is in its own checkpoint) and counters."""
        return {**self.engine.state_dict(), "nonfinite_total": self.nonfinite_total}

    def load_state_dict(self, state: dict) -> None:
        self.engine.load_state_dict(state)
        self.nonfinite_total = state.get("nonfinite_total", 0)

    def save_engine_checkpoint(self, path: str, tag: str, rank_state: dict | None = None) -> str | None:
        """The engine's own checkpoint ``path/tag`` with this rank's ``rank_state`` (collective);
        the tag written, or None for an engine whose whole state is in :meth:`state_dict`."""
        return self.engine.save_checkpoint(path, tag, rank_state)

    def load_engine_checkpoint(self, path: str, tag: str) -> dict | None:
        """Load the engine checkpoint ``path/tag``; returns this rank's ``rank_state`` (or None)."""
        return self.engine.load_checkpoint(path, tag)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Checkpoint every transformer block of ``model`` (a transformers model): the forward keeps only
    each block's input, the backward recomputes the block (one more forward of the body per step)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"trainer.activation_checkpointing=true: {type(model).__name__} does not support activation "
            "checkpointing; set trainer.activation_checkpointing=false"
        )
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x; 4.x: the old name
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@functools.cache
def _libc():
    """glibc, looked up once (``find_library`` runs ``ldconfig``; malloc_trim is called every micro-batch)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def malloc_trim() -> bool:
    """Have glibc return the free pages of its heaps to the system (``malloc_trim(0)``: also those
    between live blocks, which a step's many small tensors leave). True where it could."""
    try:
        libc = _libc()
        return bool(libc is not None and libc.malloc_trim(0) >= 0)
    except (OSError, AttributeError):  # not glibc
        return False


def set_malloc_mmap_threshold(mb: int) -> bool:
    """Have glibc serve every allocation of ``mb`` MB or more with its own mmap, returned to the
    system when freed (True where it could be set: Linux with glibc).

    By default glibc raises that threshold up to 32 MB as blocks are freed, so a trainer step's many
    activation tensors come from its heap, whose freed space the process keeps: measured at 135M
    (benchmarks/results/2026-11-26_*_trainer-memory.md) a step's resident peak was 7.1 GB by default
    and 3.1 GB with a 1 MB threshold, the same step."""
    try:
        libc = _libc()
        m_mmap_threshold = -3  # <malloc.h>
        return bool(libc is not None and libc.mallopt(m_mmap_threshold, int(mb) << 20))
    except (OSError, AttributeError):  # not glibc
        return False


# ---------------------------------------------------------------------- length buckets
def _trained_lengths(batch: TrainBatch) -> torch.Tensor:
    """Per row: one past the last target position with a non-zero mask (at least ``start + 1``)."""
    m = batch.mask != 0
    pos = torch.arange(1, m.shape[1] + 1, device=m.device).expand_as(m)
    last = torch.where(m, pos, torch.zeros_like(pos)).amax(1)
    return last.clamp_min(batch.start + 1)


def length_buckets(lengths: list[int], *, start: int, overhead: int, max_buckets: int = 4):
    """Split rows into at most ``max_buckets`` groups of similar length: [(row indices, length)].

    Minimises sum(rows x (bucket length - start)) + overhead x buckets over splits of the rows
    sorted by length (a small dynamic programme over the distinct lengths)."""
    values = sorted(set(lengths))
    count = [0] * len(values)
    where = {v: i for i, v in enumerate(values)}
    for x in lengths:
        count[where[x]] += 1
    n = len(values)
    cum = [0]
    for c in count:
        cum.append(cum[-1] + c)
    inf = float("inf")
    # best[k][j]: cost of the rows with the j smallest lengths in k buckets (the last one of length values[j-1])
    best = [[inf] * (n + 1) for _ in range(max_buckets + 1)]
    back = [[0] * (n + 1) for _ in range(max_buckets + 1)]
    best[0][0] = 0.0
    for k in range(1, max_buckets + 1):
        for j in range(1, n + 1):
            w = values[j - 1] - start
            for i in range(j):
                c = best[k - 1][i] + (cum[j] - cum[i]) * w + overhead
                if c < best[k][j]:
                    best[k][j], back[k][j] = c, i
    k = min(range(1, max_buckets + 1), key=lambda kk: best[kk][n])
    edges, j = [], n
    while k > 0:
        edges.append((back[k][j], j))
        j, k = back[k][j], k - 1
    out = []
    for i, j in reversed(edges):
        keep = set(values[i:j])
        out.append(([r for r, x in enumerate(lengths) if x in keep], values[j - 1]))
    return out


def _rows_upto(batch: TrainBatch, rows: torch.Tensor, width: int) -> TrainBatch:
    """Rows ``rows`` of ``batch``, cut to target positions [0, width) (input ids [0, width])."""
    return TrainBatch(
        input_ids=batch.input_ids[rows, : width + 1],
        mask=batch.mask[rows, :width],
        gen_logp=batch.gen_logp[rows, :width],
        versions=batch.versions[rows, :width],
        advantages=batch.advantages[rows],
        group_ids=batch.group_ids[rows],
        start=batch.start,
    )
