"""Weight updates from the trainer to generator engines in other processes (``async_mode=pipeline_rl``).

One weight-update group: the trainer's rank 0 and every receiving worker (rank 1 + engine x
tensor-parallel size + shard), a ``torch.distributed`` process group of its own, ``gloo`` on CPUs and
``nccl`` between GPUs: one code path, the backend named. The group meets through the run's
store (:func:`connect`; the launcher's host and port, not a fixed loopback).

* :class:`Layout`: what one update holds, (name, dtype, shape) per tensor, cut into buckets of at
  most ``bucket_mb`` of one dtype each; sent once through the store.
* :class:`WeightSender` (trainer rank 0): :meth:`~WeightSender.publish` packs each bucket (ZeRO-3:
  gathering that bucket's parameters only) and broadcasts it; the store's ``version`` key announces
  the update. At most one update is in flight: the next ``publish`` waits until every receiver has
  taken the previous one, so each receives every version, in order.
* :class:`WeightReceiver` (a worker): :meth:`~WeightReceiver.receive` yields the announced update's
  tensors bucket by bucket, for the engine to load as they come (the HF generator copies them into
  its model; a vLLM worker streams them into ``load_weights``): no second copy of the model.
* :class:`SharedMemoryTransport`: one shared-memory copy of the weights (one machine, HF engines).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch

DEFAULT_BUCKET_MB = 256.0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def _itemsize(dtype: str) -> int:
    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


@dataclass(frozen=True)
class Layout:
    """(name, dtype, shape) per tensor, in order, and the buckets they are sent in: consecutive
    tensors of one dtype, at most ``bucket_mb`` each (a larger tensor is a bucket of its own)."""

    entries: tuple[tuple[str, str, tuple[int, ...]], ...]
    buckets: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, state: dict[str, torch.Tensor], bucket_mb: float = DEFAULT_BUCKET_MB) -> Layout:
        entries = tuple((k, str(v.dtype).replace("torch.", ""), tuple(v.shape)) for k, v in state.items())
        limit = max(1, int(bucket_mb * 2**20))
        buckets: list[list[int]] = []
        size, dtype = 0, None
        for i, (_, d, s) in enumerate(entries):
            nbytes = _numel(s) * _itemsize(d)
            if not buckets or d != dtype or size + nbytes > limit:
                buckets.append([])
                size, dtype = 0, d
            buckets[-1].append(i)
            size += nbytes
        return cls(entries, tuple(tuple(b) for b in buckets))

    def to_json(self) -> str:
        return json.dumps({"entries": [[k, d, list(s)] for k, d, s in self.entries], "buckets": self.buckets})

    @classmethod
    def from_json(cls, text: str) -> Layout:
        data = json.loads(text)
        entries = tuple((k, d, tuple(s)) for k, d, s in data["entries"])
        return cls(entries, tuple(tuple(b) for b in data["buckets"]))

    def names(self, bucket: int) -> list[str]:
        return [self.entries[i][0] for i in self.buckets[bucket]]

    def dtype(self, bucket: int) -> str:
        return self.entries[self.buckets[bucket][0]][1]

    def numel(self, bucket: int) -> int:
        return sum(_numel(self.entries[i][2]) for i in self.buckets[bucket])

    def pack(self, bucket: int, tensors: dict[str, torch.Tensor], device: torch.device | str) -> torch.Tensor:
        """One contiguous buffer of the bucket's tensors, on ``device`` (a copy)."""
        parts = [tensors[self.entries[i][0]].detach().reshape(-1).to(device) for i in self.buckets[bucket]]
        return torch.cat(parts)

    def empty(self, bucket: int, device: torch.device | str) -> torch.Tensor:
        return torch.empty(self.numel(bucket), dtype=getattr(torch, self.dtype(bucket)), device=device)

    def unpack(self, bucket: int, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into ``buffer``, by name."""
        out, offset = {}, 0
        for i in self.buckets[bucket]:
            name, _, shape = self.entries[i]
            n = _numel(shape)
            out[name] = buffer[offset : offset + n].view(shape)
            offset += n
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


@dataclass(frozen=True)
class TransportSpec:
    """How a receiving worker reaches the weight-update group (picklable)."""

    backend: str  # gloo | nccl
    host: str
    port: int
    world: int  # the trainer + every receiving worker
    timeout_s: float = 600.0


def connect(spec: TransportSpec, *, master: bool = False):
    """A client of the run's store (the trainer's rank 0 hosts it: ``master``)."""
    import torch.distributed as dist

    return dist.TCPStore(
        spec.host,
        spec.port,
        is_master=master,
        wait_for_workers=False,
        timeout=timedelta(seconds=spec.timeout_s),
        use_libuv=True,
    )


def _group(spec: TransportSpec, store, rank: int):
    """The weight-update group (not the default group: the trainer has one for its own ranks, and
    a vLLM worker one for its tensor-parallel shards)."""
    import torch.distributed as dist

    prefix = dist.PrefixStore("scalerl-weights", store)
    timeout = timedelta(seconds=spec.timeout_s)
    if spec.backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefix, rank, spec.world, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=spec.host)]
    return dist.ProcessGroupGloo(prefix, rank, spec.world, opts)


def _broadcast(group, buffer: torch.Tensor):
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([buffer], opts)


# what publish takes: a bucket's names -> a context giving those tensors (gathered only inside it)
BucketSource = Callable[[list[str]], AbstractContextManager[dict[str, torch.Tensor]]]


def dict_source(state: dict[str, torch.Tensor]) -> BucketSource:
    return lambda names: nullcontext({k: state[k] for k in names})


class WeightSender:
    """Rank 0 of the weight-update group: the trainer's side."""

    def __init__(
        self,
        store,
        spec: TransportSpec,
        layout: Layout,
        *,
        device: torch.device | str = "cpu",
        alive: Callable[[], bool] = lambda: True,
    ):
        if spec.backend not in ("gloo", "nccl"):
            raise ValueError(f"weight transport backend {spec.backend!r}: must be gloo or nccl")
        self.store, self.spec, self.layout, self.alive = store, spec, layout, alive
        self.device = torch.device("cpu" if spec.backend == "gloo" else device)
        store.set("weights/layout", layout.to_json())
        self.group = None
        self._group_store = None
        self._works: list = []
        self._pending: list[torch.Tensor] = []  # kept alive until their broadcasts completed
        self._error: BaseException | None = None
        self.seconds = 0.0  # time spent publishing (packing, waiting for the previous update)
        self.updates = 0
        # the receivers join once they have built their engines: meet them in the background
        self._connect = threading.Thread(target=self._join, daemon=True)
        self._connect.start()

    def _join(self) -> None:
        try:
            # over a store client of its own: joining waits in a store call until every receiver
            # has joined, and calls on one client wait for each other, so the trainer's own calls
            # (work for the engines, their stop when a run fails) would wait out the timeout too
            self._group_store = connect(self.spec)
            self.group = _group(self.spec, self._group_store, 0)
        except BaseException as e:  # noqa: BLE001 - reported by the next publish
            self._error = e

    def _wait(self) -> None:
        """Until the previous update reached every receiver (they take it between decode steps)."""
        while self._connect.is_alive() or not all(w.is_completed() for w in self._works):
            if self._error is not None:
                break
            if not self.alive():
                raise RuntimeError("weight transport: a generator process is gone")
            time.sleep(0.001)
        if self._error is not None:
            raise RuntimeError(f"weight transport failed: {self._error}") from self._error
        for w in self._works:
            w.wait()  # raises the broadcast's error, if any
        self._works, self._pending = [], []

    def publish(self, source: BucketSource | dict[str, torch.Tensor], version: int) -> None:
        """Send every bucket of ``source`` as ``version``; returns once they are on their way."""
        t0 = time.perf_counter()
        if isinstance(source, dict):
            source = dict_source(source)
        self._wait()
        self.store.set("weights/version", str(int(version)))
        for b in range(len(self.layout.buckets)):
            with source(self.layout.names(b)) as tensors:
                buffer = self.layout.pack(b, tensors, self.device)  # a copy: the trainer goes on
            self._pending.append(buffer)
            self._works.append(_broadcast(self.group, buffer))
        self.updates += 1
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._works, self._pending = [], []
        self.group = None


