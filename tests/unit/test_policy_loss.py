import math

import pytest
import torch

from grpoflow.algorithms import ppo_clip_loss


def _inputs(ratios, advantages, mask=None):
    ratios = torch.tensor([ratios])
    old = torch.full_like(ratios, -1.0)
    log_probs = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([advantages])
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask])
    return log_probs, old, adv, mask


def test_ppo_loss_hand_computed():
    # clip range [0.8, 1.2], dual-clip c = 3
    # token  A   ratio  l1 = -A*r  l2 = -A*clip(r)   max(l1,l2)  dual min(.,-A*c)  loss
    #   0   +1   1.5    -1.5       -1.2              -1.2 (clip)  n/a (A>=0)        -1.2
    #   1   +1   0.5    -0.5       -0.8              -0.5         n/a               -0.5
    #   2   -1   0.5     0.5        0.8               0.8 (clip)  min(0.8, 3) = 0.8  0.8
    #   3   -1   5.0     5.0        1.2               5.0         min(5, 3) = 3      3.0 (dual)
    #   4   -2   1.1     2.2        2.2               2.2 (equal) min(2.2, 6)        2.2
    #   5   +2   4.0    -8.0       -2.4              -2.4 (clip)  n/a: no dual       -2.4
    #   6   -1   5.0   masked out                                                    0
    log_probs, old, adv, mask = _inputs(
        [1.5, 0.5, 0.5, 5.0, 1.1, 4.0, 5.0],
        [1.0, 1.0, -1.0, -1.0, -2.0, 2.0, -1.0],
        [1, 1, 1, 1, 1, 1, 0],
    )
    loss, metrics = ppo_clip_loss(log_probs, old, adv, mask, clip_ratio_c=3.0)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.5, 0.8, 3.0, 2.2, -2.4, 0.0]]))
    torch.testing.assert_close(metrics["pg_clipfrac"],
                               torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]]))
    torch.testing.assert_close(metrics["pg_clipfrac_lower"],
                               torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]))
    # ppo_kl = old - new = -log(ratio), zero on the masked token
    expected_kl = [-math.log(r) for r in (1.5, 0.5, 0.5, 5.0, 1.1, 4.0)] + [0.0]
    torch.testing.assert_close(metrics["ppo_kl"], torch.tensor([expected_kl]))
    for value in metrics.values():
        assert not value.requires_grad and value.dtype == torch.float32


def test_clip_low_and_high_are_asymmetric():
    # clip_low 0.2, clip_high 0.28 (DAPO clip-higher): range [0.8, 1.28]
    # A=+1, r=1.25: l1 = -1.25, l2 = -clip(1.25) = -1.25 -> -1.25, not clipped
    #               (with symmetric 0.2 it would be clipped to -1.2)
    # A=-1, r=0.75: l1 = 0.75,  l2 = clip(0.75) = 0.8  -> 0.8, clipped by the *low* bound
    # A=+1, r=1.5:  l1 = -1.5,  l2 = -1.28              -> -1.28, clipped by the high bound
    log_probs, old, adv, mask = _inputs([1.25, 0.75, 1.5], [1.0, -1.0, 1.0])
    loss, metrics = ppo_clip_loss(log_probs, old, adv, mask,
                                  clip_ratio_low=0.2, clip_ratio_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, 0.8, -1.28]]))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor([[0.0, 1.0, 1.0]]))

    symmetric, _ = ppo_clip_loss(log_probs, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    torch.testing.assert_close(symmetric, torch.tensor([[-1.2, 0.8, -1.2]]))

    # widening only the low side to 0.3 (range [0.7, 1.2]) unclips token 1: loss 0.75
    wide_low, _ = ppo_clip_loss(log_probs, old, adv, mask, clip_ratio_low=0.3, clip_ratio_high=0.2)
    torch.testing.assert_close(wide_low, torch.tensor([[-1.2, 0.75, -1.2]]))


def test_gradient_flows_through_log_probs_only():
    # token 0: A=+2, r=1.0 unclipped -> d(-A*r)/dlogp = -A*r = -2
    # token 1: A=+1, r=1.5 clipped   -> loss -1.2 is constant, grad 0
    # token 2: A=-1, r=5.0 dual clip -> loss 3 is constant, grad 0
    # token 3: A=-1, r=0.9 unclipped -> -A*r = 0.9
    # token 4: masked                -> grad 0
    log_probs, old, adv, mask = _inputs([1.0, 1.5, 5.0, 0.9, 1.0],
                                        [2.0, 1.0, -1.0, -1.0, 3.0], [1, 1, 1, 1, 0])
    old.requires_grad_(True)
    adv.requires_grad_(True)
    loss, metrics = ppo_clip_loss(log_probs, old, adv, mask)
    loss.sum().backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-2.0, 0.0, 0.0, 0.9, 0.0]]))
    assert old.grad is None
    assert adv.grad is None


def test_extreme_log_ratio_stays_finite():
    # log ratio 100 is clamped to 20 before exp: loss and gradient stay finite
    log_probs = torch.tensor([[99.0, -101.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])
    loss, metrics = ppo_clip_loss(log_probs, old, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(log_probs.grad).all()
    # A=-1, r=e^20: dual clip caps the loss at -A*c = 3
    assert loss[0, 0].item() == pytest.approx(3.0)


def test_masked_positions_are_zero_even_if_inputs_are_not_finite():
    log_probs = torch.tensor([[-1.0, float("nan")]])
    old = torch.tensor([[-1.0, float("nan")]])
    loss, metrics = ppo_clip_loss(log_probs, old, torch.tensor([[1.0, 1.0]]),
                                  torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(loss, torch.tensor([[-1.0, 0.0]]))
    assert metrics["ppo_kl"][0, 1] == 0.0


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_clip_ratio_c_must_exceed_one(c):
    log_probs, old, adv, mask = _inputs([1.0], [1.0])
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ppo_clip_loss(log_probs, old, adv, mask, clip_ratio_c=c)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="share one"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 1), torch.ones(2, 3))
