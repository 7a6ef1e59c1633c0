"""The trainer's side of PipelineRL's engines (paper Sec. 3.1): :class:`EnginePool` hosts the run's
store, starts the local engine processes (:mod:`scalerl.rollout.engine`), hands out work, collects
groups, broadcasts every weight update to all engines' workers (:mod:`scalerl.transport`), and
generates for evaluation through the engines (it is a :class:`~scalerl.generator.Generator`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from scalerl.config.groups.generator import GeneratorOption
from scalerl.config.groups.precision import PrecisionOption
from scalerl.generator.base import Generator
from scalerl.generator.registry import generator_class
from scalerl.messages import RunError, bind_failure, first_line
from scalerl.rollout.engine import (
    JOIN_BARRIER_MARGIN_S,
    REMOTE_TIMEOUT_S,
    EngineSpec,
    _pop,
    _push,
    serve_engine,
)
from scalerl.rollout.placement import Placement
from scalerl.rollout.server import process_context
from scalerl.transport import SharedMemoryTransport, TransportSpec, WeightSender, connect

log = logging.getLogger(__name__)


def _host_store(spec: TransportSpec):
    """The run's store, hosted here (the trainer's rank 0), or a RunError in one line where its
    port is taken: under torchrun it is MASTER_PORT + 1, which a second run on the node started with
    ``--master-port`` one above the first's (29500, 29501) holds."""
    try:
        return connect(spec, master=True)
    except RuntimeError as e:  # torch's DistNetworkError: EADDRINUSE, a host not of this machine
        why, in_use = bind_failure(e)
        if in_use:
            fix = (
                "another process there holds the port (under a launcher the store takes MASTER_PORT + 1: "
                "give runs on one node rendezvous ports at least two apart), or set placement.port to a free one"
            )
        else:
            fix = "the store's host (MASTER_ADDR under a launcher) must be an address of this machine"
        raise RunError(
            f"the run's store could not listen on {spec.host}:{spec.port} ({why}): {fix}"
        ) from None


def _in_engine_dtype(source, precision: PrecisionOption, checkpoint: bool):
    """An engine whose weights travel under checkpoint names (vLLM) computes in the ``precision``
    option's ``body``: its floating weights travel in that dtype (the trainer's are rounded to it
    already, so nothing is lost, and half the bytes move)."""
    body = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(precision.body))
    if not checkpoint or body is None:
        return source

    @contextlib.contextmanager
    def cast(names):
        with source(names) as tensors:
            yield {k: v.to(body) if v.is_floating_point() else v for k, v in tensors.items()}

    return cast


def weight_shapes(weights, checkpoint: bool, precision: PrecisionOption) -> dict[str, torch.Tensor]:
    """What each update holds, as meta tensors (name -> dtype and full shape), from the policy's
    parameters without gathering any: under ZeRO-3 a partitioned parameter keeps its full shape in
    ``ds_shape``; buffers are never partitioned. Checkpoint names (vLLM) map to their parameter, or
    to the ``original`` of a parametrized weight (the rounding parametrization keeps shape and
    dtype); floating weights take the engine's dtype (the ``precision`` option's body) as
    :func:`_in_engine_dtype` casts them."""
    from scalerl.model.weights import checkpoint_names

    module = weights.module
    # every name, tied ones too: a tied head is a state-dict name that named_parameters() would
    # list once, under the embedding
    own = {
        **dict(module.named_buffers(remove_duplicate=False)),
        **dict(module.named_parameters(remove_duplicate=False)),
    }

    def meta(t: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
        return tuple(getattr(t, "ds_shape", None) or t.shape), t.dtype

    if checkpoint:
        where = {}
        for name, (owner, attr) in checkpoint_names(module).items():
            full = f"{owner}.{attr}" if owner else attr
            original = (
                f"{owner}.parametrizations.{attr}.original" if owner else f"parametrizations.{attr}.original"
            )
            where[name] = own[full] if full in own else own[original]
    else:
        where = {name: own[name] for name in module.state_dict()}
    body = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(precision.body))
    out = {}
    for name, t in where.items():
        shape, dtype = meta(t)
        if checkpoint and body is not None and dtype.is_floating_point:
            dtype = body
        out[name] = torch.empty(shape, dtype=dtype, device="meta")
    return out


