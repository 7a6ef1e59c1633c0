"""The weight-update group between the trainer and generator engines: every tensor arrives
bit-exact, every version in order, at every receiver, over a real gloo process group of three
processes; buckets are bounded; shared memory as the one-machine alternative."""

from __future__ import annotations

import multiprocessing as mp
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


def make_model(seed: int, width: int = 24) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.Linear(width, 7)
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
