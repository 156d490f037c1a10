"""bench/gpu_check.sh's small mode on the CPU: every stage of the GPU check runs, reports ok, and leaves only the
three small files in $OUT, so a Python or version error never costs scarce GPU minutes. The integration stage
(pytest on integration test files, which the suite runs anyway) is left out to save CI time. The figures the GPU run
is for are checked for shape: the decode stage's kernels and row counts with one host wait per step, the trainer's
sweep with its attention kernel, memory beside every stage, and the note where nvidia-smi is absent."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["preflight", "model", "decode", "trainer", "grpo_bf16", "grpo_fp32", "fsdp", "gpu_tests", "vllm"]


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
    # the decode stage: both kernels at both row counts, one host wait per step, the KV cache within its budget
    decode = figures["decode"]
    assert all(decode[f"{a}{rows}_ms"] > 0 for a in ("sdpa", "grouped") for rows in (4, 8)), decode
    assert decode["sdpa_waits"] == decode["grouped_waits"] == 1, decode
    assert 0 < decode["kv_peak"] <= decode["kv_budget"]
    # the trainer sweep: every length timed, the kernel that ran recorded
    trainer = figures["trainer"]
    assert trainer["tok_s@64"] > 0 and trainer["tok_s@128"] > 0 and trainer["loss_finite"]
    assert trainer["attn"] in ("sdpa", "grpoflow_grouped") and trainer["packed"] in (True, False)
    # memory truth beside every stage that ran in the check's own processes; no nvidia-smi here: said so
    assert all("rss_peak_gib" in figures[s] for s in STAGES if s != "gpu_tests")
    if shutil.which("nvidia-smi") is None:
        assert "nvidia-smi not found" in lines[0]
