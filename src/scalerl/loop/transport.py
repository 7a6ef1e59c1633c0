"""Weight transport from the trainer to a generator in another process (``async_mode=pipeline_rl``).

One interface, :class:`WeightTransport`: ``publish`` on the trainer after every optimiser step,
``poll`` on the generator between decode steps (it loads newer weights into the generator's model
in place and returns their version). Back-ends:

* :class:`CollectiveTransport` over ``torch.distributed`` process groups of their own (rank 0 the
  trainer, rank 1 the generator), ``gloo`` on CPUs and ``nccl`` between GPUs, so the generator may
  run on another device or machine. Both back-ends speak one protocol (:class:`Layout`): the
  parameter names, dtypes and shapes are sent once through the rendezvous store; every update is
  one flat buffer per dtype, broadcast by the trainer. The store's ``version`` key announces an
  update; the trainer has at most one update in flight (the next ``publish`` waits for the
  generator to have taken the previous one), so the generator receives every version, in order.
* :class:`SharedMemoryTransport`: one shared-memory copy of the weights (one machine only).

ZeRO-3 trainers hand over gathered parameters (:class:`~scalerl.model.weights.PolicyWeights`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch

from scalerl.config.groups.async_mode import TRANSPORTS  # noqa: F401  (the names, declared with the option)


class WeightTransport(Protocol):
    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Trainer side: make ``state`` the newest weights, tagged ``version``."""

    def poll(self, model: torch.nn.Module, current: int) -> int | None:
        """Generator side: load newer weights into ``model`` in place; their version, or None."""


def _load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy ``tensors`` (state-dict names) into ``model``'s parameters and buffers in place."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for k, v in tensors.items():
            target = params.get(k, buffers.get(k))
            if target is not None:
                target.copy_(v)


