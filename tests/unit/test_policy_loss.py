import math

import pytest
import torch

from grpoflow.algorithms import (
    POLICY_LOSSES,
    aggregate_loss,
    cispo_loss,
    gspo_loss,
    ppo_clip_loss,
    reinforce_loss,
    truncated_is_weights,
)


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


# ---------------------------------------------------------------- GSPO


def test_gspo_hand_computed():
    # clip range [1 - 3e-4, 1 + 4e-4] = [0.9997, 1.0004]; s_i = exp(mean of valid log ratios)
    # row  log ratios        s_i                     A   l1 = -A*s   l2 = -A*clip(s)  loss
    #  0   ln1.5, ln1.5      1.5                    +1   -1.5        -1.0004          -1.0004 (clip)
    #  1   ln2, 0            exp(ln2/2) = 1.414214  -1    1.414214    1.0004           1.414214
    #  2   ln0.5 | pad (50)  0.5 (pad not counted)  -1    0.5         0.9997           0.9997 (clip)
    #  3   ln2, -ln2         1                      +2   -2          -2               -2
    # every valid token of a row carries the row's value; padding is 0
    log_ratio = torch.tensor([[math.log(1.5), math.log(1.5)], [math.log(2.0), 0.0],
                              [math.log(0.5), 50.0], [math.log(2.0), -math.log(2.0)]])
    old = torch.full_like(log_ratio, -1.0)
    log_probs = old + log_ratio
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0], [2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    loss, metrics = gspo_loss(log_probs, old, adv, mask)
    r2 = math.sqrt(2.0)
    torch.testing.assert_close(loss, torch.tensor([[-1.0004, -1.0004], [r2, r2],
                                                   [0.9997, 0.0], [-2.0, -2.0]]))
    torch.testing.assert_close(metrics["pg_clipfrac"],
                               torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(metrics["ppo_kl"], -log_ratio * mask)
    assert POLICY_LOSSES.get("gspo") is gspo_loss
    assert POLICY_LOSSES.meta("gspo") == {"agg_modes": ("seq-mean-token-mean",)}


def test_gspo_gradient_is_that_of_the_sequence_objective():
    # With seq-mean-token-mean and no active clip, the straight-through token ratio gives
    # sequence i the gradient of -A_i * s_i, s_i = exp(mean_t (logp_it - old_it)).
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=gen) * 3
    log_probs = (old + 0.1 * torch.randn(4, 6, generator=gen)).requires_grad_(True)
    lengths = torch.tensor([6, 3, 1, 5])
    mask = (torch.arange(6) < lengths[:, None]).float()
    adv_per_seq = torch.tensor([1.5, -0.5, 2.0, -1.0])
    adv = adv_per_seq[:, None].expand(4, 6)

    loss, metrics = gspo_loss(log_probs, old, adv, mask, clip_ratio_low=0.99, clip_ratio_high=100.0)
    assert metrics["pg_clipfrac"].sum() == 0  # the clip is inactive
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    grad = log_probs.grad.clone()

    log_probs.grad = None
    seq_ratio = torch.exp(((log_probs - old) * mask).sum(-1) / lengths)
    (-adv_per_seq * seq_ratio).mean().backward()
    torch.testing.assert_close(grad, log_probs.grad)
    assert torch.all(grad[mask == 0] == 0.0) and torch.all(grad[mask == 1] != 0.0)


def test_gspo_clipped_sequence_gets_no_gradient():
    # A = +1 and s = 1.5 > 1.0004: the clipped term is constant, so row 0 gets no gradient;
    # row 1 (s = 1, unclipped, A = 1, length 2) gets -A * s / 2 = -0.5 per token under
    # seq-mean-token-mean over 2 sequences -> -0.25
    old = torch.full((2, 2), -1.0)
    log_probs = (old + torch.tensor([[math.log(1.5)] * 2, [0.0, 0.0]])).requires_grad_(True)
    loss, _ = gspo_loss(log_probs, old, torch.ones(2, 2), torch.ones(2, 2))
    aggregate_loss(loss, torch.ones(2, 2), "seq-mean-token-mean").backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.0, 0.0], [-0.25, -0.25]]))


# ---------------------------------------------------------------- CISPO


def _at_log_prob(ratios, log_prob=-2.0):
    """log_probs all equal to `log_prob` (a leaf), old_log_probs set so that exp(new - old) = ratio."""
    ratios = torch.tensor([ratios])
    log_probs = torch.full_like(ratios, log_prob).requires_grad_(True)
    return log_probs, log_prob - ratios.log()


