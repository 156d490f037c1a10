#!/usr/bin/env bash
# The GPU check, for the one GPU machine the project can use: one H200, python3 with torch 2.11, transformers 5.17,
# peft, accelerate, triton and pytest; no vLLM, Ray or SGLang, no pip registry, no network; at most 64 MiB carried.
#
#   bash bench/gpu_check.sh             # on the GPU machine: at most 9 minutes, one table of at most 60 lines
#   bash bench/gpu_check.sh --small     # here, on a CPU: the same stages with tiny shapes, about a minute
#
# It installs nothing and carries nothing but this repository (run from PYTHONPATH). Every stage has its own
# timeout under one deadline and a failed stage does not stop the next; the stages, their figures and what
# they compare with are in bench/gpu_check.py. $OUT (default /tmp/grpoflow-gpu-check) receives three small
# files: table.txt (what is printed), summary.json (every figure) and logs.txt (the end of each stage's log).
# PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-/tmp/grpoflow-gpu-check}"
# 540 s in all: the driver keeps its stages within 525 s, the rest is for starting and writing the table
exec timeout -k 5 540 "${PYTHON:-python3}" bench/gpu_check.py --out "$OUT" --deadline-s 525 "$@"
