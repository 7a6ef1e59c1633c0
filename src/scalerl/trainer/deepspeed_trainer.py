"""DeepSpeed trainer: ZeRO stages 0-3 over torch.distributed (gloo on CPU, NCCL on GPUs).

Same loss, precision and statistics as :class:`TorchTrainer`; DeepSpeed owns gradient averaging
across processes, the optimiser step (a torch AdamW handed in, so no DeepSpeed C++ op is compiled)
and, for ZeRO-3, the partitioning of parameters. One process needs no launcher (the rank variables
are set here); more processes come from ``torchrun`` or the ``deepspeed`` launcher, which set them.

Several processes (data parallel): each rank trains on its own groups. The step is made to equal
one optimiser step on the union of all ranks' groups:

* the aggregation denominators (tokens, sequences or groups of the whole step) are summed over the
  ranks, and each rank's loss is multiplied by the world size, because DeepSpeed *averages*
  gradients: the averaged gradient is then that of the global ``prompt``/``sample``/``token`` mean;
* every rank runs the same number of forward/backward passes (ZeRO-2/3 communicate in them): a rank
  with fewer micro-batches, or none (all its groups filtered out), runs empty ones (zero loss);
* a non-finite loss on any rank makes every rank's gradient non-finite (the local loss is poisoned
  with NaN, and the finite flag is all-reduced), so every rank skips the same step: ZeRO-1/2/3 skip
  a step whose global gradient norm is not finite; for ZeRO-0 the trainer checks the averaged
  gradient itself (the same on every rank) and does not call ``step``;
* the statistics returned are those of the whole step (summed or token-weighted over the ranks).

Extra DeepSpeed settings can be merged into the generated config from the environment:
``SCALERL_DS_CONFIG='{"zero_optimization": {"stage3_param_persistence_threshold": 0}}'``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import socket
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalerl.trainer.batch import TrainBatch
from scalerl.trainer.torch_trainer import TorchTrainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _skip_shm_comm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory all-reduce op on CPU.

    DeepSpeed's torch comm backend builds ``deepspeed_shm_comm`` when it starts (60-75 s of C++
    compilation on first use, then cached under ``TORCH_EXTENSIONS_DIR``). Only DeepSpeed's
    *inference* all-reduce uses it; training collectives go through torch.distributed (gloo), so
    marking it unavailable changes nothing for training. ``SCALERL_DS_SHM_COMM=1`` keeps it.
    """
    if os.environ.get("SCALERL_DS_SHM_COMM") == "1":
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def import_deepspeed(device: torch.device):
    """The ``deepspeed`` module, on ``device``'s accelerator. DeepSpeed picks its accelerator once per
    process, when it is imported (CUDA wherever there is a GPU), so a CPU trainer asks for the CPU first."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise RuntimeError("trainer=deepspeed needs the extra: pip install -e '.[deepspeed]'") from e
    chosen = get_accelerator().device_name()
    if chosen != device.type:
        raise RuntimeError(
            f"trainer=deepspeed on {device.type}: DeepSpeed uses its {chosen!r} accelerator in this "
            f"process (set DS_ACCELERATOR={device.type} before deepspeed is imported)"
        )
    return deepspeed


def init_distributed(device: torch.device) -> None:
    """Initialise torch.distributed for DeepSpeed (single process: without a launcher)."""
    deepspeed = import_deepspeed(device)
    if "RANK" not in os.environ:
        os.environ.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
            }
        )
    if device.type == "cpu":
        _skip_shm_comm_op()
    # DeepSpeed's ZeRO calls these torch.distributed functions on every step
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    )
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl")


def _deep_update(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


class _HeadAsModule:
    """The precision policy, with the LM head computed *as the head module's forward*.

    ZeRO-3 gathers a module's parameters around that module's own forward (and again before its
    backward). :meth:`Precision.logits` reads ``head.weight`` directly, outside any forward of the
    head; running it as the head's forward gives DeepSpeed its usual hooks, with exactly the same
    arithmetic.
    """

    def __init__(self, precision):
        self._precision = precision

    def __getattr__(self, name):
        return getattr(self._precision, name)

    def logits(self, model, hidden: torch.Tensor) -> torch.Tensor:
        head = model.get_output_embeddings()
        head.forward = lambda h: self._precision.logits(model, h)  # an instance attribute, removed below
        try:
            return head(hidden)
        finally:
            del head.forward


class _EngineForward(nn.Module):
    """What DeepSpeed wraps: the policy, with each trainer forward pass run as this module's forward
    through ``engine(...)``. DeepSpeed keeps per-forward bookkeeping there (ZeRO-2/3 gradient
    accumulation across micro-batches, the ZeRO-3 prefetch trace), which calling the policy's
    submodules directly would skip."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