class WeightReceiver:
    """One receiving worker of the weight-update group (rank >= 1)."""

    def __init__(self, spec: TransportSpec, rank: int, device: torch.device | str = "cpu", store=None):
        self.spec, self.rank = spec, int(rank)
        self.device = torch.device("cpu" if spec.backend == "gloo" else device)
        self.store = store if store is not None else connect(spec)
        self.store.wait(["weights/layout"])
        self.layout = Layout.from_json(self.store.get("weights/layout").decode())
        self.group = _group(spec, self.store, self.rank)
        self._buffers: dict[int, torch.Tensor] = {}

    def announced(self) -> int | None:
        return announced(self.store)

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The announced update's tensors, bucket by bucket (views into buffers reused by the next
        update: load or copy them before asking for the next one)."""
        for b in range(len(self.layout.buckets)):
            buf = self._buffers.get(b)
            if buf is None:
                buf = self._buffers[b] = self.layout.empty(b, self.device)
            _broadcast(self.group, buf).wait()
            yield from self.layout.unpack(b, buf).items()


def announced(store) -> int | None:
    """The newest version the trainer announced in ``store``, or None before the first."""
    if not store.check(["weights/version"]):
        return None
    return int(store.get("weights/version").decode())


def load_into(model: torch.nn.Module, tensors) -> int:
    """Copy (name, tensor) pairs (state-dict names) into ``model``'s parameters and buffers in
    place; the number copied."""
    own = {**dict(model.named_buffers()), **dict(model.named_parameters())}
    n = 0
    with torch.no_grad():
        for k, v in tensors:
            target = own.get(k)
            if target is not None:
                target.copy_(v)
                n += 1
    return n


class SharedMemoryTransport:
    """Weights in shared memory (one tensor per parameter) plus a version counter; one machine."""

    def __init__(self, state: dict[str, torch.Tensor], ctx, version: int = 0):
        self.buffers = {
            k: v.detach().to("cpu", copy=True).contiguous().share_memory_() for k, v in state.items()
        }
        self.version = ctx.Value("l", version, lock=False)
        self.lock = ctx.Lock()
        self.seconds = 0.0
        self.updates = 0

    def publish(self, source: BucketSource | dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        if isinstance(source, dict):
            source = dict_source(source)
        with self.lock, torch.no_grad(), source(list(self.buffers)) as state:
            for k, buf in self.buffers.items():
                buf.copy_(state[k].detach().to("cpu"))
            self.version.value = version
        self.updates += 1
        self.seconds += time.perf_counter() - t0

    def poll(self, model: torch.nn.Module, current: int) -> int | None:
        if self.version.value == current:
            return None
        with self.lock:
            version = int(self.version.value)
            load_into(model, self.buffers.items())
        return version

    def close(self) -> None:
        pass
