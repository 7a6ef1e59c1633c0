"""The weight-update group between the trainer and generator engines: every tensor arrives
bit-exact, every version in order, at every receiver, over a real gloo process group of three
processes; buckets are bounded; shared memory as the one-machine alternative."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import textwrap
import time

import pytest
import torch

from scalerl.transport import (
    Layout,
    SharedMemoryTransport,
    TransportSpec,
    WeightReceiver,
    WeightSender,
    connect,
    load_into,
)


def make_model(seed: int, width: int = 24, depth: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.LayerNorm(width),
        *(torch.nn.Linear(width, width) for _ in range(depth)),
        torch.nn.Linear(width, 7),
    )
    model.register_buffer("steps", torch.zeros(3, dtype=torch.long))  # a second dtype, not a parameter
    return model


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def receiver(spec, rank: int, width: int, versions: int, out) -> None:
    try:
        model = make_model(123, width)  # other initial weights: only the transport can change them
        rx = WeightReceiver(spec, rank)
        rx.layout.check_matches(model)
        current = -1
        while current < versions - 1:
            v = rx.announced()
            if v is not None and v != current:
                assert v == current + 1, f"version {v} after {current}"
                load_into(model, rx.receive())
                current = v
                # numpy copies travel by value; torch tensors would be shared through this process's
                # file descriptors, gone once it has exited
                out.put((rank, v, {k: t.numpy().copy() for k, t in state_of(model).items()}))
        out.put((rank, "done", None))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.put((rank, "error", f"{type(e).__name__}: {e}"))


def test_layout_buckets_hold_one_dtype_within_the_size_and_unpack_bit_exact():
    state = state_of(make_model(0, width=64))  # 64x64 fp32 = 16 KiB per weight matrix
    layout = Layout.of(state, bucket_mb=10 / 1024)  # 10 KiB buckets
    assert Layout.from_json(layout.to_json()) == layout
    assert sorted(i for b in layout.buckets for i in b) == list(range(len(state)))  # each tensor once
    assert len(layout.buckets) > 2
    for b in range(len(layout.buckets)):
        dtypes = {layout.entries[i][1] for i in layout.buckets[b]}
        assert len(dtypes) == 1
        if len(layout.buckets[b]) > 1:  # a tensor larger than a bucket travels alone
            assert layout.numel(b) * 4 <= 10 * 1024
        buffer = layout.pack(b, state, "cpu")
        assert buffer.numel() == layout.numel(b)
        for k, v in layout.unpack(b, buffer).items():
            assert torch.equal(v, state[k])


@pytest.mark.slow  # starts two processes
def test_every_receiver_gets_every_version_bit_exact():
    ctx = mp.get_context("spawn")
    trainer = make_model(0)
    sent = {0: state_of(trainer)}
    layout = Layout.of(sent[0], bucket_mb=1 / 1024)  # several buckets
    spec = TransportSpec("gloo", "127.0.0.1", 0, world=3)
    store = connect(spec, master=True)
    spec = TransportSpec("gloo", "127.0.0.1", store.port, world=3)
    out = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(spec, r, 24, 4, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    tx = WeightSender(store, spec, layout, alive=lambda: all(p.is_alive() for p in procs))
    try:
        tx.publish(sent[0], 0)
        for version in (1, 2, 3):
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(torch.randn_like(p))
                trainer.steps += version
            sent[version] = state_of(trainer)
            tx.publish(sent[version], version)
        got: dict = {1: {}, 2: {}}
        done = 0
        while done < 2:
            rank, kind, payload = out.get(timeout=120)
            if kind == "error":
                pytest.fail(payload)
            if kind == "done":
                done += 1
                continue
            got[rank][kind] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank in (1, 2):
        assert sorted(got[rank]) == [0, 1, 2, 3]
        for v, state in got[rank].items():
            for k, t in sent[v].items():
                assert torch.equal(torch.from_numpy(state[k]), t), (
                    f"{k} of version {v} differs at rank {rank}"
                )
    assert tx.updates == 4 and tx.seconds > 0


def _mismatched(spec, out) -> None:
    try:
        rx = WeightReceiver(spec, 1)
        rx.layout.check_matches(make_model(0, width=16))  # other shapes
        out.put("no error")
    except Exception as e:  # noqa: BLE001
        out.put(str(e))


@pytest.mark.slow  # starts a process
def test_a_generator_with_another_model_gets_a_clear_error():
    ctx = mp.get_context("spawn")
    spec = TransportSpec("gloo", "127.0.0.1", 0, world=2)
    store = connect(spec, master=True)
    spec = TransportSpec("gloo", "127.0.0.1", store.port, world=2)
    tx = WeightSender(store, spec, Layout.of(state_of(make_model(0))))
    out = ctx.Queue()
    proc = ctx.Process(target=_mismatched, args=(spec, out))
    proc.start()
    try:
        message = out.get(timeout=120)
    finally:
        proc.join(timeout=30)
        tx.close()
    assert "trainer and generator must build the same model" in message
    assert "0.weight" in message


def test_publish_stops_when_a_generator_process_is_gone():
    spec = TransportSpec("gloo", "127.0.0.1", 0, world=2)
    store = connect(spec, master=True)
    spec = TransportSpec("gloo", "127.0.0.1", store.port, world=2)
    tx = WeightSender(store, spec, Layout.of(state_of(make_model(0))), alive=lambda: False)
    with pytest.raises(RuntimeError, match="generator process is gone"):
        tx.publish(state_of(make_model(1)), 1)


def test_the_store_answers_the_trainer_while_the_sender_waits_for_receivers():
    """Joining the group waits in a store call until every receiver has joined; the trainer's own
    calls on the store (work for the engines, their stop when a run fails) do not wait behind it."""
    spec = TransportSpec("gloo", "127.0.0.1", 0, world=2, timeout_s=20)
    store = connect(spec, master=True)
    spec = TransportSpec("gloo", "127.0.0.1", store.port, world=2, timeout_s=20)
    tx = WeightSender(store, spec, Layout.of(state_of(make_model(0))))
    time.sleep(1.0)  # the sender is now waiting for rank 1, which never comes
    t0 = time.monotonic()
    store.queue_push("engines/work/0", b"stop")
    store.set("weights/version", "0")
    waited = time.monotonic() - t0
    tx.close()
    assert tx._connect.is_alive(), "the sender stopped waiting before the receiver's timeout"
    assert waited < 10, f"a store call waited {waited:.0f} s behind the sender's join (its timeout: 20 s)"


def test_a_backend_other_than_gloo_or_nccl_is_refused():
    spec = TransportSpec("mpi", "127.0.0.1", 0, world=2)
    with pytest.raises(ValueError, match="must be gloo or nccl"):
        WeightSender(None, spec, Layout.of(state_of(make_model(0))))


def test_shared_memory_transport_loads_the_newest_weights():
    trainer, gen = make_model(0), make_model(1)
    tx = SharedMemoryTransport(state_of(trainer), mp.get_context("spawn"), 0)
    assert tx.poll(gen, 0) is None
    new = state_of(make_model(2))
    tx.publish(new, 1)
    assert tx.poll(gen, 0) == 1
    assert all(torch.equal(gen.state_dict()[k], v) for k, v in new.items())


# ---------------------------------------------------------------------- memory, ordering, start, close
def _held_bytes(obj) -> int:
    """Bytes of the tensors an object references through its attributes (dicts and lists too)."""
    seen: set[int] = set()

    def walk(v) -> int:
        if isinstance(v, torch.Tensor):
            if id(v) in seen:
                return 0
            seen.add(id(v))
            return v.numel() * v.element_size()
        if isinstance(v, dict):
            return sum(walk(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return sum(walk(x) for x in v)
        return 0

    return sum(walk(v) for v in vars(obj).values())


def _slow_receiver(spec, rank: int, width: int, versions: int, delay: float, out, depth: int = 0) -> None:
    """Takes every update, sleeping ``delay`` between buckets (an engine between decode steps);
    reports what its receiver holds between updates and at most while receiving."""
    try:
        model = make_model(123, width, depth)
        before = _listening_ports(os.getpid())
        rx = WeightReceiver(spec, rank)
        mine = _listening_ports(os.getpid()) - before  # the group's listener(s)
        current = -1
        while current < versions - 1:
            v = rx.announced()
            if v is None or v == current:
                time.sleep(0.001)
                continue
            for name, t in rx.receive():
                load_into(model, [(name, t)])
                time.sleep(delay)
            current = v
            out.put((rank, "held", _held_bytes(rx)))
        out.put((rank, "state", {k: t.numpy().copy() for k, t in state_of(model).items()}))
        out.put((rank, "peak", getattr(rx, "peak_bytes", None)))
        close = getattr(rx, "close", None)
        if close is not None:
            close()
        out.put((rank, "listening", [sorted(mine), sorted(mine & _listening_ports(os.getpid()))]))
        out.put((rank, "done", None))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.put((rank, "error", f"{type(e).__name__}: {e}"))


def _group_of(world: int, timeout_s: float = 60.0):
    spec = TransportSpec("gloo", "127.0.0.1", 0, world=world, timeout_s=timeout_s)
    store = connect(spec, master=True)
    return store, TransportSpec("gloo", "127.0.0.1", store.port, world=world, timeout_s=timeout_s)


def _collect(out, ranks, procs) -> dict:
    got: dict = {r: {} for r in ranks}
    done = 0
    while done < len(ranks):
        rank, kind, payload = out.get(timeout=120)
        if kind == "error":
            pytest.fail(payload)
        if kind == "done":
            done += 1
        elif kind == "held":
            got[rank].setdefault("held", []).append(payload)
        else:
            got[rank][kind] = payload
    for p in procs:
        p.join(timeout=30)
    return got


@pytest.mark.slow  # starts a process
def test_publish_and_receive_hold_a_bounded_number_of_buckets_never_the_model():
    """Rank 0 keeps at most PUBLISH_INFLIGHT packed buckets (not a copy of every bucket until the
    next publish); a receiver holds no buffer between updates and one bucket while receiving (not
    a whole unsharded copy for the whole run)."""
    from scalerl.transport import PUBLISH_INFLIGHT

    ctx = mp.get_context("spawn")
    width = 64
    trainer = make_model(0, width, depth=6)
    layout = Layout.of(state_of(trainer), bucket_mb=20 / 1024)  # 20 KiB buckets of a ~120 KiB model
    bucket = max(layout.numel(b) * _itemsize(layout.dtype(b)) for b in range(len(layout.buckets)))
    whole = sum(layout.numel(b) * _itemsize(layout.dtype(b)) for b in range(len(layout.buckets)))
    assert len(layout.buckets) >= 5 and whole > 3 * bucket
    store, spec = _group_of(2)
    out = ctx.Queue()
    proc = ctx.Process(target=_slow_receiver, args=(spec, 1, width, 3, 0.0, out, 6))
    proc.start()
    tx = WeightSender(store, spec, layout, alive=proc.is_alive)
    held_after = []
    try:
        for version in range(3):
            _perturb_model(trainer, version)
            tx.publish(state_of(trainer), version)
            held_after.append(sum(b.numel() * b.element_size() for b in tx._pending))
        got = _collect(out, [1], [proc])
        assert max(held_after) <= PUBLISH_INFLIGHT * bucket < whole, held_after
        assert tx.peak_pending_bytes <= PUBLISH_INFLIGHT * bucket
        assert got[1]["held"] == [0, 0, 0], "the receiver kept buffers between updates"
        assert got[1]["peak"] <= bucket
        for k, t in state_of(trainer).items():  # and the last update arrived whole
            assert torch.equal(torch.from_numpy(got[1]["state"][k]), t), k
    finally:
        tx.close()
        if proc.is_alive():
            proc.kill()


def _itemsize(dtype: str) -> int:
    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def _perturb_model(model: torch.nn.Module, version: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
        model.steps += version


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("ordered", [True, False])
def test_ordered_publish_gathers_a_bucket_only_after_the_previous_broadcast_completed(ordered):
    """Through a real gloo group with a receiver that takes its time: ordered (NCCL's mode) enters
    each bucket's gather (the trainer's default-group collective under ZeRO-3) with no weight
    broadcast in flight and returns with none; unordered (gloo's) keeps fewer than PUBLISH_INFLIGHT
    in flight at each gather."""
    from scalerl.transport import PUBLISH_INFLIGHT

    ctx = mp.get_context("spawn")
    width = 64
    trainer = make_model(0, width)
    layout = Layout.of(state_of(trainer), bucket_mb=10 / 1024)
    store, spec = _group_of(2)
    out = ctx.Queue()
    proc = ctx.Process(target=_slow_receiver, args=(spec, 1, width, 2, 0.02, out))
    proc.start()
    tx = WeightSender(store, spec, layout, alive=proc.is_alive, ordered=ordered)
    in_flight: list[int] = []

    def source(state):
        @contextlib.contextmanager
        def bucket(names):
            in_flight.append(sum(not w.is_completed() for w in tx._works))
            yield {k: state[k] for k in names}

        return bucket

    try:
        for version in range(2):
            _perturb_model(trainer, version)
            tx.publish(source(state_of(trainer)), version)
            if ordered:
                assert tx._works == [] and tx._pending == [], "publish returned with broadcasts in flight"
        _collect(out, [1], [proc])
    finally:
        tx.close()
        if proc.is_alive():
            proc.kill()
    assert len(in_flight) == 2 * len(layout.buckets)
    if ordered:
        assert in_flight == [0] * len(in_flight), in_flight
    else:
        assert max(in_flight) <= PUBLISH_INFLIGHT - 1, in_flight


def _joins_then_idles(spec, rank: int, join: bool, out) -> None:
    try:
        if join:  # waits inside, for the group that cannot form without rank 2
            out.put((rank, "joining"))
            WeightReceiver(spec, rank)
        else:  # an engine still building (or hung): it reached the store, never the group
            connect(spec).wait(["weights/layout"])
            out.put((rank, "idle"))
        time.sleep(60)
    except Exception as e:  # noqa: BLE001
        out.put((rank, f"error {type(e).__name__}: {e}"))


@pytest.mark.slow  # starts two processes
def test_a_receiver_that_never_joins_is_named_with_the_address_within_the_join_timeout():
    """The group forms at start: a receiver that never joins is one error naming its rank, the
    store's host:port and the timeout, raised once the timeout has passed (not the group's 600 s)."""
    from scalerl.transport import JoinTimeout

    ctx = mp.get_context("spawn")
    store, spec = _group_of(3, timeout_s=600)
    out = ctx.Queue()
    procs = [ctx.Process(target=_joins_then_idles, args=(spec, r, r == 1, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    tx = WeightSender(store, spec, Layout.of(state_of(make_model(0))), alive=lambda: True)
    try:
        assert sorted(out.get(timeout=120) for _ in procs) == [(1, "joining"), (2, "idle")]
        t0 = time.monotonic()
        with pytest.raises(JoinTimeout) as e:
            tx.wait_joined(timeout_s=3)
        waited = time.monotonic() - t0
    finally:
        tx.close()
        for p in procs:
            p.kill()
            p.join(timeout=10)
    assert 3 <= waited < 10, waited
    assert e.value.missing == [2]
    message = str(e.value)
    assert "\n" not in message
    assert f"rank(s) 2 did not join the weight-update group at 127.0.0.1:{spec.port}" in message
    assert "within 3 s" in message


def test_a_receiver_binds_its_own_address_toward_the_store_host_never_a_remote_one():
    """gloo's device binds the member's own address: the trainer the store's host (its own), a
    receiver the local address that routes to the store's host. 192.0.2.1 (TEST-NET-1, not an
    address of this machine) stands for a trainer on another node: a receiver must not bind it."""
    import socket

    from scalerl.transport import bind_host

    assert bind_host("127.0.0.1", master=True) == "127.0.0.1"
    assert bind_host("127.0.0.1", master=False) == "127.0.0.1"
    remote = "192.0.2.1"
    assert bind_host(remote, master=True) == remote  # the trainer is that host
    mine = bind_host(remote, master=False)
    assert mine != remote
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((mine, 0))  # an address of this machine: a receiver can listen there


def _listening_ports(pid: int) -> set[int]:
    import psutil

    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == "LISTEN"}


@pytest.mark.slow  # starts two processes, one after the other
def test_close_tears_the_group_down_and_a_new_group_forms_on_a_new_port():
    """After close the sender's group is gone (its gloo listener closed), the receiver left it (its
    listener closed too) and exited cleanly, and a second group in the same process forms on a new store port and delivers
    bit-exact weights."""
    ctx = mp.get_context("spawn")
    me = os.getpid()
    ports = []
    for round_ in range(2):
        before = _listening_ports(me)
        store, spec = _group_of(2)
        ports.append(spec.port)
        out = ctx.Queue()
        proc = ctx.Process(target=_slow_receiver, args=(spec, 1, 24, 1, 0.0, out))
        proc.start()
        trainer = make_model(round_)
        tx = WeightSender(store, spec, Layout.of(state_of(trainer)), alive=proc.is_alive)
        tx.publish(state_of(trainer), 0)
        got = _collect(out, [1], [proc])
        for k, t in state_of(trainer).items():
            assert torch.equal(torch.from_numpy(got[1]["state"][k]), t), k
        assert proc.exitcode == 0
        joined, left = got[1]["listening"]
        assert joined and not left, f"the receiver still listens on {left} after it left the group"
        group_ports = _listening_ports(me) - before - {spec.port}
        assert group_ports, "the group listens while it is up"
        tx.close()
        assert tx.group is None
        assert not (_listening_ports(me) & group_ports), "the group's listener outlived close"
        del store
    assert ports[0] != ports[1]


def test_shared_memory_publish_gathers_one_bucket_at_a_time():
    """The shared-memory backend (one machine, HF engines) starts from zeros of the layout (no
    copy of the trainer's model at start) and publishes bucket by bucket: each gather (a ZeRO-3
    collective) asks for one bucket's tensors, never the whole model."""
    trainer, gen = make_model(0, 64, depth=4), make_model(1, 64, depth=4)
    state = state_of(trainer)
    layout = Layout.of(state, bucket_mb=20 / 1024)
    tx = SharedMemoryTransport(layout, mp.get_context("spawn"))
    assert tx.poll(gen, -1) is None  # nothing published yet
    asked: list[list[str]] = []

    def source(names):
        asked.append(list(names))
        return contextlib.nullcontext({k: state[k] for k in names})

    tx.publish(source, 0)
    assert asked == [layout.names(b) for b in range(len(layout.buckets))] and len(asked) > 2
    assert tx.poll(gen, -1) == 0
    assert all(torch.equal(gen.state_dict()[k], v) for k, v in state.items())


