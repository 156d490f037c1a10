"""The checks and group reductions the algorithm functions share: one [B, R] shape, one group per id.

Pure torch: `same_token_shape` raises a ValueError naming each input and its shape; `group_slots` maps arbitrary
group ids to 0..G-1 and `group_max_min` reduces a [B] tensor to each group's max and min over those slots.
"""

from __future__ import annotations

import torch
from torch import Tensor


def same_token_shape(**tensors: Tensor) -> None:
    """Every tensor has one [B, R] shape, else a ValueError naming them and their shapes."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"{', '.join(shapes)} must share one [B, R] shape, got {shapes}.")


def same_groups(scores: Tensor, group_ids: Tensor) -> None:
    """scores [B] and group_ids [B]: both 1-D of one length, else a ValueError with their shapes."""
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(f"scores and group_ids must both be 1-D of the same length, got shapes "
                         f"{tuple(scores.shape)} and {tuple(group_ids.shape)}.")


def group_slots(group_ids: Tensor) -> Tensor:
    """[B] int64 slot 0..G-1 of each sample's group (ids need not be contiguous or sorted)."""
    return torch.unique(group_ids, return_inverse=True)[1]


def group_max_min(values: Tensor, slot: Tensor) -> tuple[Tensor, Tensor]:
    """Each group's max and min of `values` [B] float, per slot (`group_slots`): two [B]-sized buffers whose
    first G entries are the groups' (index them with `slot` to get each sample's group value)."""
    group_max = torch.full_like(values, -torch.inf).scatter_reduce(0, slot, values, "amax")
    group_min = torch.full_like(values, torch.inf).scatter_reduce(0, slot, values, "amin")
    return group_max, group_min
