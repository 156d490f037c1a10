"""Policy-gradient losses: per-token loss matrix plus per-token metric matrices.

Every loss shares the family signature
`fn(log_probs, old_log_probs, advantages, response_mask, **options)
 -> (loss [B, R], metrics dict[str, Tensor[B, R]])`.
Losses are returned unaggregated: the caller reduces the loss and each metric with
`aggregation.aggregate_loss`, so the reduction mode (and its global denominators) is
chosen in one place. A loss defined only for some modes says so at registration
(`POLICY_LOSSES.meta(name)["agg_modes"]`, e.g. gspo). Each loss takes the subset of
(log_probs, old_log_probs, advantages, response_mask, clip_ratio_low, clip_ratio_high,
clip_ratio_c) it needs. `truncated_is_weights` (not a loss) corrects for the rollout
engine's numerical mismatch with the trainer (measured by `mismatch.mismatch_metrics`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpoflow.algorithms.registry import register_policy_loss
from grpoflow.algorithms.shapes import same_token_shape

__all__ = [
    "ppo_clip_loss",
    "gspo_loss",
    "cispo_loss",
    "reinforce_loss",
    "truncated_is_weights",
]

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
    same_token_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                     response_mask=response_mask)
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


@register_policy_loss("gspo", agg_modes=("seq-mean-token-mean",))
def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: PPO clipping of a sequence-level, length-normalised importance ratio.

    s_i     = exp( sum_t m_it (log_probs_it - old_it) / sum_t m_it )
    s_it    = sg(s_i) * exp(log_probs_it - sg(log_probs_it))   (value s_i, gradient s_i * dlogp_it)
    loss_it = max(-A_it * s_it, -A_it * clip(s_it, 1 - clip_ratio_low, 1 + clip_ratio_high))
    (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, GSPO-token.)
    With "seq-mean-token-mean" aggregation and A constant over a sequence, the gradient of
    sequence i is that of -A_i * s_i; hence the registered agg_modes. The log of s_i is
    clamped to [-20, 20] (on the detached factor only, so the gradient is kept).

    Args:
        log_probs, old_log_probs: [B, R] log-probs under the current / rollout policy.
        advantages: [B, R] per-token advantages (normally constant along a sequence).
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        clip_ratio_low, clip_ratio_high: clip range [1 - low, 1 + high] of s_it; the paper's
            values are 3e-4 and 4e-4 (sequence ratios stay much closer to 1 than token ones).

    Returns:
        loss: [B, R], 0 where response_mask is 0.
        metrics: detached float [B, R]: "pg_clipfrac" (1 where the clip was active),
            "ppo_kl" (old_log_probs - log_probs), both 0 on padding.
    """
    same_token_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                     response_mask=response_mask)
    old_log_probs, advantages = old_log_probs.detach(), advantages.detach()
    mask = response_mask.bool()
    weight = mask.to(log_probs.dtype)

    log_ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
    seq_log_ratio = log_ratio.sum(-1) / weight.sum(-1).clamp(min=1)
    seq_log_ratio = seq_log_ratio.detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + log_probs - log_probs.detach())
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.where(mask, torch.maximum(l1, l2), torch.zeros_like(l1))
    return loss, _clip_metrics(mask & (l2 > l1), mask, log_probs, old_log_probs)


