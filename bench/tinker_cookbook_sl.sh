#!/usr/bin/env bash
# tinker-cookbook's sl_loop.py, unchanged, against `grpoflow serve tinker` on the tiny built-in model: the
# supervised recipe's loss per step (docs/tinker.md). Same setup as bench/tinker_cookbook.sh; the recipe's
# `HuggingFaceH4/no_robots` download is a local folder of one-digit additions answered as \boxed{<sum>}.
#
#   bash bench/tinker_cookbook_sl.sh [STEPS]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
STEPS="${1:-60}"
OUT="${OUT:-/tmp/grpoflow-tinker-cookbook-sl}"
PY="${PY:-$REPO/.venv/bin/python}"
NAME=meta-llama/Llama-3.2-1B
export OMP_NUM_THREADS="${THREADS:-1}" MKL_NUM_THREADS="${THREADS:-1}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false PYTHONPATH="$REPO" TINKER_API_KEY=tml-local
rm -rf "$OUT" && mkdir -p "$OUT"
"$PY" -c "from grpoflow.models.tiny import save_tiny_model; save_tiny_model('$OUT/tiny-4m', size='4m', seed=0)"
"$PY" "$REPO/bench/tinker_workdir.py" "$OUT" --model "$OUT/tiny-4m" --name "$NAME"
cd "$OUT"
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$PY" -m grpoflow.cli serve tinker model.path="$OUT/tiny-4m" tinker.port="$PORT" tinker.root="$OUT/server" \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/api/v1/healthz" > /dev/null && break; sleep 1; done
"$PY" -m tinker_cookbook.recipes.sl_loop base_url="http://127.0.0.1:$PORT" model_name="$NAME" batch_size=32 \
  learning_rate=2e-3 lora_rank=32 max_steps="$STEPS" save_every=0 log_path="$OUT/cookbook" > "$OUT/cookbook.log" 2>&1
"$PY" - "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/cookbook/metrics.jsonl")]
nll = [round(r["train_mean_nll"], 3) for r in rows if "train_mean_nll" in r]
print(json.dumps({"train_mean_nll": nll, "step_s": [round(r["time_total"], 2) for r in rows if "time_total" in r]}))
PYEOF
