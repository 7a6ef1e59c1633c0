"""The trainer: recompute log-probs under the precision policy, apply the loss, take an AdamW step.

Loss and aggregation come from :mod:`scalerl.algo` (paper Sec. 3.2); the optimiser is AdamW with a
linear warm-up to a constant learning rate (paper Sec. 2: constant LR after 100 warm-up steps).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from scalerl import algo
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights
from scalerl.trainer.batch import TrainBatch


class NonFiniteError(RuntimeError):
    """Too many consecutive optimiser steps had a non-finite loss or gradient."""


def loss_params(loss_cfg) -> dict:
    spec = algo.LOSSES[loss_cfg.name]
    return {k: loss_cfg[k] for k in spec.params}


class TorchTrainer:
    # a length bucket costs one more (small) forward/backward: worth about this many padded tokens
    bucket_overhead_tokens = 256

    def __init__(
        self, model: nn.Module, precision: Precision, cfg, *, temperature: float, device: torch.device
    ):
        self.model = model
        self.precision = precision
        self.cfg = cfg
        self.tcfg = cfg.trainer
        self.loss_name = cfg.loss.name
        self.loss_kwargs = loss_params(cfg.loss)
        self.aggregation = cfg.aggregation.name
        self.temperature = temperature
        self.device = device
        self.nonfinite_total = 0
        self.nonfinite_consecutive = 0
        self.world, self.rank = 1, 0  # trainer processes, and this one's rank
        self._build_optimizer()

    # ------------------------------------------------------------------ setup
    def _build_optimizer(self) -> None:
        t = self.tcfg
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=t.lr,
            betas=tuple(t.betas),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        warm = max(0, t.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )

    @property
    def module(self) -> nn.Module:
        """The plain model (DeepSpeed wraps it)."""
        return self.model

    # ------------------------------------------------------------------ log-probs
    def token_logprobs(self, batch: TrainBatch, *, with_entropy: bool = False, prefixes="auto"):
        """Log-prob of every target token from position ``batch.start`` on, under the precision policy.

        ``prefixes``: the rows' shared prompt prefixes for :meth:`hidden_states` (None: one plain
        pass); ``"auto"``: :meth:`shared_prefixes`."""
        model = self.module
        if isinstance(prefixes, str):
            prefixes = self.shared_prefixes(batch)
        with self.precision.autocast(model):
            hidden = self.hidden_states(model.get_decoder(), batch, prefixes)
        logits = self.precision.logits(model, hidden)
        logp_all = self.precision.log_softmax(logits, self.temperature)
        targets = batch.input_ids[:, batch.start + 1 :]
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
        entropy = None
        if with_entropy:
            with torch.no_grad():
                lp = logp_all.float()
                entropy = -(lp.exp() * lp).sum(-1)
        return logp, entropy

    def shared_prefixes(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the distinct first ``start`` tokens of the rows, each row's index into them) when
        ``trainer.share_prompts`` is on and some rows share them; else None."""
        ids, s = batch.input_ids, batch.start
        if not (self.tcfg.share_prompts and 0 < s < ids.shape[1] - 1 and ids.shape[0] > 1):
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
        instead of one (ZeRO-3 ranks must agree on which)."""
        ids, s = batch.input_ids, batch.start
        if prefixes is not None:
            distinct, rows = prefixes
            cache = body(input_ids=distinct, use_cache=True).past_key_values
            if cache is None:
                raise RuntimeError(
                    f"trainer.share_prompts=true needs {type(body).__name__} to return its KV cache "
                    "(use_cache); set trainer.share_prompts=false"
                )
            cache.reorder_cache(rows)  # one copy of its prefix's keys and values per row
            return body(input_ids=ids[:, s:-1], past_key_values=cache, use_cache=False).last_hidden_state
        return body(input_ids=ids[:, :-1], use_cache=False).last_hidden_state[:, s:]

    def bucketed_logprobs(self, batch: TrainBatch, *, with_entropy: bool = False):
        """:meth:`token_logprobs` without the padding waste: rows are grouped by length into a few
        buckets, each run only up to its own last trained token, and the results put back in row
        order (zeros past a row's end, where the mask is 0). The same values as one padded pass:
        right padding never reaches earlier positions through the causal attention."""
        need = _trained_lengths(batch)  # target positions [0, need) hold every trained token
        width = batch.mask.shape[1]
        buckets = length_buckets(need.tolist(), start=batch.start, overhead=self.bucket_overhead_tokens)
        if len(buckets) == 1 and buckets[0][1] >= width:
            return self.token_logprobs(batch, with_entropy=with_entropy)
        parts, ents, order = [], [], []
        for rows, m in buckets:
            sub = _rows_upto(batch, torch.as_tensor(rows, dtype=torch.long, device=batch.mask.device), m)
            logp, entropy = self.token_logprobs(sub, with_entropy=with_entropy)
            pad = width - m
            parts.append(nn.functional.pad(logp, (0, pad)))
            if with_entropy:
                ents.append(nn.functional.pad(entropy, (0, pad)))
            order.extend(rows)
        inverse = torch.empty(len(order), dtype=torch.long, device=batch.mask.device)
        inverse[torch.as_tensor(order, dtype=torch.long, device=batch.mask.device)] = torch.arange(
            len(order), device=batch.mask.device
        )
        logp = torch.cat(parts)[inverse]
        entropy = torch.cat(ents)[inverse] if with_entropy else None
        return logp, entropy

    # ------------------------------------------------------------------ one step
    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        mbs = self.tcfg.micro_batch_size
        G = batch.num_groups
        if not mbs or mbs >= batch.num_sequences:
            return [batch]
        gpm = max(1, mbs // self.tcfg.generations_per_prompt)
        return [batch.slice_groups(lo, min(G, lo + gpm)) for lo in range(0, G, gpm)]

    def step(self, batch: TrainBatch | None) -> dict[str, float]:
        """One optimiser step on ``batch``; returns training statistics (None: nothing to train on,
        the step is skipped).

        A non-finite loss or gradient skips the step (counted); ``max_nonfinite_steps`` consecutive
        ones raise :class:`NonFiniteError`.
        """
        if batch is None or not batch.num_sequences:
            return {"train/nonfinite_skipped": float(self.nonfinite_total), "train/step_skipped": 1.0}
        self.module.train()
        batch = batch.to(self.device)
        totals = {
            "tokens": float(batch.mask.sum()),
            "sequences": float((batch.mask.sum(-1) > 0).sum()),
            "groups": float(batch.num_groups),
        }
        acc, stats_acc = self._new_accumulators()
        self._zero_grad()
        finite = True
        for mb in self.micro_batches(batch):
            logp, entropy = self.bucketed_logprobs(mb, with_entropy=True)
            scaled = self._scaled_loss(mb, logp, totals)
            if not torch.isfinite(scaled):
                finite = False
                break
            self._backward(scaled)
            self._accumulate(acc, stats_acc, mb, logp, entropy, scaled)
        grad_norm = self._clip_and_step() if finite else float("nan")
        ok = finite and math.isfinite(grad_norm)
        if not ok:
            self._zero_grad()
        return self._step_stats(ok, grad_norm, acc, stats_acc)

    # ------------------------------------------------------------------ step pieces (shared with DeepSpeed)
    @staticmethod
    def _new_accumulators() -> tuple[dict[str, float], dict[str, float]]:
        return {"loss": 0.0, "ent_sum": 0.0, "ent_n": 0.0, "diff_sum": 0.0}, {}

    def _scaled_loss(
        self, mb: TrainBatch, logp: torch.Tensor, totals: dict, real: bool = True
    ) -> torch.Tensor:
        """The configured loss on one micro-batch, weighted for its share of the whole batch
        (``real=False``: a padding micro-batch, weight 0)."""
        mask = mb.mask[:, mb.start :]
        loss = algo.policy_loss(
            self.loss_name,
            logp,
            mb.gen_logp[:, mb.start :],
            mb.advantages,
            mask,
            mb.group_ids,
            self.aggregation,
            **self.loss_kwargs,
        )
        weight = algo.aggregation_weight(self.aggregation, mask, mb.group_ids, totals) if real else 0.0
        return loss * weight

    def _accumulate(self, acc, stats_acc, mb: TrainBatch, logp, entropy, scaled) -> None:
        """Add one micro-batch's loss, loss statistics, entropy and generator/trainer mismatch."""
        mask = mb.mask[:, mb.start :]
        gen_logp = mb.gen_logp[:, mb.start :]
        acc["loss"] += float(scaled.detach())
        with torch.no_grad():
            st = algo.loss_stats(
                self.loss_name, logp.detach(), gen_logp, mb.advantages, mask, **self.loss_kwargs
            )
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
            if self.nonfinite_consecutive >= self.tcfg.max_nonfinite_steps:
                raise NonFiniteError(
                    f"{self.nonfinite_consecutive} consecutive optimiser steps had a non-finite loss or "
                    f"gradient (trainer.max_nonfinite_steps={self.tcfg.max_nonfinite_steps}); stopping"
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
        return out

    # ------------------------------------------------------------------ engine hooks
    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.tcfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.tcfg.grad_clip)
        else:
            norm = (
                torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
                if params
                else torch.zeros(())
            )
        norm = float(norm)
        if not math.isfinite(norm):
            return norm
        self.optimizer.step()
        self.scheduler.step()
        return norm

    # ------------------------------------------------------------------ weights and checkpoints
    def gathered(self):
        """Context in which every parameter is whole (the plain torch module always is)."""
        return contextlib.nullcontext()

    def policy_weights(self) -> PolicyWeights:
        """The policy's weights, by reference, for a generator."""
        return PolicyWeights(self.module, self.gathered)

    def save_engine_checkpoint(self, path: str, tag: str, rank_state: dict | None = None) -> str | None:
        """Nothing to write: the whole trainer state is in :meth:`state_dict`."""
        return None

    def load_engine_checkpoint(self, path: str, tag: str | None) -> dict | None:
        return None

    def weights_for_generator(self) -> dict[str, torch.Tensor]:
        """The full model weights (fp32, CPU) to hand to a generator."""
        return {k: v.detach() for k, v in self.module.state_dict().items()}

    def state_dict(self) -> dict:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "nonfinite_total": self.nonfinite_total,
        }

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite_total = state.get("nonfinite_total", 0)


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