# ---------------------------------------------------------------------- the engine pool's side
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "fp32_head", "bf16"])
@pytest.mark.parametrize("generator", ["hf", "vllm"])
def test_the_pools_layout_comes_from_metadata_equal_to_a_whole_gather(precision, generator, tied):
    """EnginePool._first learns the update's layout without gathering anything (names, dtypes in
    the engine's dtype, full shapes), equal to what a whole gather of the same source gives; the
    source is asked for nothing while it does. Also with tied embeddings (SmolLM2, Qwen2.5-0.5B): the
    head is a name of the state dict that ``named_parameters`` lists only once, as the embedding."""
    from conftest import TINY
    from parts import layout_options, policy_options, pool_options

    from scalerl.config import compose, typed
    from scalerl.model.build import build_policy
    from scalerl.model.weights import PolicyWeights
    from scalerl.rollout.placement import place_engines
    from scalerl.rollout.pool import EnginePool, _in_engine_dtype
    from scalerl.task import build_task

    cpu = torch.device("cpu")
    cfg = compose(
        [
            *TINY,
            "async_mode=pipeline_rl",
            f"precision={precision}",
            "placement.bucket_mb=0.02",
            f"model.tie_word_embeddings={str(tied).lower()}",
        ]
    )
    cfg.generator.name = generator  # the naming (checkpoint names for vLLM) without building vLLM
    config = typed(cfg)
    model, tokenizer, _ = build_policy(config.model, build_task(config.task), cpu, **policy_options(config))
    gathered: list[int] = []

    @contextlib.contextmanager
    def gather(params):
        gathered.append(len(list(params)))
        yield

    weights = PolicyWeights(model, gather=gather)
    placement = place_engines(layout_options(config), cpu, 1, 2)
    pool = EnginePool(placement, tokenizer, **pool_options(config), trainer_device=cpu)
    pool._first(weights)
    assert gathered == [], "learning the layout gathered parameters"
    checkpoint = generator == "vllm"
    source = _in_engine_dtype(weights.source(checkpoint), config.precision, checkpoint)
    with source(weights.names(checkpoint)) as whole:
        assert pool.layout == Layout.of(whole, 0.02)
    assert len(pool.layout.buckets) > 2


