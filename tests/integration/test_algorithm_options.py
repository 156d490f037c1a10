"""Smoke runs: each estimator, loss and option of the family runs end to end through the real controller (two
steps, every metric finite); the engine's and trainer's distributions agree on policy; user plugins load by name.

What each option changes is asserted in test_option_wiring.py, against hand values."""

import pytest

from grpoflow.cli import main
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=30", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=2", "trainer.val_every=0", "trainer.log_every=1"]


@pytest.mark.parametrize("overrides, expect", [
    (["algorithm.adv_estimator=remax"], "timing_s/gen_baseline"),
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true"], "kl_in_reward/kl_mean"),
    (["algorithm.adv_estimator=reinforce_plus_plus_baseline"], "actor/pg_loss"),
    (["algorithm.adv_estimator=grpo_passk"], "actor/pg_loss"),
    (["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"],
     "kl_in_reward/coef"),
    (["actor.policy_loss=cispo", "actor.minibatches=2"], "actor/pg_clipfrac"),
    (["actor.policy_loss=reinforce"], "actor/pg_loss"),
    (["actor.rollout_is=token"], "actor/rollout_is/mean"),
    (["actor.rollout_is=sequence", "actor.minibatches=2"], "mismatch/k3_kl"),
    (["actor.mask_truncated=true", "rollout.max_new_tokens=2"], "response_length/clip_ratio"),
    (["actor.entropy_coeff=0.01", "actor.kl_coef=0.1", "actor.kl_estimator=k3+"], "actor/kl_loss"),
    (["actor.loss_agg_mode=seq-mean-token-sum"], "actor/pg_loss"),
])
def test_smoke_option_runs_end_to_end(tmp_path, overrides, expect):
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *TINY, *overrides]))
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and expect in rows[-1]
    assert all(v is not None for r in rows for v in r.values())


def test_rollout_is_weights_are_one_on_policy(tmp_path):
    # HF engine and trainer compute the same distribution: weights ~1 and no mismatch
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *TINY, "actor.rollout_is=token"]))
    row = read_metrics(tmp_path)[0]
    assert row["actor/rollout_is/mean"] == pytest.approx(1.0, abs=1e-3)
    assert row["mismatch/k3_kl"] == pytest.approx(0.0, abs=1e-5)


MISMATCH = ["mismatch/abs_log_ratio_mean", "mismatch/abs_log_ratio_max", "mismatch/k3_kl", "mismatch/ratio_mean",
            "mismatch/outside_clip_frac"]


def test_the_mismatch_is_logged_on_every_step_without_importance_sampling(tmp_path):
    # actor.rollout_is resolves to off here (sync, on-policy): the engine's log-probs are still compared with the
    # trainer's on every step. HF engine and trainer in float32 on a CPU: ~1e-7, none outside the clip band.
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", *TINY])
    assert cfg.actor.rollout_is == "off"
    train(cfg)
    rows = read_metrics(tmp_path)
    assert all(k in r for r in rows for k in MISMATCH), [sorted(r) for r in rows]
    for r in rows:
        assert 0 <= r["mismatch/abs_log_ratio_mean"] <= r["mismatch/abs_log_ratio_max"] < 1e-4, r
        assert r["mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-4) and r["mismatch/outside_clip_frac"] == 0


def test_user_estimator_and_loss_from_a_file_via_cli(tmp_path):
    plugin = tmp_path / "my_algos.py"
    plugin.write_text(
        "import torch\n"
        "from grpoflow.algorithms import register_advantage, register_policy_loss\n\n"
        "@register_advantage('centered')\n"
        "def centered(scores, response_mask):\n"
        "    return (scores - scores.mean())[:, None] * response_mask\n\n"
        "@register_policy_loss('plain_pg')\n"
        "def plain_pg(log_probs, advantages, response_mask):\n"
        "    return -advantages * log_probs * response_mask, {'my_metric': response_mask.detach()}\n")
    code = main(["train", f"trainer.output_dir={tmp_path / 'run'}", *TINY,
                 f"algorithm.adv_estimator={plugin}:centered", f"actor.policy_loss={plugin}:plain_pg"])
    assert code == 0
    assert read_metrics(tmp_path / "run")[-1]["actor/my_metric"] == pytest.approx(1.0)


def test_top_p_with_importance_sampling_scores_tokens_under_the_nucleus_they_came_from(tmp_path):
    # rollout.top_p=0.9: the engine records each token's nucleus floor, the trainer renormalises over the same
    # tokens, so the ratio stays 1 (scored under the full distribution it would be the kept mass, < 1: TRL #7269)
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *TINY, "rollout.top_p=0.9", "actor.rollout_is=token",
                             "actor.minibatches=2"]))
    rows = read_metrics(tmp_path)
    for r in rows:
        assert r["mismatch/abs_log_ratio_mean"] < 1e-5 and r["mismatch/outside_clip_frac"] == 0, r
        assert r["mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert r["actor/rollout_is/mean"] == pytest.approx(1.0, abs=1e-5)
