import pytest
import torch

from grpoflow.algorithms import (
    ADVANTAGE_ESTIMATORS,
    call_with_available,
    discounted_returns,
    gae_advantage,
    gae_advantages_and_returns,
    reinforce_plus_plus_advantage,
    whiten,
)


def _random_token_batch(seed, batch=12, length=9):
    """Rewards and values with right padding and holes (observation tokens) in the mask."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=gen)
    values = torch.randn(batch, length, generator=gen)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = length  # one full row
    mask = (torch.arange(length) < lengths[:, None]).float()
    holes = torch.rand(batch, length, generator=gen) < 0.2
    mask = mask * (~holes).float()
    return rewards, values, mask


def _compress(row, keep):
    return [row[t].item() for t in range(len(row)) if keep[t]]


# ---------------------------------------------------------------- discounted returns


def test_discounted_returns_hand_computed():
    # row 0, gamma 0.5, rewards 0, 0, 1: G_2 = 1, G_1 = 0 + 0.5 * 1 = 0.5, G_0 = 0.25
    # row 1, padding at t = 2 holds reward 5, which must not leak:
    #        rewards 2, 1 | pad -> G_1 = 1, G_0 = 2 + 0.5 * 1 = 2.5, G_2 = 0
    # row 2, a hole at t = 1 (reward 7 ignored, not a discount step): rewards 4, 7, 1 valid at
    #        0 and 2 -> G_2 = 1, G_1 = 0, G_0 = 4 + 0.5 * 1 = 4.5
    rewards = torch.tensor([[0.0, 0.0, 1.0], [2.0, 1.0, 5.0], [4.0, 7.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    out = discounted_returns(rewards, mask, gamma=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.5, 1.0], [2.5, 1.0, 0.0],
                                                  [4.5, 0.0, 1.0]]))


def test_reinforce_plus_plus_hand_computed():
    # gamma 1: row 0 rewards -0.1 (KL penalty), 1.0 -> G = 0.9, 1.0; row 1 one valid token -> 0
    # valid returns 0.9, 1.0, 0.0: mean 1.9 / 3 = 0.633333
    # squared deviations 0.071111 + 0.134444 + 0.401111 = 0.606667, unbiased var 0.303333,
    # std 0.550757 -> A = (0.266667, 0.366667, -0.633333) / 0.550757 = 0.484182, 0.665750, -1.149932
    rewards = torch.tensor([[-0.1, 1.0], [0.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, returns = reinforce_plus_plus_advantage(rewards, mask)
    torch.testing.assert_close(returns, torch.tensor([[0.9, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.484182, 0.665750], [-1.149932, 0.0]]),
                               atol=1e-5, rtol=1e-5)


def test_reinforce_plus_plus_matches_per_sample_loop():
    rewards, _, mask = _random_token_batch(seed=0)
    gamma = 0.9
    adv, returns = reinforce_plus_plus_advantage(rewards, mask, gamma=gamma)
    expected = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        positions = mask[i].nonzero().flatten().tolist()
        running = 0.0
        for t in reversed(positions):
            running = rewards[i, t].item() + gamma * running
            expected[i, t] = running
    torch.testing.assert_close(returns, expected)
    valid = expected[mask.bool()]
    whitened = (expected - valid.mean()) / (valid.std(unbiased=True) + 1e-8) * mask
    torch.testing.assert_close(adv, whitened)


# ---------------------------------------------------------------- GAE


def test_gae_with_gamma_and_lambda_one_is_return_minus_value():
    # gamma = lam = 1: A_t = sum_{k >= t} r_k - V_t
    # rewards 0, 0, 1, V = 0.5, 0.2, 0.7 -> A = 0.5, 0.8, 0.3; returns = A + V = 1, 1, 1
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.7]])
    adv, returns = gae_advantages_and_returns(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.8, 0.3]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0]]))


def test_gae_hand_computed_with_discount():
    # gamma = lam = 0.5, rewards 0, 0, 1, V = 0.5, 0.2, 0.6 (V beyond the end = 0)
    # delta_2 = 1 + 0.5 * 0 - 0.6 = 0.4           A_2 = 0.4
    # delta_1 = 0 + 0.5 * 0.6 - 0.2 = 0.1         A_1 = 0.1 + 0.25 * 0.4 = 0.2
    # delta_0 = 0 + 0.5 * 0.2 - 0.5 = -0.4        A_0 = -0.4 + 0.25 * 0.2 = -0.35
    # returns = A + V = 0.15, 0.4, 1.0
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.6]])
    adv, returns = gae_advantages_and_returns(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.35, 0.2, 0.4]]))
    torch.testing.assert_close(returns, torch.tensor([[0.15, 0.4, 1.0]]))


def test_gae_skips_masked_positions():
    # hole at t = 1 (its reward 9 and value 9 must not be seen) and padding at t = 3:
    # the valid tokens are rewards 0, 1 with V = 0.5, 0.6, gamma = lam = 0.5:
    # A(t=2) = 1 - 0.6 = 0.4; delta(t=0) = 0 + 0.5 * 0.6 - 0.5 = -0.2, A(t=0) = -0.2 + 0.25 * 0.4 = -0.1
    # returns 0.4, 1.0; masked positions are 0
    rewards = torch.tensor([[0.0, 9.0, 1.0, 9.0]])
    values = torch.tensor([[0.5, 9.0, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.1, 0.0, 0.4, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.4, 0.0, 1.0, 0.0]]))


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_gae_matches_per_sample_loop(gamma, lam):
    rewards, values, mask = _random_token_batch(seed=4)
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=gamma, lam=lam)
    expected_adv = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        positions = mask[i].nonzero().flatten().tolist()
        r = _compress(rewards[i], mask[i])
        v = _compress(values[i], mask[i]) + [0.0]
        last = 0.0
        for k in reversed(range(len(r))):
            last = r[k] + gamma * v[k + 1] - v[k] + gamma * lam * last
            expected_adv[i, positions[k]] = last
    torch.testing.assert_close(adv, expected_adv)
    torch.testing.assert_close(returns, (expected_adv + values) * mask)


def test_gae_estimator_whitens_advantages_not_returns():
    rewards, values, mask = _random_token_batch(seed=5)
    values.requires_grad_(True)
    raw_adv, raw_returns = gae_advantages_and_returns(rewards, values, mask, gamma=0.9, lam=0.8)
    adv, returns = gae_advantage(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, whiten(raw_adv, mask))
    torch.testing.assert_close(returns, raw_returns)
    assert not adv.requires_grad and not returns.requires_grad  # the critic is not trained here
    valid = adv[mask.bool()]
    assert abs(valid.mean().item()) < 1e-5 and abs(valid.std().item() - 1.0) < 1e-4


def test_token_level_estimators_return_advantages_and_returns():
    rewards = torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2)
    for name in ("gae", "reinforce_plus_plus"):
        out = call_with_available(ADVANTAGE_ESTIMATORS.get(name), token_level_rewards=rewards,
                                  values=torch.zeros(1, 2), response_mask=mask, scores=torch.ones(1),
                                  group_ids=torch.zeros(1, dtype=torch.long), gamma=1.0, lam=1.0,
                                  epsilon=1e-8, norm_adv_by_std=True)
        assert isinstance(out, tuple) and len(out) == 2
        assert all(t.shape == (1, 2) and t.dtype == torch.float32 for t in out)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="share one"):
        gae_advantages_and_returns(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)
