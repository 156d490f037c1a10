"""The actor's objective (workers/actor.py `actor_loss`) against hand-computed values."""

import math

import torch

from grpoflow.algorithms import POLICY_LOSSES
from grpoflow.workers.actor import actor_loss

# Two responses, the second one token long; the micro-batch holds 3 of the mini-batch's 6 tokens.
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
LOG_PROBS = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
ADV = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
ENTROPY = torch.tensor([[0.3, 0.5], [0.7, 9.0]])           # 9.0 sits on padding
REF = torch.tensor([[-1.5, -1.0], [-0.5, 0.0]])            # k1 = lp - ref = 0.5, -1.0 | 0
# old - rollout = 0, ln 4 | ln 0.5: truncated IS weights min(exp(.), 2) = 1, 2 (capped) | 0.5
ROLLOUT = LOG_PROBS - torch.tensor([[0.0, math.log(4.0)], [math.log(0.5), 0.0]])


def loss(**overrides):
    args = dict(log_probs=LOG_PROBS.clone().requires_grad_(True), entropy=ENTROPY, old_log_probs=LOG_PROBS,
                advantages=ADV, ref_log_probs=REF, rollout_log_probs=ROLLOUT, response_mask=MASK, num_tokens=6.0,
                num_seqs=4.0, horizon=2, loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2,
                clip_ratio_c=3.0, rollout_is="token", rollout_is_cap=2.0, entropy_coeff=0.1, kl_coef=0.2,
                kl_estimator="k1")
    args.update(overrides)
    return actor_loss(POLICY_LOSSES.get("reinforce"), **args), args["log_probs"]


def test_every_term_by_hand():
    # pg = -A * lp = 1, 2 | -1 ; weighted by IS: 1, 4 | -0.5 -> sum 4.5 / 6 global tokens = 0.75
    # entropy term: 0.1 * (0.3 + 0.5 + 0.7) / 6 = 0.025 ; KL term: 0.2 * (0.5 - 1.0 + 0) / 6 = -1/60
    (value, metrics), _ = loss()
    torch.testing.assert_close(value, torch.tensor(0.75 - 0.025 - 1 / 60))
    torch.testing.assert_close(metrics["actor/pg_loss"], torch.tensor(0.75))
    torch.testing.assert_close(metrics["actor/entropy"], torch.tensor(0.25))
    torch.testing.assert_close(metrics["actor/kl_loss"], torch.tensor(-1 / 12))
    # the IS weight's token mean in this micro-batch (1 + 2 + 0.5) / 3, as its share (3 of 6 tokens)
    torch.testing.assert_close(metrics["actor/rollout_is/mean"], torch.tensor(7 / 12))


def test_without_importance_sampling_entropy_or_kl():
    # pg sum 1 + 2 - 1 = 2 over 6 tokens; nothing else
    (value, metrics), _ = loss(rollout_is="off", entropy_coeff=0.0, kl_coef=0.0)
    torch.testing.assert_close(value, torch.tensor(2 / 6))
    assert "actor/kl_loss" not in metrics and not any(k.startswith("actor/rollout_is") for k in metrics)


def test_the_gradient_reaches_log_probs_through_each_term():
    # d/d lp of w * (-A * lp) / 6 + 0.2 * (lp - ref) / 6 (entropy is a fixed tensor here)
    (value, _), lp = loss()
    value.backward()
    expected = (-torch.tensor([[1.0, 2.0], [0.5, 0.0]]) * ADV + 0.2) / 6 * MASK
    torch.testing.assert_close(lp.grad, expected)


def test_on_policy_without_old_log_probs_uses_ratio_one():
    # No old log-probs (one optimizer step per RL step): PPO at ratio 1 is -A per token, value
    # -(1 + 1 - 2) / 6 = 0, with REINFORCE's gradient -A / 6 on each valid token.
    lp = LOG_PROBS.clone().requires_grad_(True)
    value = actor_loss(POLICY_LOSSES.get("ppo"), log_probs=lp, entropy=ENTROPY, old_log_probs=None, advantages=ADV,
                       ref_log_probs=None, rollout_log_probs=None, response_mask=MASK, num_tokens=6.0, num_seqs=4.0,
                       horizon=2, loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2,
                       clip_ratio_c=3.0, rollout_is="off", rollout_is_cap=2.0, entropy_coeff=0.0, kl_coef=0.0,
                       kl_estimator="k1")[0]
    torch.testing.assert_close(value, torch.tensor(0.0))
    value.backward()
    torch.testing.assert_close(lp.grad, -ADV * MASK / 6)
