"""The DeepSpeed engine: ZeRO stages 0-3 over torch.distributed (gloo on CPU, NCCL on GPUs).

DeepSpeed owns gradient averaging across processes, the optimiser step (the torch AdamW of
:func:`build_optimizer` handed in, so no DeepSpeed C++ op is compiled) and, for ZeRO-3, the
partitioning of parameters; the trainer step itself (:class:`scalerl.trainer.Trainer`) is the same
as for plain PyTorch. One process needs no launcher (the rank variables are set here); more
processes come from ``torchrun`` or the ``deepspeed`` launcher, which set them.

A non-finite step is skipped on every rank: the trainer poisons the local loss with NaN, so every
rank's averaged gradient is non-finite; ZeRO-1/2/3 skip a step whose global gradient norm is not
finite, and for ZeRO-0 this engine checks the averaged gradient itself (the same on every rank).

Extra DeepSpeed settings can be merged into the generated config from the environment:
``SCALERL_DS_CONFIG='{"zero_optimization": {"stage3_param_persistence_threshold": 0}}'``.

:func:`init_distributed` starts this process's torch.distributed; :func:`end_distributed` ends it
(the run that built its trainer calls it when it ends, normally or on error).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalerl.config.groups.trainer import DeepSpeedTrainerOption
from scalerl.messages import RunError, bind_failure
from scalerl.storage import check_no_code, load_safe, save_atomic
from scalerl.trainer.engine import Engine, build_optimizer

log = logging.getLogger("scalerl")

# the classes DeepSpeed's own checkpoint files hold besides tensors and plain values (data only)
DEEPSPEED_DATA_CLASSES = frozenset(
    {
        "deepspeed.utils.tensor_fragment.fragment_address",
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    }
)


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


# the rank variables init_distributed set for a single process (end_distributed takes them back)
_SINGLE_ENV: dict[str, str] = {}


def init_distributed(device: torch.device) -> None:
    """Initialise torch.distributed for DeepSpeed. A single process (no launcher) rendezvouses
    through a file, so it opens no listening socket; under a launcher the launcher's rendezvous is
    used."""
    deepspeed = import_deepspeed(device)
    _forget_ended_groups()
    single = "RANK" not in os.environ
    if single:
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }
        os.environ.update(env)
        _SINGLE_ENV.update(env)
    if device.type == "cpu":
        _skip_shm_comm_op()
    # DeepSpeed's ZeRO calls these torch.distributed functions on every step
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    )
    backend = "gloo" if device.type == "cpu" else "nccl"
    if single and not dist.is_initialized():
        if backend == "gloo":  # gloo's own connections: on loopback
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        folder = tempfile.mkdtemp(prefix="scalerl-rdzv-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=0, world_size=1)
    if not dist.is_initialized() or not deepspeed.comm.is_initialized():
        try:
            deepspeed.init_distributed(dist_backend=backend)
        except RuntimeError as e:  # torch's DistNetworkError
            why, in_use = bind_failure(e)
            if not in_use:
                raise
            raise RunError(_rendezvous_taken(os.environ, why)) from None


def _rendezvous_taken(env, why: str) -> str:
    """One line for rank 0 finding its rendezvous port (MASTER_PORT) held by another process."""
    from scalerl.layout import MASTER_PORT_BASE, MASTER_PORT_SPAN

    pairs = MASTER_PORT_SPAN // 2
    return (
        f"rank {env.get('RANK', '0')} could not open the rendezvous at {env.get('MASTER_ADDR', '?')}:"
        f"{env.get('MASTER_PORT', '?')} ({why}): another process on this node holds the port. A sweep's "
        f"job rendezvouses at {MASTER_PORT_BASE} + 2 x (its job id mod {pairs}), so two jobs whose ids "
        f"differ by a multiple of {pairs} collide on one node: run the sweep again to resubmit this one "
        "(finished runs are kept, this one resumes). Under torchrun give the runs on one node "
        "--master-port values at least two apart"
    )


def _forget_ended_groups() -> None:
    """DeepSpeed keeps its process groups (world, data parallel, ...) in module globals and forgets
    them only when its own ``destroy_process_group`` ends the world. Where another party in this
    process ended torch.distributed with torch's call (vLLM's teardown of an engine that ran here
    destroys the default group it shared), the globals outlive the groups, and the next DeepSpeed
    engine fails at its first broadcast ("Group ... is not registered"). Forget them then."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    registered = dist.distributed_c10d._world.pg_group_ranks if dist.is_available() else {}
    names = ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP")
    cached = [getattr(groups, n, None) for n in names]
    if any(g is not None and g not in registered for g in cached):
        groups._release_process_group_references(None)


