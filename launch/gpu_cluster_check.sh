#!/usr/bin/env bash
# The weight-update group on one GPU (issue 56, item 6), in one command; no vLLM needed:
#   launch/gpu_cluster_check.sh               # on the GPU machine: NCCL beside a ZeRO-3 default group, 1.5B and 7B
#   launch/gpu_cluster_check.sh --device cpu  # the same parts on a CPU with gloo and small shapes (checks the script)
# Other flags go to benchmarks/bench_weight_group.py (--shapes, --bucket-mb). It checks: the NCCL weight
# group as a world of one formed beside DeepSpeed's default group (world 1), publish's extra memory on
# rank 0 at Qwen2.5-1.5B and -7B shapes (bf16 weights, no optimizer), the first ZeRO-3 gather bucketed vs
# whole, and a clean exit with both groups torn down.
# Wheels in .whl/ (DeepSpeed and what the GPU image lacks; `launch/gpu_check.sh --build-wheelhouse` builds
# them where there is a package index, ~22 MB) are installed first into /tmp/scalerl-site, with no index
# and no dependency resolution; without .whl/ the installed packages are used (torch and transformers
# come from the image). Writes weight_group.{json,md} and the log to ${OUT:-gpu-cluster-out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-cluster-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/scalerl-site .whl/*.whl > "$out/pip.log" 2>&1; then
        echo "gpu_cluster_check: installing .whl/*.whl failed:" >&2
        tail -20 "$out/pip.log" >&2
        exit 3
    fi
    export PYTHONPATH="/tmp/scalerl-site:$PWD/src"
else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
if ! "$py" -c "import deepspeed, torch" 2> "$out/import.log"; then
    echo "gpu_cluster_check: torch and deepspeed must import (.whl/ carries deepspeed):" >&2
    cat "$out/import.log" >&2
    exit 3
fi
# a clean exit is part of the check: the exit status is the script's, a crash at teardown shows here
"$py" benchmarks/bench_weight_group.py --out "$out" "$@" 2>&1 | tee "$out/bench.log"
rc=${PIPESTATUS[0]}
echo "gpu_cluster_check: exit status $rc" | tee -a "$out/bench.log"
if grep -q "terminate called" "$out/bench.log"; then
    echo "gpu_cluster_check: the process aborted as it exited" | tee -a "$out/bench.log"
    rc=4
fi
exit "$rc"
