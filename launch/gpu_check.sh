#!/usr/bin/env bash
# What one GPU machine without vLLM can check of the GPU path (issues #29, #30), in one command:
#   launch/gpu_check.sh                 # on the GPU machine: about 5-6 min on one H100
#   launch/gpu_check.sh --cpu-smoke     # tiny versions of every part on a CPU (checks the script)
#   launch/gpu_check.sh --only memory   # some parts; other flags: python3 benchmarks/gpu_check.py --help
# Wheels in .whl/ (the packages the GPU image lacks: hydra, omegaconf, DeepSpeed, MLflow, ...) are
# installed first into /tmp/scalerl-site, with no index and no dependency resolution (the machine
# has no network); without .whl/ the installed packages are used. Writes the report, its JSON and
# the runs' log tails to ${OUT:-gpu-check-out}/ (see launch/README.md).
#   launch/gpu_check.sh --build-wheelhouse   # here, with a package index: (re)build .whl/ (~22 MB)
set -uo pipefail
cd "$(dirname "$0")/.."

# What a run needs that the GPU image lacks (its package list: torch 2.11, transformers 5.17, numpy,
# scipy, pandas, pyarrow, psutil, protobuf, anyio, ... are there), for CPython 3.12 on manylinux
# x86_64, dependencies named one by one (--no-deps). The MLflow client with a sqlite store imports
# fastapi, databricks-sdk, opentelemetry, sqlalchemy + alembic, and cryptography (the registry's
# tables); mlflow-skinny is the client without the UI. protobuf is carried so that its version is
# the one tested with opentelemetry-proto. antlr4 4.9.3 and DeepSpeed publish only sources: built
# here into py3-none-any wheels (DeepSpeed with no compiled op; scalerl uses torch's AdamW).
WHEELS=(
    hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4
    hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
    math-verify==0.9.0 latex2sympy2_extended==1.11.0
    mlflow-skinny==3.17.2 sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 cachetools==7.3.3
    sqlparse==0.6.1 importlib_metadata==9.1.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
    opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2 fastapi==0.136.3
    starlette==1.10.0 databricks-sdk==0.162.0 cryptography==48.0.0 cffi==2.0.0 pycparser==3.0
    protobuf==7.36.2
)
SDISTS=(antlr4-python3-runtime==4.9.3 deepspeed==0.19.8)
if [ "${1:-}" = "--build-wheelhouse" ]; then
    set -e
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
    python3 -m pip wheel -q --no-deps -w .whl "${SDISTS[@]}"  # pure Python: any interpreter builds them
    echo "built .whl: $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1)"
    exit 0
fi
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    t0=$SECONDS
    if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/scalerl-site .whl/*.whl > "$out/pip.log" 2>&1; then
        echo "gpu_check: installing .whl/*.whl failed:" >&2
        tail -20 "$out/pip.log" >&2
        exit 3
    fi
    echo "gpu_check: installed $(ls .whl/*.whl | wc -l) wheels from .whl/ in $((SECONDS - t0)) s"
    export PYTHONPATH="/tmp/scalerl-site:$PWD/src"
else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
exec "$py" benchmarks/gpu_check.py --out "$out" "$@"
