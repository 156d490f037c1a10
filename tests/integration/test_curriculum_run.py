"""Curriculum sampling in whole runs: pool metrics are logged, and a run killed and resumed equals the uninterrupted
one (the sampler's pools, streaks and draw count are in the checkpoint)."""

import json

import pytest

from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager
from grpoflow.commands.run import train
from kills import comparable, kill_at_step, train_process


def args(out, data):
    return [f"trainer.output_dir={out}", "model.path=builtin:tiny-0.5m", "sft.steps=40", f"data.train_files=[{data}]",
            "data.val_files=[]", "data.prompts_per_step=3", "rollout.n=4", "rollout.max_new_tokens=4",
            "trainer.total_steps=6", "trainer.save_every=2", "trainer.keep_last=0", "trainer.val_every=0",
            "trainer.log_every=1", "data.curriculum.enable=true", "data.curriculum.shares=[0.34, 0.33, 0.33]",
            "data.curriculum.window=2", "data.curriculum.retire_after=2"]


@pytest.mark.slow  # two runs and a subprocess (11 s); the sampler's resume is also checked in tests/unit
def test_curriculum_run_logs_pools_and_resumes_exactly(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(1, 5) for b in range(10, 14)))
    train(load_config(None, args(tmp_path / "full", data)))
    full = comparable(tmp_path / "full")
    assert len(full) == 6 and all("curriculum/learnable" in r and "groups/zero_advantage_share" in r for r in full)
    pools = [[r[f"curriculum/{p}"] for p in ("easy", "learnable", "hard", "retired")] for r in full]
    assert all(sum(p) == 16 for p in pools) and any(p[0] + p[2] + p[3] > 0 for p in pools), pools
    out = tmp_path / "killed"
    proc = train_process(args(out, data))
    kill_at_step(proc, out, 3)
    assert CheckpointManager(out).latest() is not None
    train(load_config(None, args(out, data)))
    assert comparable(out) == full