def test_cispo_hand_computed_and_gradient():
    # clip range [0.8, 1.28]; every log_prob = -2; loss = -clip(r) * A * (-2) = 2 * clip(r) * A
    # token  r    A   weight       loss              d loss / d logp = -weight * A
    #   0   1.5  +1   1.28 (clip)   2.56              -1.28   (PPO would give 0 here)
    #   1   0.5  -1   0.8  (clip)  -1.6                0.8
    #   2   1.1  +2   1.1           4.4               -2.2
    #   3   1.0  +1   masked        0                  0
    log_probs, old = _at_log_prob([1.5, 0.5, 1.1, 1.0])
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0]], requires_grad=True)
    old.requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = cispo_loss(log_probs, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[2.56, -1.6, 4.4, 0.0]]))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.28, 0.8, -2.2, 0.0]]))
    assert old.grad is None and adv.grad is None


def test_cispo_default_has_no_lower_bound():
    # defaults: low 1.0 (range [0, 1.28]), so r = 0.5 keeps its weight 0.5: loss = 2 * 0.5 * 1 = 1
    log_probs, old = _at_log_prob([0.5, 2.0])
    loss, metrics = cispo_loss(log_probs, old, torch.ones(1, 2), torch.ones(1, 2))
    # r = 2 is capped at 1.28: loss = 2 * 1.28 = 2.56
    torch.testing.assert_close(loss, torch.tensor([[1.0, 2.56]]))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor([[0.0, 1.0]]))


# ---------------------------------------------------------------- REINFORCE


def test_reinforce_hand_computed_and_gradient():
    # loss = -A * logp: -2 * -1 = 2; -(-1) * -2 = -2; masked -> 0; gradient -A = -2, 1, 0
    log_probs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 3.0]], requires_grad=True)
    loss, metrics = reinforce_loss(log_probs, old, adv, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(loss, torch.tensor([[2.0, -2.0, 0.0]]))
    assert set(metrics) == {"ppo_kl"}
    # ppo_kl = old - new = -1.5 + 1 = -0.5, 0, masked 0
    torch.testing.assert_close(metrics["ppo_kl"], torch.tensor([[-0.5, 0.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-2.0, 1.0, 0.0]]))
    assert old.grad is None and adv.grad is None


@pytest.mark.parametrize("fn", [gspo_loss, cispo_loss, reinforce_loss])
def test_new_losses_mask_non_finite_padding_and_detach_metrics(fn):
    log_probs = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("nan")]])
    loss, metrics = fn(log_probs, old, torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 0.0]]))
    assert torch.isfinite(loss).all() and loss[0, 1] == 0.0
    for value in metrics.values():
        assert not value.requires_grad and value.dtype == torch.float32 and value[0, 1] == 0.0


# ---------------------------------------------------------------- truncated IS weights


def test_truncated_is_weights_token_level():
    # old - rollout per token: ln3, ln0.5, 0 | masked; cap 2
    # w = min(3, 2) = 2 (capped), 0.5, 1, masked 0 -> mean (2 + 0.5 + 1) / 3 = 1.166667, clipfrac 1/3
    rollout = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    old = rollout + torch.tensor([[math.log(3.0), math.log(0.5), 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, metrics = truncated_is_weights(old, rollout, mask)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0, 0.0]]))
    torch.testing.assert_close(metrics["rollout_is/mean"], torch.tensor(3.5 / 3))
    torch.testing.assert_close(metrics["rollout_is/clipfrac"], torch.tensor(1 / 3))
    assert set(metrics) == {"rollout_is/mean", "rollout_is/clipfrac"}  # the mismatch is mismatch_metrics'


def test_truncated_is_weights_sequence_level():
    # row 0: ln3 + ln0.5 + 0 = ln1.5 (masked ln7 ignored) -> w = 1.5 on its 3 valid tokens
    # row 1: ln2 + ln2 = ln4 -> min(4, 2) = 2 (capped) on its 2 tokens
    # mean over 5 valid tokens (1.5 * 3 + 2 * 2) / 5 = 1.7; capped tokens 2 / 5 = 0.4
    rollout = torch.full((2, 3), -2.0)
    old = rollout + torch.tensor([[math.log(3.0), math.log(0.5), 0.0],
                                  [math.log(2.0), math.log(2.0), math.log(7.0)]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old.requires_grad_(True)
    weights, metrics = truncated_is_weights(old, rollout, mask, level="sequence")
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(metrics["rollout_is/mean"], torch.tensor(1.7))
    torch.testing.assert_close(metrics["rollout_is/clipfrac"], torch.tensor(0.4))
    assert not weights.requires_grad
    assert all(not v.requires_grad and v.dim() == 0 for v in metrics.values())


def test_truncated_is_weights_rejects_bad_options():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="'token' or 'sequence'.*'seq'"):
        truncated_is_weights(x, x, torch.ones(1, 2), level="seq")
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(x, x, torch.ones(1, 2), cap=0.0)
