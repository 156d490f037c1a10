"""Advantage estimators: rewards (and a critic's values) -> per-token advantages [B, R].

An estimator declares the inputs it needs by naming them as parameters (see
`registry.call_with_available`); the names are the controller's vocabulary:
    scores [B]                 outcome reward per response
    token_level_rewards [B, R] the score at the last valid token minus any per-token KL penalty
    response_mask [B, R]       1 on response tokens, 0 on padding
    group_ids [B]              int, the responses to one prompt share an id
    values [B, R]              critic values;  baselines [B]: reward of a greedy response
    norm_adv_by_std, epsilon, gamma, lam   options
It returns advantages [B, R] float32, 0 on padding, or the tuple `(advantages, returns)`, the
returns being the critic's regression target. This module holds the outcome estimators (from `scores`); `returns.py`
the token-level ones (gae, reinforce_plus_plus).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.registry import register_advantage
from grpoflow.algorithms.shapes import group_max_min, group_slots, same_groups

__all__ = [
    "group_mean_std",
    "whiten",
    "grpo_advantage",
    "rloo_advantage",
    "remax_advantage",
    "reinforce_plus_plus_baseline_advantage",
    "grpo_passk_advantage",
]


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
    same_groups(scores, group_ids)
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
    _check_mask(scores, response_mask)
    scores = scores.float()
    mean, std, count = group_mean_std(scores, group_ids)
    advantage = scores - mean
    if norm_adv_by_std:
        advantage = advantage / (std + epsilon)

    slot = group_slots(group_ids)
    group_max, group_min = group_max_min(scores, slot)
    all_equal = (group_max == group_min)[slot]
    singleton = count < 2
    advantage = torch.where(singleton | all_equal, torch.zeros_like(advantage), advantage)
    return advantage.unsqueeze(-1) * response_mask.float()


def whiten(values: Tensor, mask: Tensor, epsilon: float = 1e-8) -> Tensor:
    """Standardise `values` over the masked-in entries of the whole batch.

    whiten(x) = (x - mean) / (std + epsilon), with mean and unbiased std taken over the
    entries where mask is 1; entries where mask is 0 come back as 0. If every masked-in value
    is equal (or there is at most one), the result is exactly 0: float rounding in the mean
    cannot be amplified by 1 / epsilon.

    Args:
        values: [B, R] float.
        mask: [B, R], 1 on entries that count, 0 elsewhere.
        epsilon: added to the std before dividing.

    Returns:
        [B, R] float32.
    """
    values = values.float()
    if values.numel() == 0:
        return values
    keep = mask.bool()
    weight = keep.float()
    count = weight.sum()
    mean = (values * weight).sum() / count.clamp(min=1)
    centred = torch.where(keep, values - mean, torch.zeros_like(values))
    std = (centred.square().sum() / (count - 1).clamp(min=1)).sqrt()
    all_equal = values.masked_fill(~keep, -torch.inf).max() == values.masked_fill(
        ~keep, torch.inf).min()
    return torch.where(all_equal, torch.zeros_like(centred), centred / (std + epsilon))


@register_advantage("rloo")
def rloo_advantage(scores: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantage, broadcast over response tokens.

    A_i = r_i - mean_{j != i, j in g} r_j = n_g / (n_g - 1) * (r_i - mean_g)
    (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al.
    2024, "Back to Basics: Revisiting REINFORCE Style Optimization", arXiv:2402.14740).
    A_i is 0 for a singleton group, which has no other sample to form the baseline.

    Args:
        scores: [B] float, outcome reward per response.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        group_ids: [B] int, prompt group of each response (arbitrary non-negative ints).

    Returns:
        [B, R] float32, A_i * response_mask[i, t].
    """
    _check_mask(scores, response_mask)
    scores = scores.float()
    mean, _, count = group_mean_std(scores, group_ids)
    n = count.float()
    advantage = torch.where(count > 1, n / (n - 1).clamp(min=1) * (scores - mean), 0.0)
    return advantage.unsqueeze(-1) * response_mask.float()


