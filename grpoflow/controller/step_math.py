"""The controller's own arithmetic between scoring and the advantage estimator, as pure functions
(tests/unit/test_step_math.py checks each against hand-computed values)."""

from __future__ import annotations


import torch
from torch import Tensor

from grpoflow.algorithms import kl_in_reward
from grpoflow.data.batch import Batch


def score_at_last_token(scores: Tensor, response_mask: Tensor) -> Tensor:
    """[B, R] float32: each sample's score [B] at its last response token (the last column where
    `response_mask` is 1: with multi-turn environment tokens in between, the model's last token), 0
    elsewhere (an empty response puts it at position 0). The outcome reward as a token-level reward
    (verl's token_level_scores)."""
    columns = torch.arange(response_mask.shape[1])
    last = torch.where(response_mask.bool(), columns, -1).max(-1).values if response_mask.shape[1] else \
        torch.zeros(len(scores), dtype=torch.long)
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    rewards[torch.arange(len(scores)), last.clamp(min=0)] = scores.float()
    return rewards


def loss_mask(response_mask: Tensor, truncated: Tensor, *, mask_truncated: bool) -> Tensor:
    """[B, R] the response mask, with every token of a truncated sample (`truncated` [B] bool: it hit the
    length limit before EOS) masked out when `mask_truncated` (DAPO's overlong filtering)."""
    if not mask_truncated:
        return response_mask
    return response_mask * (~truncated).to(response_mask.dtype)[:, None]


def partition_groups(signal: Tensor, group_ids: Tensor) -> tuple[list[int], list[int]]:
    """Group ids with signal and without, each in order, from `signal` [B] bool per sample
    (`algorithms.groups_with_signal`; the samples of a group agree) and `group_ids` [B] (0 .. G-1)."""
    groups = int(group_ids.max()) + 1 if len(group_ids) else 0
    per_group = [bool(signal[group_ids == g].any()) for g in range(groups)]
    return [g for g, s in enumerate(per_group) if s], [g for g, s in enumerate(per_group) if not s]


def group_rows(batch: Batch, group: int) -> list[int]:
    """The rows of `batch` in group `group`."""
    return (batch.group_ids == group).nonzero().squeeze(-1).tolist()


def token_rewards(scores: Tensor, response_mask: Tensor, truncated: Tensor, *, mask_truncated: bool,
                  old_log_probs: Tensor | None = None, ref_log_probs: Tensor | None = None, kl_coef: float = 0.0,
                  kl_estimator: str = "k1") -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The advantage estimator's inputs from the scores: (token-level rewards [B, R], loss mask [B, R],
    KL metrics).

    rewards_it = score_i at the last response token - kl_coef * kl_it * mask_it, the KL term only when
    `old_log_probs` and `ref_log_probs` are given (KL in the reward; estimator `kl_estimator`); the
    mask is `loss_mask` (truncated samples out with `mask_truncated`) and also bounds the KL term.
    """
    rewards = score_at_last_token(scores, response_mask)
    mask = loss_mask(response_mask, truncated, mask_truncated=mask_truncated)
    if old_log_probs is None or ref_log_probs is None:
        return rewards, mask, {}
    rewards, metrics = kl_in_reward(rewards, old_log_probs, ref_log_probs, mask.float(), kl_coef=kl_coef,
                                    estimator=kl_estimator)
    return rewards, mask, metrics
