"""Policy-gradient losses: per-token loss matrix plus per-token metric matrices.

Every loss shares the family signature
`fn(log_probs, old_log_probs, advantages, response_mask, **options)
 -> (loss [B, R], metrics dict[str, Tensor[B, R]])`.
Losses are returned unaggregated: the caller reduces the loss and each metric with
`aggregation.aggregate_loss`, so the reduction mode (and its global denominators) is
chosen in one place.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.registry import register_policy_loss

__all__ = ["ppo_clip_loss"]

# exp(20) ~ 4.9e8: large enough never to bind in healthy training, small enough that the
# ratio (and its gradient) stays finite when the policies have drifted far apart.
_MAX_LOG_RATIO = 20.0


@register_policy_loss("ppo")
def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with asymmetric clip range and dual clip, per token.

    ratio     = exp(clamp(log_probs - old_log_probs, -20, 20))
    l1        = -A * ratio
    l2        = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_loss = max(l1, l2)                                   (Schulman et al. 2017, PPO)
    loss      = min(clip_loss, -A * clip_ratio_c)  if A < 0   (dual clip: Ye et al. 2020,
              = clip_loss                          if A >= 0   "Mastering Complex Control
                                                                in MOBA Games", arXiv:1912.09729)
    A separate clip_ratio_high is DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476).

    Gradients flow through `log_probs` only: `old_log_probs` and `advantages` are detached.

    Args:
        log_probs: [B, R] log-probs of the sampled tokens under the current policy.
        old_log_probs: [B, R] the same under the policy that generated the rollout.
        advantages: [B, R] per-token advantages.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        clip_ratio_low, clip_ratio_high: clip range [1 - low, 1 + high].
        clip_ratio_c: dual-clip bound on the loss of negative-advantage tokens; must be > 1.

    Returns:
        loss: [B, R], per-token loss, 0 where response_mask is 0.
        metrics: detached float [B, R] matrices, 0 where response_mask is 0:
            "pg_clipfrac": 1 where the ratio clip was active (l2 > l1).
            "pg_clipfrac_lower": 1 where the dual clip was active (A < 0 and clip_loss > -A*c).
            "ppo_kl": old_log_probs - log_probs (k1 estimate of KL(old || current)).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}.")
    shapes = [tuple(t.shape) for t in (log_probs, old_log_probs, advantages, response_mask)]
    if len(set(shapes)) != 1:
        raise ValueError(
            f"log_probs, old_log_probs, advantages and response_mask must share one [B, R] "
            f"shape, got {shapes}."
        )
    old_log_probs = old_log_probs.detach()
    advantages = advantages.detach()
    mask = response_mask.bool()

    log_ratio = (log_probs - old_log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_loss = torch.maximum(l1, l2)
    l3 = -advantages * clip_ratio_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(clip_loss, l3), clip_loss)
    # where(), not multiply: a non-finite value on a padding token must not leak through.
    loss = torch.where(mask, loss, torch.zeros_like(loss))

    with torch.no_grad():
        zeros = torch.zeros_like(loss, dtype=torch.float32)
        metrics = {
            "pg_clipfrac": torch.where(mask & (l2 > l1), 1.0, zeros),
            "pg_clipfrac_lower": torch.where(mask & negative & (clip_loss > l3), 1.0, zeros),
            "ppo_kl": torch.where(mask, (old_log_probs - log_probs).float(), zeros),
        }
    return loss, metrics