@register_advantage("remax")
def remax_advantage(scores: Tensor, baselines: Tensor, response_mask: Tensor) -> Tensor:
    """ReMax advantage: the score minus that of a greedy response to the same prompt.

    A_i = r_i - b_i, broadcast over response tokens, not whitened (Li et al. 2023, "ReMax: A
    Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large
    Language Models", arXiv:2310.10505).

    Args:
        scores: [B] float, outcome reward per sampled response.
        baselines: [B] float, reward of the greedy response of sample i's prompt.
        response_mask: [B, R], 1 on response tokens, 0 on padding.

    Returns:
        [B, R] float32, (r_i - b_i) * response_mask[i, t].
    """
    _check_mask(scores, response_mask)
    if baselines.shape != scores.shape:
        raise ValueError(
            f"baselines must be [B] like scores, got shapes {tuple(baselines.shape)} and "
            f"{tuple(scores.shape)}."
        )
    advantage = scores.float() - baselines.float()
    return advantage.unsqueeze(-1) * response_mask.float()


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(
    scores: Tensor, response_mask: Tensor, group_ids: Tensor, epsilon: float = 1e-8
) -> Tensor:
    """REINFORCE++-baseline: group-mean baseline, then whitening over the whole batch.

    A_i = r_i - mean_g (0 for a singleton group), broadcast over response tokens, then
    A = whiten(A) over all valid tokens of the batch (masked mean, unbiased std, + epsilon)
    (Hu 2025, "REINFORCE++", arXiv:2501.03262).

    Args:
        scores: [B] float, outcome reward per response.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        group_ids: [B] int, prompt group of each response.
        epsilon: added to the batch std before dividing.

    Returns:
        [B, R] float32, 0 on padding.
    """
    _check_mask(scores, response_mask)
    scores = scores.float()
    mean, _, count = group_mean_std(scores, group_ids)
    advantage = torch.where(count > 1, scores - mean, 0.0)
    return whiten(advantage.unsqueeze(-1) * response_mask.float(), response_mask, epsilon)


@register_advantage("grpo_passk")
def grpo_passk_advantage(
    scores: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> Tensor:
    """Pass@k GRPO: only the best response of each group is credited, by its margin.

    For group g with best score r_max (its first argmax in batch order gets the credit) and
    second-best score r_2nd (the best of the others; equal to r_max on a tie):
        A_best = (r_max - r_2nd) / (std_g + epsilon)   if norm_adv_by_std
        A_best =  r_max - r_2nd                         otherwise
        A_i    = 0                                      for every other response of g,
    with std_g the unbiased group std. Groups of fewer than 2 responses get 0.
    (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", arXiv:2508.10751; verl's "grpo_passk".)

    Args:
        scores: [B] float, outcome reward per response.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        group_ids: [B] int, prompt group of each response.
        norm_adv_by_std: divide the margin by the group std.
        epsilon: added to the std before dividing.

    Returns:
        [B, R] float32, A_i * response_mask[i, t].
    """
    _check_mask(scores, response_mask)
    scores = scores.float()
    _, std, count = group_mean_std(scores, group_ids)
    slot = group_slots(group_ids)
    index = torch.arange(scores.shape[0], device=scores.device)

    group_max, _ = group_max_min(scores, slot)
    is_max = scores == group_max[slot]
    first_max = torch.full_like(index, scores.shape[0]).scatter_reduce(
        0, slot, torch.where(is_max, index, scores.shape[0]), "amin")
    is_best = index == first_max[slot]
    others = torch.where(is_best, -torch.inf, scores)
    second = torch.full_like(scores, -torch.inf).scatter_reduce(0, slot, others, "amax")

    margin = scores - second[slot]
    if norm_adv_by_std:
        margin = margin / (std + epsilon)
    advantage = torch.where(is_best & (count > 1), margin, torch.zeros_like(margin))
    return advantage.unsqueeze(-1) * response_mask.float()


def _check_mask(scores: Tensor, response_mask: Tensor) -> None:
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"response_mask must be [B, R] with B = len(scores) = {scores.shape[0]}, "
            f"got shape {tuple(response_mask.shape)}."
        )

