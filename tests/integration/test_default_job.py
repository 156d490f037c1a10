"""The README's first command on two Ray FSDP2 ranks (slow). The command itself (`make train`, local) runs in
tests/integration/test_headline_runs.py against the range bench/headlines.yaml quotes."""

import pytest

from grpoflow.config import load_config
from grpoflow.commands.run import train


@pytest.mark.slow
def test_default_job_on_two_ray_fsdp_ranks_learns_like_local(tmp_path, ray_cluster):
    """`grpoflow train backend=ray resources.devices_per_node=2`: the same job on two gloo/FSDP2 ranks
    (actor and rollout colocated) learns as the local job does (its figures: bench/headlines.yaml, `builtin`)."""
    result = train(load_config(None, [f"trainer.output_dir={tmp_path}", "backend=ray",
                                      "resources.devices_per_node=2"]))
    before, after = result["before"]["val/mean@1"], result["after"]["val/mean@1"]
    assert after - before >= 0.20, (before, after)
