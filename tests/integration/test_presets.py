"""The presets: each resolves to its paper's settings (and an override still wins); smoke runs: each preset runs
end to end on the built-in task (tiny model, a few steps) with no NaN anywhere."""

import pytest

from grpoflow.algorithms import ADVANTAGE_ESTIMATORS, required_inputs
from grpoflow.config import ConfigError, load_config, preset_names
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=30", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=3", "trainer.val_every=3", "data.val_max_prompts=8",
        "trainer.log_every=1"]


# What each preset is, from its paper (the comment at the top of recipes/<preset>.yaml): checked on the resolved
# config, so a key the recipe leaves to a default that changes, or a nested key that loses its siblings, fails.
PAPER = {
    "grpo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std": True, "actor.policy_loss": "ppo",
             "actor.clip_ratio_low": 0.2, "actor.clip_ratio_high": 0.2, "actor.loss_agg_mode": "seq-mean-token-mean",
             "actor.kl_coef": 0.04, "actor.kl_estimator": "k3", "algorithm.use_kl_in_reward": False},
    "dr_grpo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std": False, "actor.policy_loss": "ppo",
                "actor.loss_agg_mode": "seq-mean-token-sum-norm", "actor.kl_coef": 0.0,
                "algorithm.use_kl_in_reward": False},
    "dapo": {"algorithm.adv_estimator": "grpo", "actor.clip_ratio_low": 0.2, "actor.clip_ratio_high": 0.28,
             "algorithm.filter_groups.enable": True, "algorithm.filter_groups.max_draws": 4,
             "actor.loss_agg_mode": "token-mean", "reward.overlong_buffer_len": 2,
             "reward.overlong_penalty_factor": 1.0, "actor.kl_coef": 0.0, "algorithm.use_kl_in_reward": False},
    "gspo": {"algorithm.adv_estimator": "grpo", "actor.policy_loss": "gspo", "actor.clip_ratio_low": 3e-4,
             "actor.clip_ratio_high": 4e-4, "actor.loss_agg_mode": "seq-mean-token-mean", "actor.minibatches": 4,
             "actor.kl_coef": 0.0},
    "rloo": {"algorithm.adv_estimator": "rloo", "algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "k1",
             "algorithm.kl_ctrl.type": "fixed", "algorithm.kl_ctrl.kl_coef": 0.001, "actor.kl_coef": 0.0,
             "actor.loss_agg_mode": "token-mean"},
    "ppo": {"algorithm.adv_estimator": "gae", "algorithm.gamma": 1.0, "algorithm.lam": 1.0,
            "algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "k1", "algorithm.kl_ctrl.type": "adaptive",
            "algorithm.kl_ctrl.kl_coef": 0.001, "algorithm.kl_ctrl.target_kl": 0.1, "algorithm.kl_ctrl.horizon": 10000,
            "critic.cliprange_value": 0.5, "critic.warmup_steps": 5, "actor.kl_coef": 0.0},
}


def resolved(cfg, key):
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def test_all_presets_are_listed():
    assert set(preset_names()) >= set(PAPER)


@pytest.mark.parametrize("preset", sorted(PAPER))
def test_preset_resolves_to_its_papers_settings(preset):
    cfg = load_config(preset)
    assert {k: resolved(cfg, k) for k in PAPER[preset]} == PAPER[preset]
    # only PPO's estimator asks for values, so only PPO builds a critic
    assert ("values" in required_inputs(ADVANTAGE_ESTIMATORS.resolve(cfg.algorithm.adv_estimator))) == (preset == "ppo")
    # an override wins over the preset and leaves the rest of it as it was
    changed = load_config(preset, ["actor.clip_ratio_high=0.5", "algorithm.kl_ctrl.kl_coef=0.25"])
    assert (changed.actor.clip_ratio_high, changed.algorithm.kl_ctrl.kl_coef) == (0.5, 0.25)
    assert {k: resolved(changed, k) for k in PAPER[preset] if not k.endswith(("clip_ratio_high", "kl_ctrl.kl_coef"))} \
        == {k: v for k, v in PAPER[preset].items() if not k.endswith(("clip_ratio_high", "kl_ctrl.kl_coef"))}


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "ppo"])
def test_smoke_preset_runs_end_to_end(tmp_path, preset):
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
    (["algorithm.adv_estimator=remax", "algorithm.filter_groups.enable=true"], "Disable one of them"),
])
def test_nonsense_combinations_are_rejected_at_start(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(load_config(None, [f"trainer.output_dir={tmp_path}", *TINY, *overrides]))
    assert not (tmp_path / "base_model").exists()   # rejected before any model was built