@pytest.mark.slow  # an engine process
def test_an_engine_that_never_joins_fails_the_pool_at_start_naming_it():
    """The weight group forms as the engines start: an engine that never joins (here one on a task
    of its own that never started) is a RunError naming it, the store's address and the timeout,
    once the join timeout has passed, and the engines that did start stop."""
    import dataclasses

    from conftest import TINY
    from parts import layout_options, policy_options, pool_options

    from scalerl.config import compose, typed
    from scalerl.messages import RunError
    from scalerl.model.build import build_policy
    from scalerl.model.weights import PolicyWeights
    from scalerl.rollout.placement import place_engines
    from scalerl.rollout.pool import EnginePool
    from scalerl.task import build_task

    cpu = torch.device("cpu")
    # placement.timeout_s: the local engine builds its model and joins within it
    cfg = compose([*TINY, "async_mode=pipeline_rl", "placement=split", "placement.timeout_s=20"])
    config = typed(cfg)
    model, tokenizer, _ = build_policy(config.model, build_task(config.task), cpu, **policy_options(config))
    placement = dataclasses.replace(place_engines(layout_options(config), cpu, 1, 2), remote_engines=1)
    pool = EnginePool(placement, tokenizer, **pool_options(config), trainer_device=cpu)
    t0 = time.monotonic()
    try:
        with pytest.raises(RunError) as e:
            pool.load_weights(PolicyWeights(model), 0)
        waited = time.monotonic() - t0
    finally:
        pool.close()
    message = str(e.value)
    assert (
        f"generator engine(s) 1 did not join the weight-update group at 127.0.0.1:{pool.spec.port}" in message
    )
    assert "within 20 s (placement.timeout_s)" in message and "\n" not in message
    assert 20 <= waited < 60, waited
    assert all(not p.is_alive() for p in pool.procs)


