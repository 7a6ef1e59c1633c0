"""Weight updates from the trainer to generator engines in other processes (``async_mode=pipeline_rl``).

One weight-update group: the trainer's rank 0 and every receiving worker (rank 1 + engine x
tensor-parallel size + shard), a ``torch.distributed`` process group of its own, ``gloo`` on CPUs and
``nccl`` between GPUs: one code path, the backend named. The group meets through the run's
store (:func:`connect`; the launcher's host and port, not a fixed loopback).

* :class:`Layout`: what one update holds, (name, dtype, shape) per tensor, cut into buckets of at
  most ``bucket_mb`` of one dtype each; sent once through the store.
* :class:`WeightSender` (trainer rank 0): the group forms as the engines start
  (:meth:`~WeightSender.wait_joined`: a clear error naming the missing ranks after a timeout);
  :meth:`~WeightSender.publish` packs one bucket at a time (ZeRO-3: gathering that bucket's
  parameters only) and broadcasts it, at most :data:`PUBLISH_INFLIGHT` packed buckets alive (on
  NCCL one, each broadcast complete before the next gather: see the class); the store's ``version``
  key announces the update. At most one update is in flight, so each receiver gets every version,
  in order. :meth:`~WeightSender.close` tears the group down.
* :class:`WeightReceiver` (a worker): :meth:`~WeightReceiver.receive` yields the announced update's
  tensors bucket by bucket, each bucket's buffer allocated as it arrives and dropped after it is
  loaded (the HF generator copies them into its model; a vLLM worker streams them into
  ``load_weights``): no second copy of the model between updates.
* Each gloo member binds its own address toward the store's host (:func:`bind_host`).
* :class:`SharedMemoryTransport`: one shared-memory copy of the weights (one machine, HF engines).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch

DEFAULT_BUCKET_MB = 256.0
DEFAULT_TIMEOUT_S = 600.0


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
    # the store's and the group's timeout, and how long rank 0 waits for the engines to join
    timeout_s: float = DEFAULT_TIMEOUT_S


# packed buckets rank 0 keeps alive at once while it publishes (each freed as its broadcast
# completes): the next bucket is packed while the previous ones travel, and rank 0 holds at most
# this many buckets (``placement.bucket_mb`` each) besides the model, never a copy of the model
PUBLISH_INFLIGHT = 2


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


def bind_host(store_host: str, *, master: bool) -> str:
    """The address this member's gloo device binds to (and that its peers connect to).

    The trainer (``master``) hosts the store: the store's host is its own address. Any other member
    binds the local address through which it reaches the store's host: the source address the
    kernel picks for a UDP socket "connected" to that host (no packet is sent; connecting a UDP
    socket only chooses the route). Binding the store's host itself, as before, makes a receiver on
    another node bind the trainer's address, which is not its own (gloo fails, or on a shared
    address the peers connect back to the trainer instead of the receiver)."""
    if master:
        return store_host
    import socket

    # IPv4 first where the host has an IPv4 address (as the trainer's device resolves its name), so
    # that both ends of every gloo pair speak one family
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            address = socket.getaddrinfo(store_host, None, family, socket.SOCK_DGRAM)[0][4][0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((address, 9))  # port 9 (discard): any port; nothing is sent
                return str(s.getsockname()[0])
        except OSError:
            continue
    # no route to the host from here: the address this machine resolves for its own name
    return socket.gethostbyname(socket.gethostname())


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
    opts._devices = gloo_devices(spec.host, master=rank == 0)
    return dist.ProcessGroupGloo(prefix, rank, spec.world, opts)


def gloo_devices(store_host: str, *, master: bool) -> list:
    """The gloo devices of this member of the weight-update group: one per interface that
    ``GLOO_SOCKET_IFNAME`` names (comma-separated), as torch.distributed's own gloo groups take
    them, else the address :func:`bind_host` picks (where an image resolves the trainer's host name
    to a loopback address, e.g. Debian's ``127.0.1.1 <hostname>``, engines on other machines can
    join only with the variable set)."""
    import torch.distributed as dist

    names = [n.strip() for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    if names:
        return [dist.ProcessGroupGloo.create_device(interface=n) for n in names]
    return [dist.ProcessGroupGloo.create_device(hostname=bind_host(store_host, master=master))]


def _broadcast(group, buffer: torch.Tensor):
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([buffer], opts)


def _hello(group, device: torch.device) -> None:
    """One small broadcast over the new group, waited for: NCCL creates its communicator at the
    first collective, so a group counts as formed only once one has completed on every member."""
    flag = torch.ones(1, dtype=torch.int32, device=device)
    work = _broadcast(group, flag)
    work.wait()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _end_group(group) -> None:
    """Release a weight-update group's resources (its connections, NCCL communicator, threads)."""
    if group is None:
        return
    with contextlib.suppress(Exception):  # a peer already gone: nothing left to release cleanly
        group.shutdown()


class JoinTimeout(RuntimeError):
    """Receivers did not join the weight-update group in time; ``missing``: their ranks."""

    def __init__(self, message: str, missing: list[int]):
        super().__init__(message)
        self.missing = missing


