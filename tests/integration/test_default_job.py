"""The README's first command: the built-in job raises held-out accuracy by >= 25 points (slow: ~2.5 min)."""

import pytest

from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.controller.run import train


@pytest.mark.slow
def test_default_job_raises_heldout_accuracy_by_25_points(tmp_path):
    result = train(load_config(None, [f"trainer.output_dir={tmp_path}"]))
    before, after = result["before"]["val/mean@1"], result["after"]["val/mean@1"]
    assert after - before >= 0.25, (before, after)
    rewards = [r["critic/score/mean"] for r in read_metrics(tmp_path) if "critic/score/mean" in r]
    assert sum(rewards[-30:]) / 30 > sum(rewards[:30]) / 30 + 0.1   # training reward rises too