ZERO3_FIRST_UPDATE = textwrap.dedent(
    """
    import contextlib, dataclasses, json, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, sys.argv[2])
    from test_deepspeed import SYNTH, synthetic
    from parts import pool_options, trainer_options
    from scalerl.config import compose, typed
    from scalerl.rollout.pool import EnginePool
    from scalerl.rollout.placement import Placement
    from scalerl.trainer import make_trainer
    from scalerl.trainer.deepspeed_engine import end_distributed, init_distributed
    from scalerl.transport import Layout

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    init_distributed(cpu)
    over = [*SYNTH, "precision=fp32", "trainer=deepspeed", "trainer.zero_stage=3",
            "async_mode=pipeline_rl", "placement.bucket_mb=0.01"]
    cfg = compose(over)
    config = typed(cfg)
    model, precision, _ = synthetic(config)
    trainer = make_trainer(model, precision, **trainer_options(config), temperature=1.0, device=cpu)
    weights = trainer.policy_weights()
    calls = []  # bytes of the parameters each gather made whole
    inner = weights.gather

    def gather(params):
        params = list(params)
        calls.append(sum(p.ds_numel * p.element_size() for p in params))
        return inner(params)

    weights = dataclasses.replace(weights, gather=gather)
    # both ranks as the pool's non-hosting ranks: the same layout, group-at-start barrier and
    # bucket-by-bucket gathers as rank 0's publish, without engine processes
    placement = Placement(trainer_threads=1, generator_threads=1, generator_device=cpu, engines=1, main=False)
    pool = EnginePool(placement, None, **pool_options(config), trainer_device=cpu)
    pool.load_weights(weights, 0)
    first = list(calls)
    sizes = [pool.layout.numel(b) * 4 for b in range(len(pool.layout.buckets))]
    with weights.source(False)(weights.names(False)) as whole:
        same = pool.layout == Layout.of({k: v for k, v in whole.items()}, 0.01)
    largest = max(p.ds_numel * p.element_size() for p in trainer.module.parameters())
    total = sum(p.ds_numel * p.element_size() for p in trainer.module.parameters())
    with open(f"{sys.argv[1]}/rank{dist.get_rank()}.json", "w") as f:
        json.dump({"first": first, "buckets": sizes, "same": same, "largest": largest, "total": total}, f)
    assert end_distributed() and not dist.is_initialized()
    """
)


