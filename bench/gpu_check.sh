#!/usr/bin/env bash
# GPU check of the vLLM rollout engine: one CUDA GPU (sized for one H200), about 8 minutes.
#
#   bash bench/gpu_check.sh            # results in $OUT (default /tmp/grpoflow-gpu-check)
#
# 1. Python: $PYTHON if it already imports vllm; else a venv ($GPU_CHECK_VENV) with $VLLM_SPEC
#    from PyPI (a CUDA build that brings its own torch) and grpoflow (editable, no torch change).
#    Building it needs a package registry; a machine without one must have vllm installed.
# 2. The CUDA test tier (tests/gpu: sampling log-probs, colocated weight sync, a short run on CUDA,
#    FSDP2 over NCCL with two GPUs) and the vLLM engine tests (tests/vllm_engine), ~2 minutes.
# 3. Two short colocated GRPO jobs on the built-in addition task with rollout.engine=vllm and
#    truncated importance sampling on (so the engine/trainer mismatch is logged):
#      fp32 : the built-in 30M Llama (built locally, warm-started 350 steps), fp32 everywhere:
#             mismatch should be ~1e-6 (numerics only, as on CPU);
#      bf16 : the same warm-started model, actor bf16 compute, vLLM in bf16: the realistic case.
# 4. Prints per job: median step time, generation tokens/s, sync time, mismatch/k3_kl and
#    mismatch/abs_log_ratio, reward first -> last; the logs and metrics.jsonl stay in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/grpoflow-gpu-check}"
VENV="${GPU_CHECK_VENV:-/tmp/grpoflow-venv-vllm-cuda}"
VLLM_SPEC="${VLLM_SPEC:-vllm==0.32.0}"
STEPS="${STEPS:-20}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
t0=$(date +%s)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed)"; exit 1; }

PY="${PYTHON:-python3}"
if ! "$PY" -c "import vllm" 2>/dev/null; then
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "gpu_check: building $VENV with $VLLM_SPEC (needs a package registry)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    timeout 600 "$VENV/bin/pip" install -q "$VLLM_SPEC" || {
      echo "gpu_check: could not install $VLLM_SPEC; on a machine without a registry, install vllm first and" \
           "run with PYTHON=/path/to/python"; exit 1; }
  fi
  PY="$VENV/bin/python"
fi
# grpoflow next to vLLM's torch and transformers, moving neither
"$PY" -m pip freeze | grep -iE '^(torch|transformers|tokenizers)==' > "$OUT/constraints.txt" || true
timeout 300 "$PY" -m pip install -q -c "$OUT/constraints.txt" -e . || {
  echo "gpu_check: pip install -e . failed"; exit 1; }
"$PY" -c "import torch, vllm, transformers; assert torch.cuda.is_available(), 'torch sees no GPU'; \
print(f'python ok: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, \
{torch.cuda.get_device_name()}')"
t1=$(date +%s)

"$PY" -m pip install -q pytest 2>/dev/null || true
timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/gpu tests/vllm_engine 2>&1 | tee "$OUT/tests.log" | tail -15 || {
  echo "gpu_check: the GPU test tier failed (see $OUT/tests.log)"; exit 1; }

# common settings: 32 prompts x 8 samples, 32 new tokens, vLLM takes 30% of the GPU next to the actor
COMMON=(rollout.engine=vllm placement=colocated backend=local rollout.gpu_memory_utilization=0.3
        data.prompts_per_step=32 rollout.n=8 rollout.max_new_tokens=32 actor.rollout_is=token
        trainer.total_steps="$STEPS" trainer.val_every=0 trainer.save_every=0 trainer.log_every=5
        'trainer.loggers=[console,jsonl]')

run_job() {  # name, then overrides
  local name=$1; shift
  echo "gpu_check: job $name"
  local start; start=$(date +%s)
  timeout 300 "$PY" -m grpoflow.cli train "${COMMON[@]}" trainer.output_dir="$OUT/$name" "$@" \
    > "$OUT/$name.log" 2>&1 || { echo "gpu_check: job $name failed, end of $OUT/$name.log:"; tail -40 "$OUT/$name.log"; exit 1; }
  echo "gpu_check: job $name took $(( $(date +%s) - start )) s"
}

run_job fp32 model.path=builtin:tiny-30m
run_job bf16 model.path="$OUT/fp32/sft_model" sft.steps=0 model.compute_dtype=bfloat16

"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
print("\njob   s/step  gen s  gen tok/s  sync s  mismatch/k3_kl  |old-rollout|  reward first->last")
for name in ("fp32", "bf16"):
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    steady = rows[2:] or rows  # the first steps include warm-up

    def med(key):
        values = [r[key] for r in steady if key in r]
        return statistics.median(values) if values else float("nan")

    def find(suffix):
        return next((k for k in rows[-1] if k.endswith(suffix)), None)

    samples = 32 * 8
    gen_tok_s = samples * med("response_length/mean") / med("timing_s/gen")
    k3, alr, score = find("mismatch/k3_kl"), find("mismatch/abs_log_ratio"), find("score/mean")
    first = statistics.mean(r[score] for r in rows[:3]) if score else float("nan")
    last = statistics.mean(r[score] for r in rows[-3:]) if score else float("nan")
    print(f"{name:5} {med('timing_s/step'):7.3f} {med('timing_s/gen'):6.3f} {gen_tok_s:10.0f} "
          f"{med('timing_s/sync'):7.3f} {med(k3) if k3 else float('nan'):15.2e} "
          f"{med(alr) if alr else float('nan'):13.2e}  {first:.3f} -> {last:.3f}")
EOF
t2=$(date +%s)
echo "gpu_check: done in $((t2 - t0)) s (python $((t1 - t0)) s, jobs $((t2 - t1)) s); logs and metrics in $OUT"
