#!/usr/bin/env bash
# A stability screen (benchmarks/bench_stability.py) on many CPU cores at once, such as a lent GPU
# machine's host (the GPU is hidden: CUDA_VISIBLE_DEVICES=), cut after SCREEN_S seconds; then the
# report of whatever steps the runs reached. On a machine without a package index, the wheels of
# .whl/ are installed first as launch/gpu_check.sh does (NO_WHL=1 uses the installed packages).
#   OUT=$OUT SETTINGS="lr1e-4=,trainer.lr=1e-4 lr3e-4=,trainer.lr=3e-4" PAR=12 SCREEN_S=470 \
#       bash benchmarks/screen_device.sh
# Every setting gets COMMON's overrides first (budget BUDGET steps, NUM_TRAIN prompts, an evaluation
# every EVERY steps on 128 x 4 samples), then its own (each starts with a comma). Runs go to HORIZON x
# the budget on SEEDS, PAR at once with one thread a process. Writes $OUT/screen.json, bench.log and
# the runs' log tails.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/screen-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false CUDA_VISIBLE_DEVICES=
if [ -z "${NO_WHL:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/scalerl-site .whl/*.whl > "$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; exit 3; }
    export PYTHONPATH="/tmp/scalerl-site:$PWD/src"
fi
nproc
lscpu | grep -E "Model name|^CPU\(s\)"
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
COMMON="trainer.total_steps=${BUDGET:-120},task.num_train=${NUM_TRAIN:-2048},eval.every=${EVERY:-8}"
COMMON+=",task.num_val=128,eval.num_prompts=128,eval.samples_per_prompt=4"
SETS=()
for s in ${SETTINGS:?"SETTINGS: NAME=,override,... (space-separated)"}; do
    SETS+=(--setting "${s%%=*}=$COMMON${s#*=}")
done
runs=/tmp/screen
# the screen in a process group of its own, so that the cut reaches its runs and nothing else
# shellcheck disable=SC2086  # SEEDS is a list of numbers
setsid python3 benchmarks/bench_stability.py "${SETS[@]}" --seeds ${SEEDS:-0 1 2} \
    --horizon "${HORIZON:-2}" --parallel "${PAR:-12}" --out "$runs" > "$out/bench.log" 2>&1 &
group=$!
(sleep "${SCREEN_S:-450}" && kill -TERM -- "-$group" 2> /dev/null) &  # (a background job ignores SIGINT)
timer=$!
wait "$group"
echo "bench rc=$? at ${SECONDS}s; load $(cat /proc/loadavg)"
kill "$timer" 2> /dev/null
for _ in $(seq 60); do  # a cut run stops after its step, its points kept in the store
    pgrep -g "$group" > /dev/null || break
    sleep 1
done
kill -9 -- "-$group" 2> /dev/null
# shellcheck disable=SC2086
python3 benchmarks/bench_stability.py "${SETS[@]}" --seeds ${SEEDS:-0 1 2} --horizon "${HORIZON:-2}" \
    --out "$runs" --report-only --json "$out/screen.json" 2>&1 | tail -20
for f in "$runs"/*.log; do echo "== $f"; tail -3 "$f"; done > "$out/tails.txt" 2>&1
ls -la "$out"
