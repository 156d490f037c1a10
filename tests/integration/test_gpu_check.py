"""bench/gpu_check.sh's small mode on the CPU: every stage of the GPU check runs, reports ok, and leaves only the
three small files in $OUT, so a Python or version error never costs scarce GPU minutes. The integration stage
(pytest on integration test files, which the suite runs anyway) is left out to save CI time."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["preflight", "model", "trainer", "grpo_bf16", "grpo_fp32", "fsdp", "gpu_tests", "vllm"]


def test_the_gpu_check_runs_every_stage_in_its_small_mode(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--small", "--stages", ",".join(STAGES)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) <= 60 and lines[0].startswith("grpoflow gpu check (small mode)")
    status = {line.split()[0]: line.split()[1] for line in lines[2:] if line[:1].strip()}
    assert status == dict.fromkeys(STAGES, "ok")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["logs.txt", "summary.json", "table.txt"]
    figures = {r["stage"]: r["figures"] for r in json.loads((tmp_path / "out" / "summary.json").read_text())}
    assert figures["grpo_bf16"]["dtype"] == "bfloat16" and figures["grpo_fp32"]["dtype"] == "float32"
    assert figures["grpo_bf16"]["steps"] == 4 and figures["grpo_bf16"]["gen_tok_s"] > 0
    assert figures["grpo_fp32"]["abs_log_ratio"] < 1e-4           # fp32: engine and trainer agree to rounding
    assert figures["fsdp"]["float32_grad_rel_err"] < 1e-5
    assert figures["vllm"]["importable"] in (True, False)