class DeepSpeedTrainer(TorchTrainer):
    # ------------------------------------------------------------------ setup
    def _build_optimizer(self) -> None:
        deepspeed = import_deepspeed(self.device)
        init_distributed(self.device)
        t = self.tcfg
        self.zero_stage = int(t.zero_stage)
        self.world = _world()
        self.rank = dist.get_rank()
        optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=t.lr,
            betas=tuple(t.betas),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        warm = max(0, t.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        zero: dict = {"stage": self.zero_stage}
        if self.zero_stage > 0:
            # DeepSpeed's default buckets hold 5e8 elements (2 GB in fp32, allocated and cleared on
            # the first step: seconds on a CPU); a bucket never needs to exceed the model
            n = sum(p.numel() for p in self.model.parameters())
            bucket = int(min(5e8, max(n, 1e5)))
            zero.update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
        if self.zero_stage == 3:
            zero.pop("allgather_bucket_size")
            zero["stage3_prefetch_bucket_size"] = bucket
            # DeepSpeed would otherwise replace torch.nn.functional.linear process-wide
            zero["memory_efficient_linear"] = False
        ds_config = {
            # one optimiser step per engine.step(); micro-batching is ours (TorchTrainer.micro_batches)
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": float(t.grad_clip) if t.grad_clip > 0 else 0.0,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": False},  # precision is applied by scalerl.model.precision
            "fp16": {"enabled": False},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        extra = os.environ.get("SCALERL_DS_CONFIG")
        if extra:
            _deep_update(ds_config, json.loads(extra))
        self.ds_config = ds_config
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=_EngineForward(self.model), optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        if self.zero_stage == 3:
            self.precision = _HeadAsModule(self.precision)
            self._register_parametrized_weights()

    def _register_parametrized_weights(self) -> None:
        """Emulated low precision puts layer weights behind torch parametrizations, which hold the
        real parameter in a child module whose forward never runs; ZeRO-3 must gather it around
        the layer's forward instead."""
        import deepspeed

        for module in self.module.modules():
            plist = getattr(module, "parametrizations", None)
            if plist is None:
                continue
            for name in list(plist.keys()):
                deepspeed.zero.register_external_parameter(module, plist[name].original)

    @property
    def module(self):
        return self.engine.module.policy

    def token_logprobs(self, batch: TrainBatch, *, with_entropy: bool = False, prefixes="auto"):
        return self.engine(super().token_logprobs, batch, with_entropy=with_entropy, prefixes=prefixes)

    # ------------------------------------------------------------------ one step
    def _empty_batch(self) -> TrainBatch:
        """A batch with no trained token: a forward/backward with zero loss and gradient, for a rank
        that has fewer micro-batches than another (the passes are collective under ZeRO). Two rows
        that share a one-token prompt, so that it can share prompts as the other ranks' micro-batches
        do (the ranks agree on it)."""
        pad = 0
        ids = torch.full((2, 3), pad, dtype=torch.long, device=self.device)
        zeros = torch.zeros((2, 2), device=self.device)
        return TrainBatch(
            input_ids=ids,
            mask=zeros,
            gen_logp=zeros.clone(),
            versions=torch.full((2, 2), -1, dtype=torch.long, device=self.device),
            advantages=torch.zeros(2, device=self.device),
            group_ids=torch.zeros(2, dtype=torch.long, device=self.device),
            start=1,
        )

    def step(self, batch: TrainBatch | None) -> dict[str, float]:
        """One optimiser step; ``batch`` is this rank's share (None: nothing left on this rank).

        Collective: with several processes every rank must call it at the same step.
        """
        self.module.train()
        world = self.world
        mbs = []
        local = [0.0, 0.0, 0.0]
        if batch is not None and batch.num_sequences:
            batch = batch.to(self.device)
            mbs = self.micro_batches(batch)
            local = [float(batch.mask.sum()), float((batch.mask.sum(-1) > 0).sum()), float(batch.num_groups)]
        n_real = len(mbs)
        n_mb = n_real
        if world > 1:
            sums = torch.tensor(local, dtype=torch.float64, device=self.device)
            dist.all_reduce(sums)
            local = sums.tolist()
            most = torch.tensor([n_real], dtype=torch.int64, device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            n_mb = int(most.item())
        totals = {"tokens": local[0], "sequences": local[1], "groups": local[2]}
        if n_mb == 0:  # nothing to train on any rank
            return {"train/nonfinite_skipped": float(self.nonfinite_total), "train/step_skipped": 1.0}
        mbs = mbs + [self._empty_batch() for _ in range(n_mb - n_real)]

        prefixes = [self.shared_prefixes(mb) for mb in mbs]
        if world > 1:
            # sharing calls the model twice per micro-batch: under ZeRO-3 each call gathers the
            # parameters collectively, so every rank takes the same path (shared where all can)
            flags = torch.tensor([p is not None for p in prefixes], dtype=torch.int64, device=self.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MIN)
            prefixes = [p if f else None for p, f in zip(prefixes, flags.tolist())]

        acc, stats_acc = self._new_accumulators()
        finite = True
        self.engine.zero_grad()
        for i, mb in enumerate(mbs):
            real = i < n_real
            self.engine.set_gradient_accumulation_boundary(i == n_mb - 1)
            logp, entropy = self.token_logprobs(mb, with_entropy=real, prefixes=prefixes[i])
            scaled = self._scaled_loss(mb, logp, totals, real=real)
            if not bool(torch.isfinite(scaled)):
                # every rank's gradient becomes non-finite once DeepSpeed reduces it: the step is
                # skipped on all ranks alike (0 * NaN is NaN, so every reached parameter is hit)
                finite = False
                scaled = scaled * float("nan")
            self.engine.backward(scaled * world, scale_wrt_gas=False)
            if not real or not finite:
                continue
            self._accumulate(acc, stats_acc, mb, logp, entropy, scaled)

        if world > 1:
            flag = torch.tensor([1 if finite else 0], dtype=torch.int64, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            finite = bool(flag.item())
            acc, stats_acc = self._merge_stats(acc, stats_acc)

        grad_norm = self._engine_step(finite)
        return self._step_stats(finite and math.isfinite(grad_norm), grad_norm, acc, stats_acc)

    def _engine_step(self, finite: bool) -> float:
        """The optimiser step after the accumulation-boundary backward; returns the gradient norm
        before clipping (non-finite: the step was skipped, on every rank)."""
        if self.zero_stage == 0:
            # ZeRO-0 has no overflow check of its own; the gradients are averaged now, the same on
            # every rank, so this decision is too
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
            if not finite or not math.isfinite(norm):
                self.engine.zero_grad()
                return norm if not math.isfinite(norm) else float("nan")
            self.engine.step()
            return norm
        # ZeRO-1/2/3 compute the global gradient norm and skip the step when it is not finite
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else float("nan")
        if not finite and math.isfinite(norm):  # pragma: no cover - the NaN poisoning makes this impossible
            raise RuntimeError("DeepSpeed applied a step whose loss was not finite")
        return norm

    @staticmethod
    def _merge_stats(acc: dict, stats_acc: dict) -> tuple[dict, dict]:
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (acc, stats_acc))
        acc = {k: sum(p[0][k] for p in parts) for k in acc}
        merged: dict[str, float] = {}
        for _, st in parts:
            for k, v in st.items():
                if k.endswith("_max"):
                    merged[k] = max(merged.get(k, -math.inf), v)
                else:
                    merged[k] = merged.get(k, 0.0) + v
        return acc, merged

    # ------------------------------------------------------------------ ZeRO-3 whole weights
    def gathered(self):
        """Context in which every parameter is whole on every rank, for generation and evaluation.

        ZeRO-3 partitions the parameters: they are gathered once (collective: every rank must
        enter, even one that then does nothing), and DeepSpeed's per-module hooks are taken off
        while inside, so a forward pass neither re-gathers nor releases anything (no collective:
        one rank may generate alone). Other stages: nothing to do.
        """
        if self.zero_stage == 3:
            return self._gathered_zero3()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _gathered_zero3(self):
        # as deepspeed.runtime.zero.stage3.unwrap_model_for_generation, with the hooks restored on error
        import deepspeed

        opt = self.engine.optimizer
        offload = opt.parameter_offload if hasattr(opt, "parameter_offload") else opt
        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            for hook in [*offload.forward_hooks, *offload.backward_hooks]:
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                offload._register_deepspeed_module(offload.module)

    def weights_for_generator(self) -> dict[str, torch.Tensor]:
        """The full model weights (CPU copies); under ZeRO-3 gathered first (collective)."""
        ctx = contextlib.nullcontext()
        if self.zero_stage == 3:
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)
        with ctx:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        # model and optimiser live in the engine checkpoint (partitioned under ZeRO), which every
        # rank writes; nothing here may be collective, since only rank 0 calls this
        return {"nonfinite_total": self.nonfinite_total, "engine": True}

    def load_state_dict(self, state: dict) -> None:
        self.nonfinite_total = state.get("nonfinite_total", 0)

    def weights_digest(self) -> str:
        """SHA-256 over this rank's whole weights (``state_dict`` names and bytes, sorted by name).

        Under ZeRO-3 each parameter is gathered in turn (collective; never the whole model at once).
        Costs a pass over the weights (about 1 GB/s).
        """
        import deepspeed

        h = hashlib.sha256()
        for k, v in sorted(self.module.state_dict(keep_vars=True).items()):
            zero3 = self.zero_stage == 3 and hasattr(v, "ds_id")
            ctx = (
                deepspeed.zero.GatheredParameters([v], modifier_rank=None)
                if zero3
                else contextlib.nullcontext()
            )
            with ctx:
                h.update(k.encode())
                h.update(v.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def save_engine_checkpoint(self, path: str, tag: str, rank_state: dict | None = None) -> str:
        """Every rank writes its part of the engine checkpoint ``path/tag`` and its own
        ``scalerl_rank_NNNNN.pt`` (``rank_state``, e.g. its RNG streams, plus the digest of its
        weights); collective. Ranks whose weights differ are a bug: it raises. The previous tag is
        kept (the run's main checkpoint refers to it until it is replaced), older ones are deleted."""
        root = Path(path)
        latest = root / "latest"
        previous = latest.read_text().strip() if latest.is_file() else None
        digest = self.weights_digest()
        digests = [digest]
        if self.world > 1:
            digests = [None] * self.world
            dist.all_gather_object(digests, digest)
        if len(set(digests)) > 1:
            raise RuntimeError(f"the trainer processes' weights differ (digests by rank: {digests})")
        self.engine.save_checkpoint(str(root), tag=tag)
        dest = root / tag / f"scalerl_rank_{self.rank:05d}.pt"
        tmp = dest.with_suffix(f".tmp{os.getpid()}")
        torch.save({**(rank_state or {}), "weights_digest": digest}, tmp)
        os.replace(tmp, dest)
        if self.world > 1:
            dist.barrier()
        if self.rank == 0:
            for d in root.iterdir():
                if d.is_dir() and d.name not in (tag, previous):
                    shutil.rmtree(d, ignore_errors=True)
        return tag

    def load_engine_checkpoint(self, path: str, tag: str | None) -> dict | None:
        """Load the engine checkpoint ``path/tag`` (None: the latest); returns this rank's
        ``rank_state`` (or None)."""
        tag = tag or "last"
        load_path, _ = self.engine.load_checkpoint(path, tag=tag)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint {tag!r} under {path}")
        own = Path(path) / tag / f"scalerl_rank_{self.rank:05d}.pt"
        return torch.load(own, map_location="cpu", weights_only=False) if own.is_file() else None