@pytest.mark.slow  # two DeepSpeed ranks
@pytest.mark.deepspeed
def test_the_first_update_under_zero3_gathers_one_bucket_at_a_time(tmp_path):
    """Two DeepSpeed ZeRO-3 ranks (gloo): the engine pool's first update learns its layout without
    gathering (before: one gather of the whole model), then gathers bucket by bucket, each gather
    at most a bucket (or one parameter larger than a bucket); the layout equals a whole gather's."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from extras import need

    need("deepspeed")
    repo = Path(__file__).resolve().parents[1]
    script = tmp_path / "zero3_first.py"
    script.write_text(ZERO3_FIRST_UPDATE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")
    env = {k: v for k, v in os.environ.items() if k not in rank_vars}
    (tmp_path / "ext").mkdir()
    path = os.pathsep.join(p for p in (str(repo / "src"), env.get("PYTHONPATH")) if p)
    env.update(OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), PYTHONPATH=path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    proc = subprocess.run(
        [*cmd, str(script), str(tmp_path), str(Path(__file__).parent)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in (0, 1):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["same"], "the layout from metadata differs from a whole gather's"
        assert len(got["buckets"]) > 2 and got["total"] > 2 * max(got["buckets"])
        assert len(got["first"]) == len(got["buckets"]), got["first"]
        limit = max(0.01 * 2**20, got["largest"])
        assert max(got["first"]) <= limit < got["total"], (got["first"], got["total"])


@pytest.mark.slow  # a DeepSpeed process
@pytest.mark.deepspeed
def test_the_gpu_weight_group_check_runs_on_a_cpu(tmp_path):
    """launch/gpu_cluster_check.sh --device cpu: the GPU script's parts (weight group of one beside a
    ZeRO-3 default group, bucketed vs whole first gather, publish's memory, teardown) pass on gloo,
    so that a GPU run only has to measure."""
    import os
    import subprocess
    from pathlib import Path

    from extras import need

    need("deepspeed")
    repo = Path(__file__).resolve().parents[1]
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DS_ACCELERATOR")
    }
    env.update(OUT=str(tmp_path), OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    proc = subprocess.run(
        ["bash", str(repo / "launch" / "gpu_cluster_check.sh"), "--device", "cpu", "--shapes", "cpu-small"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "weight_group.json").read_text())
    (r,) = report["shapes"]
    assert report["failed"] == [] and report["backend"] == "gloo"
    assert r["layout_gathers"] == 0 and r["group_closed"]
    assert r["bucketed_gather_bytes"] < r["whole_gather_bytes"] == r["model_bytes"]
    assert "default group ended: True" in report["teardown"]


def test_an_engine_reads_the_announced_version_in_one_store_call_once_it_has_seen_one():
    """Before any announcement the version is None (the key is checked first); once a version was
    read, the key exists for good and a read is one store call (an engine reads it before every
    piece of work it starts), with the newest value each time."""
    from scalerl.transport import announced

    spec = TransportSpec("gloo", "127.0.0.1", 0, world=1, timeout_s=20)
    store = connect(spec, master=True)
    calls: list[str] = []

    class Counted:
        def check(self, keys):
            calls.append("check")
            return store.check(keys)

        def get(self, key):
            calls.append("get")
            return store.get(key)

    assert announced(Counted()) is None and calls == ["check"]
    store.set("weights/version", "3")
    calls.clear()
    assert announced(Counted()) == 3 and calls == ["check", "get"]
    store.set("weights/version", "4")
    calls.clear()
    assert announced(Counted(), seen=True) == 4 and calls == ["get"]


def test_a_remote_engine_s_heartbeat_is_timed_on_the_trainer_s_own_clock(monkeypatch):
    """The beat holds the engine's machine's time.time(); compared with the trainer's, an engine
    on a machine whose clock trails by more than the timeout was taken as gone at its first beat.
    Its silence is now timed from when the trainer saw the value change."""
    from types import SimpleNamespace

    from scalerl.rollout import pool
    from scalerl.rollout.engine import REMOTE_TIMEOUT_S

    now = [1000.0]
    monkeypatch.setattr(pool.time, "monotonic", lambda: now[0])
    p = SimpleNamespace(_beats={})
    trailing = str(time.time() - 10 * REMOTE_TIMEOUT_S).encode()  # a clock far behind
    assert pool.EnginePool._silent_for(p, 4, trailing) == 0.0
    now[0] += REMOTE_TIMEOUT_S / 2
    assert pool.EnginePool._silent_for(p, 4, trailing) == REMOTE_TIMEOUT_S / 2
    now[0] += 1.0
    assert pool.EnginePool._silent_for(p, 4, b"a new beat") == 0.0  # it beat again: alive
    now[0] += REMOTE_TIMEOUT_S + 1
    assert pool.EnginePool._silent_for(p, 4, b"a new beat") > REMOTE_TIMEOUT_S  # then fell silent


def test_the_weight_group_s_gloo_devices_follow_gloo_socket_ifname(monkeypatch):
    """torch.distributed's own gloo groups bind the interfaces GLOO_SOCKET_IFNAME names; the
    weight-update group bound the host's name whatever it said, which some images resolve to a
    loopback address that engines on other machines cannot reach."""
    from scalerl.transport import gloo_devices

    with pytest.raises(RuntimeError, match="Cannot resolve 203.0.113.7"):  # not this machine's
        gloo_devices("203.0.113.7", master=True)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert len(gloo_devices("203.0.113.7", master=True)) == 1  # the interface named, not the host
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,lo")
    assert len(gloo_devices("203.0.113.7", master=False)) == 2


def test_a_store_port_another_process_holds_is_one_line_naming_it():
    """Under torchrun the run's store takes MASTER_PORT + 1: a second run on the node started one
    port above the first (29500, 29501) found it taken, and stopped with torch's traceback."""
    import socket

    from scalerl.messages import RunError
    from scalerl.rollout.pool import _host_store
    from scalerl.transport import TransportSpec

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(RunError) as e:
            _host_store(TransportSpec("gloo", "127.0.0.1", port, 2, timeout_s=5))
    message = str(e.value)
    assert f"could not listen on 127.0.0.1:{port} (address already in use)" in message, message
    assert "placement.port" in message and "\n" not in message
