"""rollout.exact: the hf engine's and the trainer's log-probs are bitwise equal on a CPU, so the mismatch of every
step is exactly 0, in float32 and in bf16, with top-p sampling too (docs/numerics.md)."""

import pytest

from grpoflow.commands.run import train
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics

# the default job's warm start, 2 steps of 8 prompts x 4 samples in 2 mini-batches (an old-log-prob pass and an update
# on other micro-batches than the engine's decode batches)
RUN = ["data.prompts_per_step=8", "rollout.n=4", "actor.minibatches=2", "trainer.total_steps=2", "trainer.val_every=0",
       "trainer.save_every=0", "trainer.log_train_every=0", "trainer.threads=1", "rollout.exact=true"]


@pytest.mark.parametrize("extra", [["model.compute_dtype=float32", "rollout.top_p=0.9", "actor.rollout_is=token"],
                                   ["model.compute_dtype=bfloat16"]], ids=["float32-top_p", "bfloat16"])
def test_exact_mode_makes_the_mismatch_zero(tmp_path, extra):
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *RUN, *extra]))
    rows = read_metrics(tmp_path)
    assert len(rows) == 2
    for r in rows:
        assert r["mismatch/abs_log_ratio_mean"] == 0.0 and r["mismatch/abs_log_ratio_max"] == 0.0, r
        assert r["mismatch/ratio_mean"] == 1.0
