"""The GPU half of the vLLM-per-rank layout (tests/vllm_engine/test_vllm_ranks.py proves it on CPU): one vLLM engine
in each training rank's process, joined to the rank's NCCL world with `external_launcher`, asleep while the actor
trains (rollout.free_cache_engine: weights offloaded, KV cache freed) and woken with torch's cache emptied for each
weight sync. Skipped without CUDA, vLLM (0.32) or Ray: the lent GPU image has neither, so this has not run yet.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_vllm_engine_per_rank_sleeps_wakes_and_samples_at_parity(ranks, tiny_model_path, tmp_path):
    pytest.importorskip("vllm", reason="needs vLLM 0.32 (pip install 'grpoflow[vllm]')")
    pytest.importorskip("ray", reason="needs Ray (pip install 'grpoflow[ray]')")
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "grpoflow.cli", "train", f"model.path={tiny_model_path}", "sft.steps=0",
           "backend=ray", f"resources.devices_per_node={ranks}", "rollout.engine=vllm",
           "rollout.free_cache_engine=true", "rollout.gpu_memory_utilization=0.3", "model.compute_dtype=float32",
           "reward.function=length", "trainer.total_steps=3", "trainer.val_every=0", "trainer.save_every=0",
           "data.prompts_per_step=8", "rollout.n=4", "rollout.max_new_tokens=16", f"trainer.output_dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "timing_s/step" in r]
    assert len(steps) == 3
    assert max(r["mismatch/abs_log_ratio_max"] for r in steps) < 1e-3  # fp32 on both sides, after every sync