def end_distributed(settle_s: float = 10.0) -> bool:
    """End this process's torch.distributed: destroy every process group (DeepSpeed's references to
    them too), take back the rank variables :func:`init_distributed` set for a single process, and
    let gloo's worker threads settle before the interpreter may finalize. Local (no collective), so
    it also ends a run that failed on one rank only; nothing to do where torch.distributed is not
    initialised. Returns whether the workers settled within ``settle_s`` seconds (True where there
    are none).

    Why the settling: a gloo group runs its collectives on worker threads, which outlive
    ``destroy_process_group`` while anything still holds the group (DeepSpeed's ZeRO-3 objects do,
    for the life of the process). Such a thread drops the tensors of the collective it ran just
    after that collective has returned, and dropping a tensor that has a Python object takes the
    GIL. A process that ends right after a collective, without letting go of the GIL in between,
    starts finalizing first; the thread's GIL request then ends it in the middle of a C++
    destructor: std::terminate, "terminate called without an active exception", SIGABRT (tensors
    freed by a background thread during ``Py_FinalizeEx``: pytorch/pytorch#190489 and #117762;
    CPython 3.14 parks such threads instead of ending them, python/cpython gh-87135)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    comm = sys.modules.get("deepspeed.comm")
    if comm is not None and comm.is_initialized():
        comm.destroy_process_group()  # torch's groups, then DeepSpeed's own references to them
    else:
        dist.destroy_process_group()
    for k, v in _SINGLE_ENV.items():
        if os.environ.get(k) == v:
            del os.environ[k]
    _SINGLE_ENV.clear()
    settled = _gloo_workers_settle(settle_s)
    if not settled:
        log.warning(
            "torch.distributed ended, but gloo's worker threads were still busy after %.0f s; the "
            "process may abort as it exits ('terminate called without an active exception')",
            settle_s,
        )
    return settled


# gloo's worker threads, as torch names them
_GLOO_WORKER_THREAD = "pt_gloo_runloop"


def _gloo_workers() -> dict[str, tuple[str, int]]:
    """``{thread id: (state, voluntary context switches)}`` of this process's gloo worker threads,
    from ``/proc`` (``{}`` where there is none, or no ``/proc``)."""
    out: dict[str, tuple[str, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != _GLOO_WORKER_THREAD:
                    continue
            with open(f"/proc/self/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            out[tid] = (fields["State"].split()[0], int(fields["voluntary_ctxt_switches"]))
        except (OSError, KeyError, ValueError):  # the thread ended meanwhile
            continue
    return out


def _gloo_workers_settle(timeout: float) -> bool:
    """Wait, without the GIL, until every gloo worker thread sleeps without waking up for a while.

    A worker with nothing to do waits on its queue with no timeout: it sleeps and never wakes. A
    worker that still has to drop a collective's tensors runs, or waits for the GIL, which it asks
    for again every switch interval (5 ms): it wakes up. Sleeping here lets go of the GIL, so such a
    worker takes it as soon as it gets a core; a window of several intervals with every worker
    asleep and none woken means none has anything left to do. Returns False after ``timeout``
    seconds without such a window."""
    window = max(0.05, 10 * sys.getswitchinterval())
    deadline = time.monotonic() + timeout
    before = _gloo_workers()
    while before:
        time.sleep(window)
        now = _gloo_workers()
        if all(state == "S" and before.get(tid) == (state, n) for tid, (state, n) in now.items()):
            return True
        if time.monotonic() > deadline:
            return False
        before = now
    return True


def _deep_update(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


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


class DeepSpeedEngine(Engine):
    name = "deepspeed"

    def __init__(self, model: nn.Module, trainer: DeepSpeedTrainerOption, device: torch.device):
        deepspeed = import_deepspeed(device)
        init_distributed(device)
        self.device = device
        self.zero_stage = int(trainer.zero_stage)
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        optimizer, scheduler = build_optimizer(model.parameters(), trainer)
        zero: dict = {"stage": self.zero_stage}
        if self.zero_stage > 0:
            # DeepSpeed's default buckets hold 5e8 elements (2 GB in fp32, allocated and cleared on
            # the first step: seconds on a CPU); a bucket never needs to exceed the model
            n = sum(p.numel() for p in model.parameters())
            bucket = int(min(5e8, max(n, 1e5)))
            zero.update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
        if self.zero_stage == 3:
            zero.pop("allgather_bucket_size")
            zero["stage3_prefetch_bucket_size"] = bucket
            # DeepSpeed would otherwise replace torch.nn.functional.linear process-wide
            zero["memory_efficient_linear"] = False
        ds_config = {
            # one optimiser step per engine.step(); micro-batching is the trainer's
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": float(trainer.grad_clip) if trainer.grad_clip > 0 else 0.0,
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
            model=_EngineForward(model), optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        if self.zero_stage == 3:
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
    def module(self) -> nn.Module:
        return self.engine.module.policy

    def adapt_precision(self, precision):
        return _HeadAsModule(precision) if self.zero_stage == 3 else precision

    # ------------------------------------------------------------------ forward / backward / step
    def forward(self, fn, *args, **kwargs):
        return self.engine(fn, *args, **kwargs)

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def set_accumulation_boundary(self, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)

    def clip_and_step(self, finite: bool) -> float:
        if self.zero_stage == 0:
            # ZeRO-0 has no overflow check of its own; the gradients are averaged now, the same on
            # every rank, so this decision is too
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
            if not finite or not math.isfinite(norm):
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

    def gather_params(self, params):
        """ZeRO-3: ``params`` gathered (collective), released on leaving: a few at a time, never
        the whole model (weight updates send bucket by bucket)."""
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(params), modifier_rank=None)

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

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        # model and optimiser live in the engine checkpoint (partitioned under ZeRO), which every
        # rank writes; nothing here may be collective, since only rank 0 calls this
        return {"engine": True}

    def load_state_dict(self, state: dict) -> None:
        pass

    def local_weights(self) -> list[torch.Tensor]:
        """Under ZeRO-3 a parameter's values on this rank are its partition (``ds_tensor``)."""
        if self.zero_stage != 3:
            return super().local_weights()
        return [p.ds_tensor.detach() for p in self.module.parameters()]

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

    def save_checkpoint(self, path: str, tag: str, rank_state: dict | None = None) -> str:
        """Every rank writes its part of the engine checkpoint ``path/tag`` and its own
        ``scalerl_rank_NNNNN.pt`` (``rank_state``, e.g. its RNG streams, plus the digest of its
        weights); collective. Ranks whose weights differ are a bug: it raises. The previous tag is
        kept (the run's main checkpoint refers to it until it is replaced), older ones are deleted.
        Returns ``tag``."""
        root = Path(path)
        latest = root / "latest"
        previous = latest.read_text().strip() if latest.is_file() else None
        digest = self.weights_digest()
        digests = self.gather_objects(digest)
        if len(set(digests)) > 1:
            raise RuntimeError(f"the trainer processes' weights differ (digests by rank: {digests})")
        self.engine.save_checkpoint(str(root), tag=tag)
        save_atomic(
            {**(rank_state or {}), "weights_digest": digest}, root / tag / f"scalerl_rank_{self.rank:05d}.pt"
        )
        if self.world > 1:
            dist.barrier()
        if self.rank == 0:
            for d in root.iterdir():
                if d.is_dir() and d.name not in (tag, previous):
                    shutil.rmtree(d, ignore_errors=True)
        return tag

    def load_checkpoint(self, path: str, tag: str) -> dict | None:
        """Load the engine checkpoint ``path/tag``; returns this rank's ``rank_state`` (or None).

        DeepSpeed loads its files with ``weights_only=False``: each is checked first to name no
        global beyond tensors, plain values and DeepSpeed's own data classes."""
        for f in sorted((Path(path) / tag).glob("*.pt")):
            check_no_code(f, DEEPSPEED_DATA_CLASSES)
        load_path, _ = self.engine.load_checkpoint(path, tag=tag)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint {tag!r} under {path}")
        own = Path(path) / tag / f"scalerl_rank_{self.rank:05d}.pt"
        return load_safe(own) if own.is_file() else None
