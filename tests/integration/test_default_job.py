"""The README's first command on two Ray FSDP2 ranks (slow), its first 30 GRPO steps. The command itself (`make
train`, local, 300 steps) runs in tests/integration/test_headline_runs.py against the range bench/headlines.yaml
quotes; that the ranks give the local step to 1e-5: tests/integration/test_ray_training.py."""

import pytest

from grpoflow.config import load_config
from grpoflow.commands.run import train


@pytest.mark.slow
def test_default_job_on_two_ray_fsdp_ranks_learns_like_local(tmp_path, ray_cluster):
    """`grpoflow train backend=ray resources.devices_per_node=2 trainer.total_steps=30`: the same job on two
    gloo/FSDP2 ranks (actor and rollout colocated) learns as the local job does. From the shipped warm start
    (36.4%), local, the first 50 of 300 steps gain 18-22 points over three seeds (docs/performance-log.md, "The warm
    start ships"), so 30 steps must gain 10; an untrained or broken job gains nothing."""
    result = train(load_config(None, [f"trainer.output_dir={tmp_path}", "backend=ray",
                                      "resources.devices_per_node=2", "trainer.total_steps=30"]))
    before, after = result["before"]["val/mean@1"], result["after"]["val/mean@1"]
    assert after - before >= 0.10, (before, after)