@register_policy_loss("cispo")
def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.28,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio.

    ratio   = exp(clamp(log_probs - old_log_probs, -20, 20))
    loss_it = -sg(clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A_it * log_probs_it
    (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", arXiv:2506.13585, eq. 4-5). Unlike PPO no token's gradient is dropped: the
    clip bounds the weight, not the update. The gradient flows through log_probs only.

    Args:
        log_probs, old_log_probs: [B, R] log-probs under the current / rollout policy.
        advantages: [B, R] per-token advantages.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        clip_ratio_low, clip_ratio_high: weight clipped to [1 - low, 1 + high]. The defaults
            follow the paper, which sets no lower bound (low = 1), and DAPO's 0.28 above.

    Returns:
        loss: [B, R], 0 where response_mask is 0.
        metrics: detached float [B, R]: "pg_clipfrac" (1 where the weight was clipped),
            "ppo_kl" (old_log_probs - log_probs), both 0 on padding.
    """
    same_token_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                     response_mask=response_mask)
    old_log_probs, advantages = old_log_probs.detach(), advantages.detach()
    mask = response_mask.bool()
    with torch.no_grad():
        ratio = torch.exp((log_probs - old_log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
        weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = -weight * advantages * log_probs
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return loss, _clip_metrics(mask & (weight != ratio), mask, log_probs, old_log_probs)


@register_policy_loss("reinforce")
def reinforce_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy REINFORCE: loss_it = -A_it * log_probs_it, no ratio, no clip.

    (Williams 1992, "Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning".) Its gradient equals PPO's at ratio 1, so it is only correct
    for the first update on fresh samples; old_log_probs serve the metric alone.

    Args:
        log_probs, old_log_probs: [B, R] log-probs under the current / rollout policy.
        advantages: [B, R] per-token advantages (detached here).
        response_mask: [B, R], 1 on response tokens, 0 on padding.

    Returns:
        loss: [B, R], 0 where response_mask is 0.
        metrics: detached float [B, R]: "ppo_kl" (old_log_probs - log_probs), 0 on padding.
    """
    same_token_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                     response_mask=response_mask)
    mask = response_mask.bool()
    loss = -advantages.detach() * log_probs
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return loss, {"ppo_kl": _clip_metrics(mask, mask, log_probs, old_log_probs)["ppo_kl"]}


def truncated_is_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    level: str = "token",
    cap: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights correcting for the rollout engine / trainer mismatch.

    The rollout engine (e.g. vLLM) samples from pi_rollout, which differs numerically from
    the trainer's pi_old for the same weights; multiplying the per-token loss by
    token:    w_it = min(exp(old_it - rollout_it), cap)
    sequence: w_i  = min(exp(sum_t m_it (old_it - rollout_it)), cap), broadcast over tokens
    corrects the policy gradient for it (TIS: Yao et al. 2025, "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl).

    Args:
        old_log_probs: [B, R] log-probs of the sampled tokens under the trainer's pi_old.
        rollout_log_probs: [B, R] the same as reported by the rollout engine.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        level: "token" or "sequence".
        cap: upper bound of the weight (> 0).

    Returns:
        weights: [B, R] float32, detached, 0 on padding.
        metrics: detached scalar tensors, masked means over valid tokens:
            "rollout_is/mean": the weight; "rollout_is/clipfrac": fraction of capped weights (the mismatch
            itself is `mismatch.mismatch_metrics`, logged whether or not the weights are on).
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"truncated_is_weights level must be 'token' or 'sequence', got {level!r}.")
    if cap <= 0:
        raise ValueError(f"truncated_is_weights cap must be > 0, got {cap}.")
    same_token_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs, response_mask=response_mask)
    with torch.no_grad():
        mask = response_mask.bool()
        zeros = torch.zeros_like(old_log_probs, dtype=torch.float32)
        log_ratio = torch.where(mask, (old_log_probs - rollout_log_probs).float(), zeros)
        if level == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
        log_cap = math.log(cap)
        weights = torch.where(mask, torch.exp(log_ratio.clamp(max=log_cap)), zeros)
        capped = torch.where(mask & (log_ratio > log_cap), 1.0, zeros)
        count = mask.sum().clamp(min=1)
        metrics = {
            "rollout_is/mean": weights.sum() / count,
            "rollout_is/clipfrac": capped.sum() / count,
        }
    return weights, metrics


def _clip_metrics(clipped: Tensor, mask: Tensor, log_probs: Tensor, old_log_probs: Tensor
                  ) -> dict[str, Tensor]:
    """Detached per-token "pg_clipfrac" and "ppo_kl" (old - new) matrices, 0 on padding."""
    with torch.no_grad():
        zeros = torch.zeros_like(log_probs, dtype=torch.float32)
        return {
            "pg_clipfrac": torch.where(clipped, 1.0, zeros),
            "ppo_kl": torch.where(mask, (old_log_probs - log_probs).float(), zeros),
        }
