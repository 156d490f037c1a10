"""Critic loss: per-token clipped value regression, returned unaggregated like the policy losses.

The caller reduces the loss and the metric with `aggregation.aggregate_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.shapes import same_token_shape

__all__ = ["clipped_value_loss"]


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    cliprange_value: float = 0.2,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO2 value loss with the new value clipped around the rollout-time value, per token.

    v_clip  = old + clip(v - old, -c, c)
    loss_it = 0.5 * max((v - R)^2, (v_clip - R)^2)
    (Schulman et al. 2017 PPO, as implemented in OpenAI baselines' ppo2; the max makes the
    clip pessimistic: a step that moves v toward R by more than c earns no extra credit.)

    Gradients flow through `values` only: `old_values` and `returns` are detached.

    Args:
        values: [B, R] current critic values.
        old_values: [B, R] critic values at rollout time.
        returns: [B, R] regression targets (e.g. from `gae_advantages_and_returns`).
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        cliprange_value: c, the largest change of a value the clipped term allows.

    Returns:
        loss: [B, R], 0 where response_mask is 0.
        metrics: detached float [B, R]: "vf_clipfrac", 1 where the clipped term was the
            larger one (so the clip set the loss), 0 elsewhere and on padding.
    """
    same_token_shape(values=values, old_values=old_values, returns=returns, response_mask=response_mask)
    old_values, returns = old_values.detach(), returns.detach()
    mask = response_mask.bool()
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns).square()
    clipped_loss = (clipped - returns).square()
    loss = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    with torch.no_grad():
        zeros = torch.zeros_like(loss, dtype=torch.float32)
        metrics = {"vf_clipfrac": torch.where(mask & (clipped_loss > unclipped_loss), 1.0, zeros)}
    return loss, metrics
