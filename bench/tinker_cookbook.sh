#!/usr/bin/env bash
# tinker-cookbook's rl_loop.py, unchanged, against `grpoflow serve tinker`; then `grpoflow train` on the same
# prompts with the same settings: reward per step and seconds per RL step of each (docs/tinker.md).
#
#   flock /tmp/grpoflow-heavy.lock bash bench/tinker_cookbook.sh [MODEL_DIR] [STEPS]
#
# Needs tinker-cookbook 0.6.1 and what its recipes import in .venv, as .ci/real_model_stage installs them (the
# cookbook with --no-deps: its tml-renderers dependency, used only by Thinking Machines' own models, has no release
# on PyPI that satisfies it; the rest with their dependencies: blobfile without lxml fails to import). The recipe's hub downloads have local
# equivalents written by bench/tinker_workdir.py: a one-digit-addition `openai/gsm8k` folder and the model folder
# linked under the hub name `meta-llama/Llama-3.2-1B` (the cookbook's renderer table knows hub names only).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
MODEL="${1:-/tmp/grpoflow-smollm2/hf}"
STEPS="${2:-15}"
OUT="${OUT:-/tmp/grpoflow-tinker-cookbook}"
PY="${PY:-$REPO/.venv/bin/python}"
NAME=meta-llama/Llama-3.2-1B
BATCH="${BATCH:-8}" GROUP="${GROUP:-8}" TOKENS="${TOKENS:-24}" LR="${LR:-5e-4}" RANK="${RANK:-32}"
export OMP_NUM_THREADS="${THREADS:-2}" MKL_NUM_THREADS="${THREADS:-2}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false PYTHONPATH="$REPO" TINKER_API_KEY=tml-local
rm -rf "$OUT" && mkdir -p "$OUT"
"$PY" "$REPO/bench/tinker_workdir.py" "$OUT" --model "$MODEL" --name "$NAME" --prompts 4096
cd "$OUT"

PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$PY" -m grpoflow.cli serve tinker model.path="$MODEL" tinker.port="$PORT" tinker.root="$OUT/server" \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/api/v1/healthz" > /dev/null && break; sleep 1; done
t0=$(date +%s)
"$PY" -m tinker_cookbook.recipes.rl_loop base_url="http://127.0.0.1:$PORT" model_name="$NAME" \
  batch_size="$BATCH" group_size="$GROUP" max_tokens="$TOKENS" learning_rate="$LR" lora_rank="$RANK" \
  loss_fn=importance_sampling max_steps="$STEPS" save_every=0 log_path="$OUT/cookbook" > "$OUT/cookbook.log" 2>&1
t1=$(date +%s)
kill $SERVER; wait $SERVER 2>/dev/null || true

"$PY" -m grpoflow.cli train model.path="$MODEL" model.lora.rank="$RANK" actor.lr="$LR" \
  data.train_files="[$OUT/prompts.jsonl]" data.prompts_per_step="$BATCH" rollout.n="$GROUP" \
  rollout.max_new_tokens="$TOKENS" reward.function=math trainer.total_steps="$STEPS" trainer.val_every=0 \
  trainer.save_every=0 trainer.log_every=1 trainer.resume=never trainer.output_dir="$OUT/grpoflow_train" \
  > "$OUT/grpoflow_train.log" 2>&1
t2=$(date +%s)

"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
cook = [json.loads(l) for l in open(out / "cookbook" / "metrics.jsonl")]
train = [json.loads(l) for l in open(out / "grpoflow_train" / "metrics.jsonl")]
summary = {
    "cookbook_reward": [round(m["reward/total"], 3) for m in cook],
    "cookbook_step_s": [round(m["time/total"], 2) for m in cook],
    "grpoflow_reward": [round(m.get("critic/score/mean", float("nan")), 3) for m in train],
    "grpoflow_step_s": [round(m["timing_s/step"], 2) for m in train],
}
for key in ("cookbook_step_s", "grpoflow_step_s"):
    steps = summary[key][1:]  # the first step of each includes start-up work
    summary[key.replace("_s", "_mean_s_after_first")] = round(sum(steps) / max(len(steps), 1), 2)
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
EOF
echo "wall: cookbook+server $((t1 - t0)) s, grpoflow train $((t2 - t1)) s"
