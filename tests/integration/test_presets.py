"""Every preset recipe runs end to end on the built-in task (tiny model, a few steps)."""

import pytest

from grpoflow.config import load_config, preset_names
from grpoflow.controller.metrics import read_metrics
from grpoflow.controller.run import train
from grpoflow.config import ConfigError

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=30", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=3", "trainer.val_every=3", "data.val_max_prompts=8",
        "trainer.log_every=1"]


def test_all_presets_are_listed():
    assert set(preset_names()) >= {"grpo", "dr_grpo", "dapo", "gspo", "rloo", "ppo"}


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "ppo"])
def test_preset_runs_end_to_end(tmp_path, preset):
    extra = ["critic.warmup_steps=1"] if preset == "ppo" else []
    train(load_config(preset, [f"trainer.output_dir={tmp_path}", *TINY, *extra]))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert all(v is not None for v in r.values()), r   # no NaN/inf anywhere
    expected = {"grpo": "actor/kl_loss", "rloo": "kl_in_reward/kl_mean", "ppo": "critic/vf_loss",
                "dapo": "filter_groups/draws", "gspo": "actor/pg_clipfrac", "dr_grpo": "actor/pg_loss"}[preset]
    assert expected in rows[-1]
    if preset == "ppo":   # critic warm-up: step 1 trains only the critic
        assert "actor/pg_loss" not in rows[1] and "actor/pg_loss" in rows[2]


@pytest.mark.parametrize("overrides, message", [
    (["actor.policy_loss=gspo", "actor.loss_agg_mode=token-mean"], "actor.loss_agg_mode=seq-mean-token-mean"),
    (["actor.rollout_is=token", "rollout.top_p=0.9"], "rollout.top_p=1"),
    (["algorithm.adv_estimator=remax", "algorithm.filter_groups.enable=true"], "Disable one of them"),
])
def test_nonsense_combinations_are_rejected_at_start(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(load_config(None, [f"trainer.output_dir={tmp_path}", *TINY, *overrides]))
    assert not (tmp_path / "base_model").exists()   # rejected before any model was built
