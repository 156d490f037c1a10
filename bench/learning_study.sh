#!/usr/bin/env bash
# The learning study of issue 38 (docs/performance-log.md, "Four reasoning-gym tasks"): SmolLM2-135M-Instruct on the four
# tasks of rg_task.STUDY_TASKS x SEEDS, grpoflow's defaults and TRL, one piece per (task, seed, framework) so each
# fits in a quarter of an hour (grpoflow about 4 minutes, TRL about 11 on 2 cores), each alone on the machine (under
# the CPU lock file if LOCK names one). A piece already written is skipped, so the study resumes where it stopped and
# can be spread over several sittings; then --merge prints the table.
#   bench/learning_study.sh                 # all pieces not yet written, then the table
#   SEEDS="0" TASKS="rg_gcd" bench/learning_study.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-/tmp/grpoflow-smollm2/hf}
OUT=${OUT:-bench/results/learning_study}
SEEDS=${SEEDS:-0 1 2}
TASKS=${TASKS:-rg_gcd rg_letter_counting rg_lcm rg_number_sequence}
FRAMEWORKS=${FRAMEWORKS:-grpoflow trl}
LOCK=${LOCK:-}
mkdir -p "$OUT"
for seed in $SEEDS; do
  for task in $TASKS; do
    for fw in $FRAMEWORKS; do
      piece="$OUT/${task}_seed${seed}_${fw}.json"
      [ -s "$piece" ] && continue
      run=("$PY" bench/learning.py --task "$task" --model "$MODEL" --steps 10 --compute-dtype bfloat16
           --seeds "$seed" --frameworks "$fw" --out "$piece")
      if [ -n "$LOCK" ]; then run=(flock "$LOCK" "${run[@]}"); fi
      "${run[@]}" > "${piece%.json}.log" 2>&1 || { echo "$piece failed: see ${piece%.json}.log" >&2; exit 1; }
      echo "$(date +%T) $piece"
    done
  done
done
"$PY" bench/learning.py --merge "$OUT"/*.json
