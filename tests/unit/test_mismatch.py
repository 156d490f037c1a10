"""`mismatch_metrics` (algorithms/mismatch.py) against hand-computed values, and the actor's loss logging it."""

import math

import pytest
import torch

from grpoflow.algorithms import POLICY_LOSSES, mismatch_metrics
from grpoflow.workers.actor import actor_loss


def test_every_metric_by_hand():
    # d = old - rollout per token: ln3, ln0.5, 0, ln1.1 | masked 5.0
    # |d| = 1.098612, 0.693147, 0, 0.095310 -> mean 1.887070 / 4 = 0.471767, max 1.098612
    # r = exp(d) = 3, 0.5, 1, 1.1 -> mean 5.6 / 4 = 1.4
    # k3 = r - 1 - d: 3 - 1 - 1.098612 = 0.901388; 0.5 - 1 + 0.693147 = 0.193147; 0; 1.1 - 1 - 0.095310 = 0.004690
    #   -> mean 1.099225 / 4 = 0.274806
    # outside [0.8, 1.28]: 3 and 0.5 (1.1 and 1 inside) -> 2 / 4
    rollout = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    old = rollout + torch.tensor([[math.log(3.0), math.log(0.5), 0.0], [math.log(1.1), 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    m = mismatch_metrics(old, rollout, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    torch.testing.assert_close(m["mismatch/abs_log_ratio_mean"], torch.tensor(0.471767))
    torch.testing.assert_close(m["mismatch/abs_log_ratio_max"], torch.tensor(1.098612))
    torch.testing.assert_close(m["mismatch/ratio_mean"], torch.tensor(1.4))
    torch.testing.assert_close(m["mismatch/k3_kl"], torch.tensor(0.274806))
    torch.testing.assert_close(m["mismatch/outside_clip_frac"], torch.tensor(0.5))
    assert all(not v.requires_grad and v.dim() == 0 and v.dtype == torch.float32 for v in m.values())


def test_equal_log_probs_have_no_mismatch_and_no_valid_token_gives_zeros():
    lp = torch.tensor([[-0.3, -2.0]], requires_grad=True)
    m = mismatch_metrics(lp, lp.detach(), torch.ones(1, 2))
    assert {k: float(v) for k, v in m.items()} == {
        "mismatch/abs_log_ratio_mean": 0.0, "mismatch/abs_log_ratio_max": 0.0, "mismatch/k3_kl": 0.0,
        "mismatch/ratio_mean": 1.0, "mismatch/outside_clip_frac": 0.0}
    empty = mismatch_metrics(lp, lp.detach() + 1.0, torch.zeros(1, 2))
    assert all(float(v) == 0.0 for v in empty.values())


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


@pytest.mark.parametrize("rollout_is", ["off", "token"])
def test_actor_loss_logs_the_mismatch_whatever_the_loss(rollout_is):
    # micro-batch of 3 valid tokens out of the mini-batch's 6; old - rollout = 0, ln4 | ln0.5
    # |d| mean (0 + 1.386294 + 0.693147) / 3 = 0.693147 -> share 3/6: 0.346574; max 1.386294 (not a share)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    rollout = old - torch.tensor([[0.0, math.log(4.0)], [math.log(0.5), 0.0]])
    _, metrics = actor_loss(
        POLICY_LOSSES.get("ppo"), log_probs=old.clone().requires_grad_(True), entropy=torch.zeros(2, 2),
        old_log_probs=None, advantages=torch.ones(2, 2), ref_log_probs=None, rollout_log_probs=rollout,
        response_mask=mask, num_tokens=6.0, num_seqs=4.0, horizon=2, loss_agg_mode="token-mean",
        clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, rollout_is=rollout_is, rollout_is_cap=2.0,
        entropy_coeff=0.0, kl_coef=0.0, kl_estimator="k1")
    torch.testing.assert_close(metrics["mismatch/abs_log_ratio_mean"], torch.tensor(0.346574))
    torch.testing.assert_close(metrics["mismatch/abs_log_ratio_max"], torch.tensor(1.386294))


def test_actor_loss_with_no_valid_token_logs_zeros_not_nan():
    # actor.mask_truncated with every sample cut: no token counts in the mini-batch (num_tokens 0)
    lp = torch.tensor([[-1.0, -2.0]])
    _, metrics = actor_loss(
        POLICY_LOSSES.get("ppo"), log_probs=lp.clone().requires_grad_(True), entropy=torch.zeros(1, 2),
        old_log_probs=None, advantages=torch.ones(1, 2), ref_log_probs=None, rollout_log_probs=lp - 0.5,
        response_mask=torch.zeros(1, 2), num_tokens=0.0, num_seqs=1.0, horizon=2, loss_agg_mode="token-mean",
        clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, rollout_is="off", rollout_is_cap=2.0,
        entropy_coeff=0.0, kl_coef=0.0, kl_estimator="k1")
    assert all(float(v) == 0.0 for k, v in metrics.items() if k.startswith("mismatch/")), metrics
