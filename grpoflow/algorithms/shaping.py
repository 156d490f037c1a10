"""Reward shaping and group filtering applied between scoring and the advantage estimator.

Pure tensor functions: the controller decides when to call them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.shapes import group_max_min, group_slots, same_groups

__all__ = ["overlong_penalty", "groups_with_signal"]


def overlong_penalty(
    response_lengths: Tensor,
    max_length: int,
    buffer: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO's soft overlong punishment, added to the score of each response.

    With L the response length and L_cache = `buffer` (Yu et al. 2025, "DAPO", eq. 13,
    arXiv:2503.14476):
        0                                                  if L <= max_length - buffer
        ((max_length - buffer) - L) / buffer * factor      if max_length - buffer < L <= max_length
        -factor                                            if L > max_length
    The penalty falls linearly from 0 to -factor across the last `buffer` tokens.

    Args:
        response_lengths: [B] int or float, number of valid response tokens.
        max_length: the length beyond which the full penalty applies.
        buffer: the length of the linear ramp; 0 < buffer <= max_length.
        penalty_factor: the size of the full penalty.

    Returns:
        [B] float32, 0 or negative.
    """
    if not 0 < buffer <= max_length:
        raise ValueError(
            f"overlong_penalty needs 0 < buffer <= max_length, got buffer={buffer}, "
            f"max_length={max_length}."
        )
    lengths = response_lengths.float()
    start = max_length - buffer
    ramp = (start - lengths) / buffer * penalty_factor
    penalty = torch.where(lengths > start, ramp, torch.zeros_like(lengths))
    return torch.where(lengths > max_length, torch.full_like(lengths, -penalty_factor), penalty)


def groups_with_signal(scores: Tensor, group_ids: Tensor) -> Tensor:
    """True for samples whose group's scores are not all equal.

    A group whose responses all score the same gives every one of them advantage 0 under
    group-baseline estimators, so it contributes no gradient; DAPO's dynamic sampling keeps
    only the other groups (Yu et al. 2025, arXiv:2503.14476, section 3.2). A singleton group
    has no signal either.

    Args:
        scores: [B] float, outcome reward per response.
        group_ids: [B] int, prompt group of each response (arbitrary non-negative ints).

    Returns:
        [B] bool.
    """
    same_groups(scores, group_ids)
    slot = group_slots(group_ids)
    group_max, group_min = group_max_min(scores.float(), slot)
    return (group_max != group_min)[slot]
