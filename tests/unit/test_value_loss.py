import pytest
import torch

from grpoflow.algorithms import clipped_value_loss


def test_clipped_value_loss_hand_computed():
    # c = 0.2; v_clip = old + clip(v - old, -0.2, 0.2); loss = 0.5 * max((v-R)^2, (v_clip-R)^2)
    # tok   v    old   R    (v-R)^2   v_clip  (v_clip-R)^2   loss               clipped term wins
    #  0   1.5   1.0  2.0    0.25      1.2     0.64          0.5 * 0.64 = 0.32   yes
    #  1   1.1   1.0  0.0    1.21      1.1     1.21          0.5 * 1.21 = 0.605  no (equal)
    #  2   0.5   1.0  0.6    0.01      0.8     0.04          0.5 * 0.04 = 0.02   yes
    #  3   2.0   1.0  1.0    1.0       1.2     0.04          0.5 * 1.0  = 0.5    no (clip active, not chosen)
    #  4   9.0   1.0  0.0    masked                          0                   no
    values = torch.tensor([[1.5, 1.1, 0.5, 2.0, 9.0]])
    old = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0]])
    returns = torch.tensor([[2.0, 0.0, 0.6, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, metrics = clipped_value_loss(values, old, returns, mask, cliprange_value=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.32, 0.605, 0.02, 0.5, 0.0]]))
    torch.testing.assert_close(metrics["vf_clipfrac"], torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0]]))
    assert not metrics["vf_clipfrac"].requires_grad


def test_clipped_value_loss_gradient_through_values_only():
    # token 0: unclipped term wins -> d/dv 0.5 (v - R)^2 = v - R = 2.0 - 1.0 = 1.0
    # token 1: clipped term wins and v_clip is saturated (v - old = 0.5 > 0.2) -> 0
    # token 2: |v - old| < c, both terms equal -> v - R = 1.1 - 0.0 = 1.1
    values = torch.tensor([[2.0, 1.5, 1.1]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 1.0]], requires_grad=True)
    returns = torch.tensor([[1.0, 2.0, 0.0]], requires_grad=True)
    loss, _ = clipped_value_loss(values, old, returns, torch.ones(1, 3))
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[1.0, 0.0, 1.1]]))
    assert old.grad is None and returns.grad is None


def test_clipped_value_loss_shape_mismatch_raises():
    with pytest.raises(ValueError, match="share one"):
        clipped_value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))