# what publish takes: a bucket's names -> a context giving those tensors (gathered only inside it)
BucketSource = Callable[[list[str]], AbstractContextManager[dict[str, torch.Tensor]]]


def dict_source(state: dict[str, torch.Tensor]) -> BucketSource:
    return lambda names: nullcontext({k: state[k] for k in names})


class WeightSender:
    """Rank 0 of the weight-update group: the trainer's side.

    The group forms as the engines start (:meth:`wait_joined`, before training), not at the first
    broadcast. :meth:`publish` packs one bucket at a time (under ZeRO-3 gathering only that bucket's
    parameters) and keeps at most :data:`PUBLISH_INFLIGHT` packed buckets alive, each freed once its
    broadcast completed.

    Ordering with the trainer's default group: NCCL documents that concurrent collectives on
    different communicators of one device may deadlock (a kernel of one communicator can occupy the
    device while it waits for peers that are themselves waiting in the other's kernel). Under ZeRO-3
    every bucket's gather is a collective on the default group, so on NCCL (``ordered``, its
    default) each bucket's broadcast has completed (its CUDA event queried from the host) before the
    next bucket is gathered, and :meth:`publish` returns with none in flight: on rank 0's device the
    weight group and the default group never have work in flight together. The cost is the engines'
    pace: each bucket waits until every engine takes it, between its decode steps. On gloo (CPU
    tensors, no device queue to deadlock) up to :data:`PUBLISH_INFLIGHT` broadcasts run while the
    next bucket is gathered, and the last ones may still travel after ``publish`` returns; the next
    ``publish`` (or :meth:`close`) waits for them."""

    def __init__(
        self,
        store,
        spec: TransportSpec,
        layout: Layout,
        *,
        device: torch.device | str = "cpu",
        alive: Callable[[], bool] = lambda: True,
        ordered: bool | None = None,
    ):
        if spec.backend not in ("gloo", "nccl"):
            raise ValueError(f"weight transport backend {spec.backend!r}: must be gloo or nccl")
        self.store, self.spec, self.layout, self.alive = store, spec, layout, alive
        self.device = torch.device("cpu" if spec.backend == "gloo" else device)
        self.ordered = spec.backend == "nccl" if ordered is None else bool(ordered)
        store.set("weights/layout", layout.to_json())
        self.group = None
        self._group_store = None
        self._works: list = []
        self._pending: list[torch.Tensor] = []  # packed buckets whose broadcasts may still run
        self.peak_pending_bytes = 0  # the most bytes of packed buckets alive at once
        self._error: BaseException | None = None
        self._closed = False
        self.seconds = 0.0  # time spent publishing (packing, waiting for the previous update)
        self.updates = 0
        # the receivers join once they have built their engines: meet them in the background, so
        # that the caller can watch the engines (and its own store calls) while it waits
        self._connect = threading.Thread(target=self._join, daemon=True)
        self._connect.start()

    def _join(self) -> None:
        try:
            # over a store client of its own: joining waits in a store call until every receiver
            # has joined, and calls on one client wait for each other, so the trainer's own calls
            # (work for the engines, their stop when a run fails) would wait out the timeout too
            self._group_store = connect(self.spec)
            group = _group(self.spec, self._group_store, 0)
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    _hello(group, self.device)
            else:
                _hello(group, self.device)
            self.group = group
        except BaseException as e:  # noqa: BLE001 - reported by wait_joined / publish
            self._error = e

    @property
    def joined(self) -> bool:
        return self.group is not None

    def pending_bytes(self) -> int:
        """Bytes of packed buckets rank 0 holds now (beside the model)."""
        return sum(b.numel() * b.element_size() for b in self._pending)

    def wait_joined(self, timeout_s: float | None = None) -> None:
        """Until every receiver joined the group (one broadcast completed); a :class:`JoinTimeout`
        naming the ranks that never arrived after ``timeout_s`` (default: the spec's), a
        RuntimeError when a generator process is gone or the group failed."""
        timeout = float(self.spec.timeout_s if timeout_s is None else timeout_s)
        deadline = time.monotonic() + timeout
        while self._connect.is_alive():
            if not self.alive():
                raise RuntimeError("weight transport: a generator process is gone")
            if time.monotonic() > deadline:
                missing = [
                    r for r in range(1, self.spec.world) if not self.store.check([f"weights/joined/{r}"])
                ]
                who = (
                    f"rank(s) {', '.join(map(str, missing))}"
                    if missing
                    else "every receiver reached the store but"
                )
                raise JoinTimeout(
                    f"weight transport: {who} did not join the weight-update group at "
                    f"{self.spec.host}:{self.spec.port} ({self.spec.backend}, world {self.spec.world}) within "
                    f"{timeout:g} s",
                    missing,
                )
            self._connect.join(timeout=0.05)
        if self._error is not None:
            raise RuntimeError(f"weight transport failed: {self._error}") from self._error

    def _finish(self, index: int = 0, deadline: float | None = None) -> None:
        """Until the broadcast of ``self._works[index]`` completed (the engines take it between
        decode steps), then free its buffer."""
        work = self._works[index]
        while not work.is_completed():
            if not self.alive():
                raise RuntimeError("weight transport: a generator process is gone")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("weight transport: a broadcast did not complete")
            time.sleep(0.0005)
        work.wait()  # raises the broadcast's error, if any
        if self.device.type == "cuda":  # the host knows the bytes left: the buffer can go
            torch.cuda.current_stream(self.device).synchronize()
        del self._works[index], self._pending[index]

    def _drain(self, keep: int = 0, deadline: float | None = None) -> None:
        while len(self._works) > keep:
            self._finish(0, deadline)

    def publish(self, source: BucketSource | dict[str, torch.Tensor], version: int) -> None:
        """Send every bucket of ``source`` as ``version``, one bucket at a time: at most
        :data:`PUBLISH_INFLIGHT` packed buckets alive (1 when ordered); on NCCL every broadcast has
        completed when it returns."""
        t0 = time.perf_counter()
        if isinstance(source, dict):
            source = dict_source(source)
        self.wait_joined()
        self._drain()  # the previous update's last buckets (gloo)
        window = 1 if self.ordered else PUBLISH_INFLIGHT
        self.store.set("weights/version", str(int(version)))
        for b in range(len(self.layout.buckets)):
            # room for this bucket first: never more than `window` packed buckets at once
            self._drain(keep=window - 1)
            with source(self.layout.names(b)) as tensors:
                buffer = self.layout.pack(b, tensors, self.device)  # a copy: the trainer goes on
            self._pending.append(buffer)
            self._works.append(_broadcast(self.group, buffer))
            self.peak_pending_bytes = max(self.peak_pending_bytes, self.pending_bytes())
            if self.ordered:
                self._drain()
        if self.spec.backend == "nccl":
            self._drain()
        self.updates += 1
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Tear the group down (the receivers leave it on their side as their engines stop)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # a failed run: the engines may be gone mid-update
            self._drain(deadline=time.monotonic() + 10.0)
        self._works, self._pending = [], []
        self._connect.join(timeout=0.1)  # a join still waiting ends at its store timeout
        group, self.group = self.group, None
        _end_group(group)
        self._group_store = None