class EnginePool(Generator):
    """The trainer's side of the engines: a :class:`Generator` whose :meth:`generate` (evaluation)
    runs on the engines, plus :meth:`submit` / :meth:`receive` for the streamed training work.

    Started by the first :meth:`load_weights`, before training: the engines start, the
    weight-update group forms (every engine joined, or a clear error), then the first weights go
    out bucket by bucket (the engines start from the trainer's weights).

    ``placement``: where the engines run (this rank's :class:`~scalerl.rollout.placement.Placement`);
    ``generator`` and ``precision``: those options (the names and dtype the weights travel in);
    ``bucket_mb``: the most each broadcast bucket holds (``placement.bucket_mb``);
    ``engine_spec``: (index, first rank, store spec, threads, GPUs, owner pid, shared memory) ->
    the :class:`~scalerl.rollout.engine.EngineSpec` an engine process is started with (the setup
    binds the run's typed config to it: the engine's own setup reads it, the pool never does)."""

    samples_from_trainer_module = False
    splits_work = True  # generate() spreads one call's prompts over the engines itself

    def __init__(
        self,
        placement: Placement,
        tokenizer,
        *,
        generator: GeneratorOption,
        precision: PrecisionOption,
        bucket_mb: float,
        engine_spec: Callable[..., EngineSpec],
        trainer_device: torch.device,
        seed: int = 0,
    ):
        self.placement, self.tokenizer = placement, tokenizer
        self.generator, self.precision, self.bucket_mb = generator, precision, float(bucket_mb)
        self.engine_spec = engine_spec
        self.trainer_device = trainer_device
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0
        self.started = False
        self.ready = False
        self.sender = None
        self.layout = None  # what each update holds, in buckets (every rank)
        self.procs: list = []
        self.outstanding: dict[int, int] = {}  # engine -> work items given, not yet returned
        self._owner: dict[int, int] = {}  # work id -> engine
        self._eval_id = 0
        self._early: list = []  # training results that came while waiting for evaluation
        self._waiter: _Waiter | None = None  # blocks on the results queue (see _get)
        # remote engine -> (its last heartbeat value, when this process first saw it, monotonic)
        self._beats: dict[int, tuple[bytes, float]] = {}
        self.weight_seconds = 0.0  # spent handing weights over (packing, waiting for the last update)
        self.updates = 0
        # how long rank 0 waits at start for every engine to build its engine and join the
        # weight-update group (the other ranks wait JOIN_BARRIER_MARGIN_S longer)
        self.join_timeout_s = float(placement.timeout_s)

    # ------------------------------------------------------------------ start
    @property
    def engines(self) -> int:
        return int(self.placement.engines) + int(self.placement.remote_engines)

    def _first(self, weights) -> None:
        """Every rank: the update's layout from the parameters' metadata (no gather: under ZeRO-3
        a parameter's full shape is its ``ds_shape``), the same buckets on every rank, so each
        update gathers bucket by bucket in step."""
        from scalerl.transport import Layout

        # the names the engines load weights under (vLLM: a checkpoint's), from the generator's class
        checkpoint = bool(generator_class(self.generator.name).checkpoint_names)
        precision = self.precision
        self.source_of = lambda w: _in_engine_dtype(w.source(checkpoint), precision, checkpoint)
        shapes = weight_shapes(weights, checkpoint, precision)
        self.layout = Layout.of(shapes, self.bucket_mb)

    def _start(self) -> None:
        p = self.placement
        world = 1 + self.engines * int(p.tensor_parallel_size)
        spec = TransportSpec(p.backend, p.host, int(p.port), world, float(p.timeout_s))
        ctx = process_context()
        # shared memory: zeros until the first publish fills it (bucket by bucket)
        shm = SharedMemoryTransport(self.layout, ctx) if p.backend == "shm" else None
        self.store = _host_store(spec)
        spec = TransportSpec(p.backend, p.host, int(self.store.port), world, float(p.timeout_s))
        self.spec = spec
        self.store.set(
            "engines/spec", json.dumps({"backend": p.backend, "world": world, "timeout_s": spec.timeout_s})
        )
        if shm is None:
            self.sender = WeightSender(
                self.store, spec, self.layout, device=self.trainer_device, alive=self.alive
            )
        else:
            self.sender = shm
        tp = int(p.tensor_parallel_size)
        for e in range(int(p.engines)):
            es = self.engine_spec(
                e, 1 + e * tp, spec, p.generator_threads, tuple(p.engine_gpus[e]), os.getpid(), shm
            )
            proc = ctx.Process(target=serve_engine, args=(es,), daemon=True)
            proc.start()
            self.procs.append(proc)
        self.outstanding = dict.fromkeys(range(self.engines), 0)
        self.started = True

    def _join(self) -> None:
        """Rank 0: until every engine joined the weight-update group (it builds its engine first),
        or a RunError naming the engines that did not, where they should have joined, and after
        how long."""
        from scalerl.transport import JoinTimeout

        if not isinstance(self.sender, WeightSender):
            return
        timeout = float(self.join_timeout_s)
        try:
            self.sender.wait_joined(timeout)
        except JoinTimeout as e:
            tp = int(self.placement.tensor_parallel_size)
            engines = sorted({(r - 1) // tp for r in e.missing})
            who = (
                f"generator engine(s) {', '.join(map(str, engines))}" if engines else "the generator engines"
            )
            raise RunError(
                f"{who} did not join the weight-update group at {self.spec.host}:{self.spec.port} "
                f"({self.spec.backend}) within {timeout:g} s (placement.timeout_s): the engine's log says "
                "why (building the engine, or reaching that address from its node); raise "
                "placement.timeout_s where loading its model takes longer"
            ) from e
        except RuntimeError as e:
            if (why := self.gone()) is not None:
                raise RunError(why) from e
            raise

    def _group_at_start(self, weights) -> None:
        """Every rank, at the first weights (before training): rank 0 starts the engines and waits
        until the weight-update group formed; the other ranks wait for it in a barrier of a gloo
        group made for that, whose timeout is longer than the join's. They must not wait inside a
        ZeRO-3 gather instead: that collective runs under the default group's timeout (NCCL's: 10
        min), shorter than an engine may take to load a large model, and it would hold rank 0's
        first bucket gather hostage. The barrier group is formed before rank 0 starts waiting (all
        ranks are there) and destroyed after."""
        import datetime

        import torch.distributed as dist

        self._first(weights)
        many = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        barrier = None
        if many:
            wait_s = float(self.join_timeout_s) + JOIN_BARRIER_MARGIN_S
            barrier = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=wait_s))
        try:
            if self.placement.main:
                self._start()
                self._join()
            if barrier is not None:
                dist.barrier(group=barrier)
        finally:
            if barrier is not None:
                dist.destroy_process_group(barrier)

    def load_weights(self, weights, version: int) -> None:
        """Every rank calls it: under ZeRO-3 each bucket's parameters are gathered in turn (a
        collective; never the whole model, the first update included); rank 0 sends each bucket."""
        t0 = time.perf_counter()
        if self.layout is None:
            self._group_at_start(weights)
        source = self.source_of(weights)
        if self.placement.main:
            try:
                self.sender.publish(source, version)
            except RuntimeError as e:  # the transport saw an engine gone: say which, and how
                if (why := self.gone()) is not None:
                    raise RunError(why) from e
                raise
        else:  # the same gathers as rank 0, bucket by bucket
            for b in range(len(self.layout.buckets)):
                with source(self.layout.names(b)):
                    pass
        self.weight_seconds += time.perf_counter() - t0
        self.updates += 1
        self.version = int(version)

    def wait_ready(self) -> None:
        """Until every engine has built its model and taken the first weights."""
        if self.ready:
            return
        ready: set[int] = set()
        while len(ready) < self.engines:
            kind, e, _, payload = self._get(timeout=900)
            if kind == "ready":
                ready.add(e)
            elif kind == "error":
                raise RunError(f"generator engine {e} failed to start:\n{payload}")
            else:
                self._early.append((kind, e, _, payload))
        self.ready = True

    # ------------------------------------------------------------------ liveness
    def alive(self) -> bool:
        return self.gone() is None

    def gone(self) -> str | None:
        """Why an engine can no longer answer (a local process that ended, a remote one whose
        heartbeat stopped), or None while every engine is up."""
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                if p.exitcode is not None and p.exitcode < 0:  # a signal: the process printed nothing
                    return f"generator engine {i} was killed by signal {-p.exitcode} ({_signal_name(-p.exitcode)})"
                return f"generator engine {i} died (exit code {p.exitcode}); its output above says why"
        for e in range(int(self.placement.engines), self.engines):  # engines on other tasks
            beat = self.store.get(f"engines/beat/{e}") if self.store.check([f"engines/beat/{e}"]) else None
            if beat is not None and self._silent_for(e, beat) > REMOTE_TIMEOUT_S:
                return f"generator engine {e} on another task stopped answering"
        return None

    def _silent_for(self, engine: int, beat: bytes) -> float:
        """Seconds since this process saw ``engine``'s heartbeat change, on its own monotonic clock:
        the beat's value is the engine's machine's time, which another machine's clock may lead or
        trail by more than the timeout (an engine was taken as gone at once, or late)."""
        now = time.monotonic()
        seen = self._beats.get(engine)
        if seen is None or seen[0] != beat:
            self._beats[engine] = seen = (beat, now)
        return now - seen[1]

    def _get(self, timeout: float):
        """The next item of the engines' results queue. A waiting trainer blocks in the store on a
        client of its own and uses no CPU, which the engines need where runs share the cores (a
        study: polling the queue every millisecond was measurable there, see
        benchmarks/results/*_blocking-wait-ceiling-study.md); every second while it waits, a
        watcher thread asks whether an engine is gone and wakes it with the reason (pushed to the
        queue: a ``gone`` item). ``timeout``: seconds without any item before a TimeoutError."""
        item = _pop(self.store, "results")
        if item is not None:
            return item
        if self._waiter is None:
            self._waiter = _Waiter(
                connect(self.spec), self.gone, lambda why: _push(self.store, "results", why)
            )
        item = self._waiter.get("results", timeout)
        if item is None:
            raise TimeoutError("no answer from the generator engines")
        if item[0] == "gone":
            raise RunError(item[3])
        return item

    # ------------------------------------------------------------------ training work
    def submit(self, work_id: int, prompts, group_ids: list[int], version: int | None = None) -> None:
        """Give training work to the engine with the least outstanding; ``version``: the oldest
        weights it may be generated from (the trainer's step when it gives the work, announced
        before; None: whatever the trainer announced last)."""
        e = min(self.outstanding, key=lambda k: (self.outstanding[k], k))
        self.outstanding[e] += 1
        self._owner[work_id] = e
        _push(self.store, f"engines/work/{e}", ("train", work_id, prompts, list(group_ids), version))

    def receive(self, timeout: float = 900):
        """(work id, groups, verifier counts) of the next finished piece of training work."""
        while True:
            if self._early:
                kind, e, work_id, payload = self._early.pop(0)
            else:
                kind, e, work_id, payload = self._get(timeout)
            if kind == "error":
                raise RuntimeError(f"generator engine {e} failed:\n{payload}")
            if kind == "groups":
                self.outstanding[self._owner.pop(work_id, e)] -= 1
                groups, errors = payload
                return work_id, groups, errors

    @property
    def busy_seconds(self) -> float:
        """Seconds the engines spent generating, summed over engines."""
        total = 0.0
        for e in range(self.engines):
            key = f"engines/status/{e}"
            if self.started and self.store.check([key]):
                total += float(json.loads(self.store.get(key).decode())[0])
        return total

    def _ask(self, requests: dict[int, tuple], kind: str) -> dict[int, Any]:
        """Send one request per engine (engine -> item without its id); their answers by engine."""
        ids = {}
        for e, item in requests.items():
            self._eval_id += 1
            ids[self._eval_id] = e
            _push(self.store, f"engines/work/{e}", (item[0], self._eval_id, *item[1:]))
        got: dict[int, Any] = {}
        while len(got) < len(ids):
            k, e, work_id, payload = self._get(timeout=900)
            if k == "error":
                raise RuntimeError(f"generator engine {e} failed:\n{payload}")
            if k == kind and work_id in ids:
                got[ids[work_id]] = payload
            else:
                self._early.append((k, e, work_id, payload))
        return got

    def fingerprints(self) -> list[dict[str, str]]:
        """Each engine's digest of the weights it samples with, once it holds the current version."""
        self.wait_ready()
        got = self._ask({e: ("fingerprint", self.version) for e in range(self.engines)}, "fingerprint")
        return [got[e] for e in range(self.engines)]

    # ------------------------------------------------------------------ evaluation
    def _generate(self, prompts, prompt_ids, n, *, version, group_ids, weight_update, on_step):
        """Evaluation: the prompts split over the engines, each part from its own seeded stream,
        generated from exactly ``version``'s weights."""
        if weight_update is not None:
            raise ValueError("the engine pool takes weights through load_weights only")
        self.wait_ready()
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.rng))
        size = -(-len(prompts) // self.engines)
        requests = {
            e: ("eval", list(prompts[e * size : (e + 1) * size]), n, seed + e, int(version))
            for e in range(self.engines)
            if prompts[e * size : (e + 1) * size]
        }
        got = self._ask(requests, "eval")
        groups: list = []
        for e in sorted(got):
            groups.extend(got[e])
        for g, gid in zip(groups, group_ids):  # Generator.generate gave one id per prompt
            for s in g:
                s.group_id = gid
        return groups

    # ------------------------------------------------------------------ stop
    def close(self) -> None:
        """Stop the engines (local ones are joined, then killed if they do not stop)."""
        if not self.started:
            return
        try:
            for e in range(self.engines):
                _push(self.store, f"engines/work/{e}", "stop")
            deadline = time.time() + 10
            for p in self.procs:
                p.join(timeout=max(0.1, deadline - time.time()))
        except Exception:  # noqa: BLE001 - the store may be gone with a failed run
            pass
        finally:
            for p in self.procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
            if self.sender is not None:
                self.sender.close()  # the weight-update group torn down (the engines left it)
                self.sender = None
            if self._waiter is not None:
                self._waiter.close()
                self._waiter = None
            self.started = False


class _Waiter:
    """A blocking read of a store queue whose producers may die: ``get`` waits in the store on
    ``client`` (a client of its own: a blocked read holds its client), while a daemon thread calls
    ``gone`` every second and, where it names a reason, calls ``wake`` with the item ``("gone",
    -1, None, reason)``, which the caller pushes to the queue to end the wait. The thread checks
    only while a read waits; one that wakes a read that got its item meanwhile leaves the reason
    queued for the next read (the engine is gone all the same). A check that fails (``gone``
    raises) is a reason too, as it was when the trainer's own thread checked: the read ends
    with it, or, where the store cannot take the wake-up either, the read that the store then
    fails returns it."""

    def __init__(self, client, gone: Callable[[], str | None], wake: Callable[[tuple], None]):
        import threading

        self.client = client
        self._gone, self._wake = gone, wake
        self._waiting = threading.Event()
        self._stop = threading.Event()
        self.reason: str | None = None  # why the watcher stopped: a read ends with it
        self._thread = threading.Thread(target=self._watch, name="scalerl-results-watch", daemon=True)
        self._thread.start()

    def get(self, key: str, timeout: float):
        """The next item of queue ``key`` (unpickled); None after ``timeout`` seconds; the
        watcher's ``gone`` item where it stopped and the store did not take its wake-up."""
        import pickle
        from datetime import timedelta

        import torch.distributed as dist

        if self.reason is not None and not self._thread.is_alive():
            return ("gone", -1, None, self.reason)
        self.client.set_timeout(timedelta(seconds=max(0.001, float(timeout))))
        self._waiting.set()
        try:
            return pickle.loads(self.client.queue_pop(key, block=True))
        except dist.DistStoreError:  # the timeout, or a store gone: the wait ended without an item
            return None if self.reason is None else ("gone", -1, None, self.reason)
        finally:
            self._waiting.clear()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._waiting.wait(timeout=1.0)
            if self._stop.wait(1.0) or not self._waiting.is_set():
                continue
            try:
                why = self._gone()
            except Exception as e:  # noqa: BLE001 - said to the waiting read, as the trainer's own check did
                why = f"could not check the generator engines ({type(e).__name__}: {first_line(e)})"
            if why is None:
                continue
            self.reason = why
            try:
                self._wake(("gone", -1, None, why))
            except Exception:  # noqa: BLE001 - the store is gone too: the read it fails returns the reason
                return
            self._waiting.clear()  # one wake-up a wait

    def close(self) -> None:
        self._stop.set()
        self._waiting.set()  # ends the watcher's wait
        self._thread.join(timeout=5)


def _signal_name(signum: int) -> str:
    """``SIGKILL`` for 9 (the out-of-memory killer's, or a user's ``kill -9``)."""
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown"
