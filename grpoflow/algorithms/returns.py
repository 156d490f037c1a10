"""Token-level advantage estimators that also produce returns: gae, reinforce_plus_plus.

Both take `token_level_rewards` [B, R] (the score at the last valid token minus any
per-token KL penalty) and return `(advantages [B, R], returns [B, R])` (the tuple is what tells
the controller that an estimator gives returns), float32 and 0 on padding; the returns are the
critic's regression target. The recursions run right to left over valid tokens only, so a
masked position (padding, or a hole such as an observation token) is skipped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.advantages import whiten
from grpoflow.algorithms.registry import register_advantage
from grpoflow.algorithms.shapes import same_token_shape

__all__ = [
    "discounted_returns",
    "gae_advantages_and_returns",
    "reinforce_plus_plus_advantage",
    "gae_advantage",
]


def discounted_returns(token_level_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t, valid} gamma^(number of valid tokens from t to k, exclusive) r_k.

    Computed right to left over valid tokens only: a masked position (padding, or a hole
    such as an observation token) neither adds its reward nor counts as a discount step.

    Args:
        token_level_rewards: [B, R] float per-token reward.
        response_mask: [B, R], 1 on response tokens, 0 elsewhere.
        gamma: discount factor.

    Returns:
        [B, R] float32, 0 where response_mask is 0.
    """
    rewards = token_level_rewards.float()
    keep = response_mask.bool()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(keep[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return torch.where(keep, returns, torch.zeros_like(returns))


@register_advantage("reinforce_plus_plus")
def reinforce_plus_plus_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted token-level returns, whitened over the whole batch.

    G_t = r_t + gamma * G_{t+1} over valid tokens (see `discounted_returns`), and
    A_t = whiten(G)_t over all valid tokens of the batch (masked mean, unbiased std,
    + epsilon) (Hu 2025, "REINFORCE++", arXiv:2501.03262). With the per-token KL penalty in
    `token_level_rewards`, each token's advantage sees only the KL of the tokens after it.

    Args:
        token_level_rewards: [B, R] float, the score at the last valid token minus any
            per-token KL penalty.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        gamma: discount factor.
        epsilon: added to the batch std before dividing.

    Returns:
        advantages: [B, R] float32, 0 on padding.
        returns: [B, R] float32, G_t (not whitened), 0 on padding.
    """
    same_token_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    return whiten(returns, response_mask, epsilon), returns


def gae_advantages_and_returns(
    token_level_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over valid tokens, not whitened.

    delta_t = r_t + gamma * V_{t+1} - V_t,  A_t = delta_t + gamma * lam * A_{t+1},
    returns_t = A_t + V_t (Schulman et al. 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", arXiv:1506.02438), where t+1 is the next *valid*
    token and V, A beyond the last valid token are 0. Masked positions are skipped: they
    carry V_{t+1} and A_{t+1} through unchanged (as verl does for observation tokens).

    Args:
        token_level_rewards: [B, R] float per-token reward.
        values: [B, R] float critic values (detached here).
        response_mask: [B, R], 1 on response tokens, 0 elsewhere.
        gamma: discount factor.
        lam: GAE lambda.

    Returns:
        advantages: [B, R] float32, 0 where response_mask is 0.
        returns: [B, R] float32, 0 where response_mask is 0.
    """
    same_token_shape(token_level_rewards=token_level_rewards, values=values,
                        response_mask=response_mask)
    rewards, values = token_level_rewards.float(), values.detach().float()
    keep = response_mask.bool()
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        next_advantage = torch.where(keep[:, t], advantage, next_advantage)
        advantages[:, t] = advantage
    zeros = torch.zeros_like(advantages)
    advantages = torch.where(keep, advantages, zeros)
    return advantages, torch.where(keep, advantages + values, zeros)


@register_advantage("gae")
def gae_advantage(
    token_level_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """PPO's GAE advantage with a critic, whitened over the batch; returns for the critic.

    (A, returns) = gae_advantages_and_returns(...) (Schulman et al. 2016, arXiv:1506.02438),
    then A = whiten(A) over all valid tokens of the batch; returns = A + V before whitening.

    Args:
        token_level_rewards: [B, R] float, the score at the last valid token minus any
            per-token KL penalty.
        values: [B, R] float critic values V_t.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        gamma: discount factor.
        lam: GAE lambda.
        epsilon: added to the batch std before dividing.

    Returns:
        advantages: [B, R] float32, whitened, 0 on padding.
        returns: [B, R] float32, the critic's regression target, 0 on padding.
    """
    advantages, returns = gae_advantages_and_returns(
        token_level_rewards, values, response_mask, gamma, lam)
    return whiten(advantages, response_mask, epsilon), returns
