#!/usr/bin/env bash
# Curriculum sampling vs epoch sampling on the built-in task, from the same warm start (docs/data-and-rewards.md).
# 512 of the task's training prompts, so that each is drawn several times in STEPS steps (with all 5,000 a prompt
# is drawn about once in 100 steps of 32 and its pass rate is never known); held-out: the task's 500 prompts.
set -euo pipefail
OUT=${OUT:-runs/curriculum}
read -r -a G <<< "${GRPOFLOW:-.venv/bin/grpoflow}"
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-100}
START=${START:-runs/opd/student/sft_model}   # bench/opd.sh's short warm start (300 supervised steps)
mkdir -p "$OUT"
"$PY" -c "import json; from grpoflow.tasks.addition import addition_splits; rows = addition_splits()[0][:512]; \
open('$OUT/train512.jsonl', 'w').write(''.join(json.dumps(r) + '\n' for r in rows))"
common=(grpoflow/recipes/builtin.yaml model.path="$START" sft.steps=0 trainer.total_steps="$STEPS"
        data.train_files=["$OUT/train512.jsonl"] data.val_files=[builtin:addition/val] trainer.val_every=10
        trainer.save_every=0)
"${G[@]}" train "${common[@]}" trainer.output_dir="$OUT/epochs"
"${G[@]}" train "${common[@]}" trainer.output_dir="$OUT/curriculum" data.curriculum.enable=true
"$PY" bench/runs_table.py epochs="$OUT/epochs" curriculum="$OUT/curriculum"
