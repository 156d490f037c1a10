#!/usr/bin/env bash
# On-policy distillation vs GRPO on the built-in task, from the same short warm start (docs/algorithms/opd.md).
#   teacher: the tiny 4M model warm-started long (TEACHER_SFT supervised steps)
#   student: the same model warm-started short (STUDENT_SFT steps); both share the character tokenizer
# Then STEPS RL steps each of: GRPO (task reward only), OPD mixed (task advantage + reverse KL), OPD pure
# (reverse KL only, task_weight=0). Held-out greedy accuracy every 10 steps goes to each run's metrics.jsonl;
# bench/runs_table.py prints the table of the doc. RUNS picks the RL runs (default: grpo opd opd_pure). Run it on an otherwise idle machine.
set -euo pipefail
OUT=${OUT:-runs/opd}
read -r -a G <<< "${GRPOFLOW:-.venv/bin/grpoflow}"
STEPS=${STEPS:-100}
"${G[@]}" sft trainer.output_dir="$OUT/teacher" sft.steps="${TEACHER_SFT:-850}"
"${G[@]}" sft trainer.output_dir="$OUT/student" sft.steps="${STUDENT_SFT:-300}"
common=(grpoflow/recipes/builtin.yaml model.path="$OUT/student/sft_model" sft.steps=0 trainer.total_steps="$STEPS"
        trainer.val_every=10 trainer.save_every=0)
teacher=distill.teacher.path="$OUT/teacher/sft_model"
for run in ${RUNS:-grpo opd opd_pure}; do
  case $run in
    grpo) "${G[@]}" train "${common[@]}" trainer.output_dir="$OUT/grpo" ;;
    opd) "${G[@]}" train "${common[@]}" trainer.output_dir="$OUT/opd" "$teacher" ;;
    opd_pure) "${G[@]}" train "${common[@]}" trainer.output_dir="$OUT/opd_pure" "$teacher" distill.task_weight=0 ;;
  esac
done
"${G[@]}" eval grpoflow/recipes/builtin.yaml model.path="$OUT/teacher/sft_model" 2>&1 | tail -4