@dataclass(frozen=True)
class Layout:
    """What one update holds: (name, dtype, shape) per tensor, packed in this order into one flat
    buffer per dtype. Sent once; both sides then pack and unpack the same way."""

    entries: tuple[tuple[str, str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, state: dict[str, torch.Tensor]) -> Layout:
        return cls(tuple((k, str(v.dtype).replace("torch.", ""), tuple(v.shape)) for k, v in state.items()))

    def to_json(self) -> str:
        return json.dumps([[k, d, list(s)] for k, d, s in self.entries])

    @classmethod
    def from_json(cls, text: str) -> Layout:
        return cls(tuple((k, d, tuple(s)) for k, d, s in json.loads(text)))

    def dtypes(self) -> list[str]:
        return sorted({d for _, d, _ in self.entries})

    def numel(self, dtype: str) -> int:
        return sum(_numel(s) for _, d, s in self.entries if d == dtype)

    def pack(self, state: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
        """One contiguous buffer per dtype, on ``device``."""
        out = {}
        for dtype in self.dtypes():
            parts = [state[k].detach().reshape(-1).to(device) for k, d, _ in self.entries if d == dtype]
            out[dtype] = torch.cat(parts) if parts else torch.empty(0, dtype=getattr(torch, dtype))
        return out

    def empty(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        return {d: torch.empty(self.numel(d), dtype=getattr(torch, d), device=device) for d in self.dtypes()}

    def unpack(self, buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Views into ``buffers``, by name."""
        offsets = dict.fromkeys(buffers, 0)
        out = {}
        for k, d, s in self.entries:
            n = _numel(s)
            out[k] = buffers[d][offsets[d] : offsets[d] + n].view(s)
            offsets[d] += n
        return out

    def check_matches(self, model: torch.nn.Module) -> None:
        """The receiving model has every tensor, with the same shape (else a clear error)."""
        own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        for k, _, s in self.entries:
            if own.get(k) != s:
                raise RuntimeError(
                    f"weight transport: the trainer sends {k} of shape {s}, the generator's model has "
                    f"{own.get(k, 'no such tensor')}: trainer and generator must build the same model"
                )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


@dataclass(frozen=True)
class TransportSpec:
    """How the generator process reaches the trainer's transport (picklable)."""

    backend: str  # gloo | nccl
    host: str
    port: int
    timeout_s: float = 600.0


def _group(spec: TransportSpec, store, rank: int):
    """A two-rank process group of the transport's own (not the default group: the trainer may
    have one for its own ranks)."""
    import torch.distributed as dist

    prefix = dist.PrefixStore("scalerl-weights", store)
    timeout = timedelta(seconds=spec.timeout_s)
    if spec.backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefix, rank, 2, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=spec.host)]
    return dist.ProcessGroupGloo(prefix, rank, 2, opts)


def _broadcast(group, buffers: dict[str, torch.Tensor]) -> list:
    import torch.distributed as dist

    works = []
    for dtype in sorted(buffers):
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        works.append(group.broadcast([buffers[dtype]], opts))
    return works


class CollectiveTransport:
    """Trainer side of the ``gloo``/``nccl`` transport. The generator process makes its
    :class:`CollectiveReceiver` from :attr:`spec`."""

    def __init__(
        self,
        state: dict[str, torch.Tensor],
        version: int,
        *,
        backend: str = "gloo",
        device: torch.device | str = "cpu",
        host: str = "127.0.0.1",
        alive: Callable[[], bool] = lambda: True,
        timeout_s: float = 600.0,
    ):
        import torch.distributed as dist

        if backend not in ("gloo", "nccl"):
            raise ValueError(f"weight transport backend {backend!r}: must be gloo or nccl")
        self.device = torch.device("cpu" if backend == "gloo" else device)
        self.layout = Layout.of(state)
        self.store = dist.TCPStore(
            host,
            0,
            world_size=2,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout_s),
        )
        self.spec = TransportSpec(backend, host, int(self.store.port), timeout_s)
        self.store.set("layout", self.layout.to_json())
        self.alive = alive
        self.group = None
        self._works: list = []
        self._pending: dict[str, torch.Tensor] | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0  # time spent publishing (packing, waiting for the previous update)
        first = self.layout.pack(state, self.device)
        # the generator process joins the group once it has built its model: connect and send the
        # first weights in the background, so the trainer goes on meanwhile (evaluating step 0)
        self._connect = threading.Thread(target=self._start, args=(first, version), daemon=True)
        self._connect.start()

    def _start(self, buffers: dict[str, torch.Tensor], version: int) -> None:
        try:
            self.group = _group(self.spec, self.store, 0)
            self._send(buffers, version)
        except BaseException as e:  # noqa: BLE001 - reported by the next publish
            self._error = e

    def _send(self, buffers: dict[str, torch.Tensor], version: int) -> None:
        self._pending = buffers  # kept alive until the broadcast completed
        self.store.set("version", str(int(version)))
        self._works = _broadcast(self.group, buffers)

    def _wait(self) -> None:
        """Until the previous update has reached the generator (it polls between decode steps)."""
        while self._connect.is_alive() or not all(w.is_completed() for w in self._works):
            if self._error is not None:
                break
            if not self.alive():
                raise RuntimeError("weight transport: the generator process is gone")
            time.sleep(0.001)
        if self._error is not None:
            raise RuntimeError(f"weight transport failed: {self._error}") from self._error
        for w in self._works:
            w.wait()  # raises the broadcast's error, if any
        self._works = []

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        buffers = self.layout.pack(state, self.device)  # a copy: the trainer may change state now
        self._wait()
        self._send(buffers, version)
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._works = []
        self.group = None


class CollectiveReceiver:
    """Generator side of :class:`CollectiveTransport`."""

    def __init__(self, spec: TransportSpec, device: torch.device | str = "cpu"):
        import torch.distributed as dist

        self.spec = spec
        self.device = torch.device("cpu" if spec.backend == "gloo" else device)
        self.store = dist.TCPStore(
            spec.host, spec.port, world_size=2, is_master=False, timeout=timedelta(seconds=spec.timeout_s)
        )
        self.layout = Layout.from_json(self.store.get("layout").decode())
        self.group = _group(spec, self.store, 1)
        self.buffers = self.layout.empty(self.device)
        self.checked = False

    def announced(self) -> int | None:
        if not self.store.check(["version"]):
            return None
        return int(self.store.get("version").decode())

    def poll(self, model: torch.nn.Module, current: int) -> int | None:
        version = self.announced()
        if version is None or version == current:
            return None
        if not self.checked:
            self.layout.check_matches(model)
            self.checked = True
        for w in _broadcast(self.group, self.buffers):
            w.wait()
        _load_into(model, self.layout.unpack(self.buffers))
        return version


class SharedMemoryTransport:
    """Weights in shared memory (one tensor per parameter) plus a version counter; one machine."""

    def __init__(self, state: dict[str, torch.Tensor], ctx, version: int = 0):
        self.buffers = {
            k: v.detach().to("cpu", copy=True).contiguous().share_memory_() for k, v in state.items()
        }
        self.version = ctx.Value("l", version, lock=False)
        self.lock = ctx.Lock()
        self.seconds = 0.0

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        with self.lock, torch.no_grad():
            for k, buf in self.buffers.items():
                buf.copy_(state[k].detach().to("cpu"))
            self.version.value = version
        self.seconds += time.perf_counter() - t0

    def poll(self, model: torch.nn.Module, current: int) -> int | None:
        if self.version.value == current:
            return None
        with self.lock:
            version = int(self.version.value)
            _load_into(model, self.buffers)
        return version

    def close(self) -> None:
        pass


def choose_backend(name: str, trainer_device: torch.device, generator_device: torch.device) -> str:
    """``auto``: NCCL between two different GPUs, else gloo (NCCL cannot join two processes on one
    GPU)."""
    if name != "auto":
        return name
    both_cuda = trainer_device.type == "cuda" and generator_device.type == "cuda"
    return "nccl" if both_cuda and trainer_device.index != generator_device.index else "gloo"
