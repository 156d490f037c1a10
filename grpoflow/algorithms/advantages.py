"""Outcome advantage estimators: one scalar score per response -> per-token advantages.

Every estimator shares the family signature
`fn(scores, response_mask, group_ids, **options) -> Tensor[B, R] float32`; extra inputs
are declared by naming them as parameters (see `registry.call_with_available`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.registry import register_advantage

__all__ = ["group_mean_std", "grpo_advantage"]


def group_mean_std(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample mean, std and size of the sample's group, without a loop over groups.

    Args:
        scores: [B] float, one score per sample.
        group_ids: [B] int, group of each sample (e.g. the prompt index). Any non-negative
            integers; they need not be contiguous or sorted.

    Returns:
        mean: [B] float32, mean_g = (1/n_g) sum_{j in g} r_j of the sample's group g.
        std: [B] float32, unbiased (Bessel) std sqrt(sum_{j in g} (r_j - mean_g)^2 / (n_g - 1));
            0 for groups of size 1, where the unbiased estimate is undefined.
        count: [B] int64, n_g.
    """
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be 1-D of the same length, "
            f"got shapes {tuple(scores.shape)} and {tuple(group_ids.shape)}."
        )
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}.")
    scores = scores.float()
    # Map arbitrary ids to 0..G-1 so the scatter buffers have one slot per group.
    _, slot = torch.unique(group_ids, return_inverse=True)
    num_groups = int(slot.max()) + 1 if slot.numel() else 0

    count = torch.zeros(num_groups, dtype=torch.int64, device=scores.device)
    count.index_add_(0, slot, torch.ones_like(slot))
    total = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    total.index_add_(0, slot, scores)
    mean = total / count.clamp(min=1)

    # Two-pass variance (sum of squared deviations) is more accurate than E[r^2] - E[r]^2.
    sq_dev = torch.zeros_like(total).index_add_(0, slot, (scores - mean[slot]) ** 2)
    var = sq_dev / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.zeros_like(var))
    return mean[slot], std[slot], count[slot]


@register_advantage("grpo")
def grpo_advantage(
    scores: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> Tensor:
    """GRPO outcome advantage, broadcast over response tokens.

    A_i = (r_i - mean_g) / (std_g + epsilon)   if norm_adv_by_std   (GRPO: Shao et al. 2024,
                                                 "DeepSeekMath", arXiv:2402.03300)
    A_i =  r_i - mean_g                         otherwise           (Dr.GRPO: Liu et al. 2025,
                                                 "Understanding R1-Zero-Like Training",
                                                 arXiv:2503.20783)
    with mean_g, std_g (unbiased) over the responses sharing sample i's group.

    A_i is 0 for a singleton group (no other response to form a baseline) and for a group
    whose scores are all equal (no learning signal); the latter is enforced exactly, so
    float rounding in mean_g cannot be amplified by 1 / epsilon.

    Args:
        scores: [B] float, outcome reward per response.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        group_ids: [B] int, prompt group of each response (arbitrary non-negative ints).
        norm_adv_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
        epsilon: added to the std before dividing.

    Returns:
        [B, R] float32, A_i * response_mask[i, t].
    """
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"response_mask must be [B, R] with B = len(scores) = {scores.shape[0]}, "
            f"got shape {tuple(response_mask.shape)}."
        )
    scores = scores.float()
    mean, std, count = group_mean_std(scores, group_ids)
    advantage = scores - mean
    if norm_adv_by_std:
        advantage = advantage / (std + epsilon)

    _, slot = torch.unique(group_ids, return_inverse=True)
    group_max = torch.full_like(scores, -torch.inf).scatter_reduce(0, slot, scores, "amax")
    group_min = torch.full_like(scores, torch.inf).scatter_reduce(0, slot, scores, "amin")
    all_equal = (group_max == group_min)[slot]
    singleton = count < 2
    advantage = torch.where(singleton | all_equal, torch.zeros_like(advantage), advantage)
    return advantage.unsqueeze(-1) * response_mask.float()
