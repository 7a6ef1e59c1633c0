"""The weight transport between the trainer and a generator process: every tensor arrives bit-exact,
every version in order, over a real gloo process group between two processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from scalerl.loop.transport import CollectiveReceiver, CollectiveTransport, Layout, SharedMemoryTransport


def make_model(seed: int, width: int = 24) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.Linear(width, 7)
    )
    model.register_buffer("steps", torch.zeros(3, dtype=torch.long))  # a second dtype, not a parameter
    return model


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def receiver(spec, width: int, versions: int, out) -> None:
    try:
        model = make_model(123, width)  # other initial weights: only the transport can change them
        rx = CollectiveReceiver(spec)
        current = -1
        while current < versions - 1:
            v = rx.poll(model, current)
            if v is not None:
                assert v == current + 1, f"version {v} after {current}"
                current = v
                # numpy copies travel by value; torch tensors would be shared through this process's
                # file descriptors, gone once it has exited
                out.put((v, {k: t.numpy().copy() for k, t in state_of(model).items()}))
        out.put(("done", None))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.put(("error", f"{type(e).__name__}: {e}"))


def test_layout_packs_one_buffer_per_dtype_and_unpacks_bit_exact():
    state = state_of(make_model(0))
    layout = Layout.of(state)
    buffers = layout.pack(state, "cpu")
    assert sorted(buffers) == ["float32", "int64"]
    assert Layout.from_json(layout.to_json()) == layout
    back = layout.unpack(buffers)
    assert all(torch.equal(back[k], v) for k, v in state.items())


@pytest.mark.slow  # starts a process
def test_gloo_transport_delivers_every_version_bit_exact_to_another_process():
    ctx = mp.get_context("spawn")
    trainer = make_model(0)
    sent = {0: state_of(trainer)}
    tx = CollectiveTransport(sent[0], 0, backend="gloo")
    out = ctx.Queue()
    proc = ctx.Process(target=receiver, args=(tx.spec, 24, 4, out))
    proc.start()
    tx.alive = proc.is_alive
    try:
        for version in (1, 2, 3):
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(torch.randn_like(p))
                trainer.steps += version
            sent[version] = state_of(trainer)
            tx.publish(sent[version], version)
        got = {}
        while True:
            kind, payload = out.get(timeout=120)
            if kind == "error":
                pytest.fail(payload)
            if kind == "done":
                break
            got[kind] = payload
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert sorted(got) == [0, 1, 2, 3]
    for v, state in got.items():
        for k, t in sent[v].items():
            assert torch.equal(torch.from_numpy(state[k]), t), f"{k} of version {v} differs"
    assert tx.seconds > 0


@pytest.mark.slow  # starts a process
def test_a_generator_with_another_model_gets_a_clear_error():
    ctx = mp.get_context("spawn")
    tx = CollectiveTransport(state_of(make_model(0)), 0, backend="gloo")
    out = ctx.Queue()
    proc = ctx.Process(target=receiver, args=(tx.spec, 16, 1, out))  # other shapes
    proc.start()
    try:
        kind, payload = out.get(timeout=120)
    finally:
        proc.join(timeout=30)
    assert kind == "error"
    assert "trainer and generator must build the same model" in payload
    assert "0.weight" in payload


def test_publish_stops_when_the_generator_process_is_gone():
    tx = CollectiveTransport(state_of(make_model(0)), 0, backend="gloo", alive=lambda: False)
    with pytest.raises(RuntimeError, match="generator process is gone"):
        tx.publish(state_of(make_model(1)), 1)


def test_shared_memory_transport_loads_the_newest_weights():
    trainer, gen = make_model(0), make_model(1)
    tx = SharedMemoryTransport(state_of(trainer), mp.get_context("spawn"), 0)
    assert tx.poll(gen, 0) is None
    new = state_of(make_model(2))
    tx.publish(new, 1)
    assert tx.poll(gen, 0) == 1
    assert all(torch.equal(gen.state_dict()[k], v) for k, v in new.items())