class WeightReceiver:
    """One receiving worker of the weight-update group (rank >= 1).

    Holds no copy of the weights between updates: each bucket's buffer is allocated as it arrives
    and dropped once the consumer moved on (an engine that still needs some of its tensors, vLLM's
    layer-wise reload waiting for the rest of a layer, keeps just those alive by reference)."""

    def __init__(self, spec: TransportSpec, rank: int, device: torch.device | str = "cpu", store=None):
        self.spec, self.rank = spec, int(rank)
        self.device = torch.device("cpu" if spec.backend == "gloo" else device)
        self.store = store if store is not None else connect(spec)
        self.store.wait(["weights/layout"])
        self.layout = Layout.from_json(self.store.get("weights/layout").decode())
        self.store.set(f"weights/joined/{self.rank}", "1")  # reached the store: the trainer can tell
        self.group = _group(spec, self.store, self.rank)
        _hello(self.group, self.device)
        self.held_bytes = 0  # bytes of received buffers this receiver references now
        self.peak_bytes = 0

    def announced(self) -> int | None:
        return announced(self.store)

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The announced update's tensors, bucket by bucket (views into a buffer of that bucket
        alone, allocated as it arrives and released when the next bucket is asked for)."""
        for b in range(len(self.layout.buckets)):
            buf = self.layout.empty(b, self.device)
            self.held_bytes = buf.numel() * buf.element_size()
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            _broadcast(self.group, buf).wait()
            yield from self.layout.unpack(b, buf).items()
            del buf
            self.held_bytes = 0

    def close(self) -> None:
        group, self.group = self.group, None
        _end_group(group)


def announced(store, *, seen: bool = False) -> int | None:
    """The newest version the trainer announced in ``store``, or None before the first. ``seen``:
    a version was read from this store before, so the key exists (it is never removed) and one
    round trip reads it (an engine asks before every piece of work it starts)."""
    if not seen and not store.check(["weights/version"]):
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
    """Weights in shared memory (one tensor per weight) plus a version counter; one machine.

    Built from a :class:`Layout` (zeros, version -1: nothing published yet) or from a state (its
    copy, at ``version``); :meth:`publish` copies bucket by bucket, so under ZeRO-3 the trainer
    gathers one bucket at a time, never the whole model."""

    def __init__(self, state: Layout | dict[str, torch.Tensor], ctx, version: int = -1):
        if isinstance(state, Layout):
            self.layout = state
            self.buffers = {
                k: torch.zeros(s, dtype=getattr(torch, d)).share_memory_() for k, d, s in state.entries
            }
        else:
            self.layout = Layout.of(state)
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
        with self.lock, torch.no_grad():  # readers never see half an update
            for b in range(len(self.layout.buckets)):
                with source(self.layout.names(b)) as state:
                    for k in self.layout.names(b):
                        self.buffers[k].copy_(state[k].detach().to("cpu"))
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
