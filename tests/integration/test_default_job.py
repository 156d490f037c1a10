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


@pytest.mark.slow
def test_default_job_on_two_ray_fsdp_ranks_learns_like_local(tmp_path, ray_cluster):
    """`grpoflow train backend=ray resources.devices_per_node=2`: the same job on two gloo/FSDP2 ranks
    (actor and rollout colocated) reaches the local job's accuracy within noise (local: +34 points)."""
    result = train(load_config(None, [f"trainer.output_dir={tmp_path}", "backend=ray",
                                      "resources.devices_per_node=2"]))
    before, after = result["before"]["val/mean@1"], result["after"]["val/mean@1"]
    assert after - before >= 0.25, (before, after)
