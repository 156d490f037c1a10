"""Reduce a per-token matrix (loss or metric) to a scalar.

Denominators are those of the whole mini-batch (all micro-batches on all ranks), passed in
as `num_tokens` / `num_seqs`. Each micro-batch then contributes its exact share, and summing
(or all-reducing) the per-micro-batch results gives the mini-batch value: the gradient does
not depend on how the mini-batch is split. Without them, the call's own counts are used.

Every mode shares the signature `fn(values, mask, num_tokens, num_seqs, horizon) -> scalar`,
called by keyword, with num_tokens / num_seqs already filled in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.registry import LOSS_AGGREGATIONS

__all__ = [
    "aggregate_loss",
    "masked_mean",
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
]


def aggregate_loss(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Scalar reduction of `values` [B, R] over `mask` [B, R] by the mode registered as `mode`.

    Args:
        values: [B, R] per-token values.
        mask: [B, R], 1 on tokens that count, 0 elsewhere.
        mode: "token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
            "seq-mean-token-sum-norm", or a user-registered mode.
        num_tokens: global number of masked-in tokens of the mini-batch; default mask.sum().
        num_seqs: global number of sequences of the mini-batch; default B.
        horizon: maximum response length budget (needed by "seq-mean-token-sum-norm").

    Returns:
        scalar tensor.
    """
    fn = LOSS_AGGREGATIONS.get(mode)
    if num_tokens is None:
        num_tokens = mask.sum()
    if num_seqs is None:
        num_seqs = mask.shape[0]
    return fn(values=values, mask=mask, num_tokens=num_tokens, num_seqs=num_seqs, horizon=horizon)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) / max(sum(mask), 1), over all elements or along `dim`."""
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(values, mask, num_tokens, num_seqs, horizon) -> Tensor:
    """sum_{i,t} v_it * m_it / num_tokens: every token weighs the same.

    DAPO (Yu et al. 2025, arXiv:2503.14476), "token-level policy gradient loss".
    """
    return (values * mask.to(values.dtype)).sum() / _denominator(num_tokens, values)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(values, mask, num_tokens, num_seqs, horizon) -> Tensor:
    """sum_i [ sum_t v_it * m_it / max(len_i, 1) ] / num_seqs, len_i = sum_t m_it.

    Each sequence weighs the same, whatever its length: the original GRPO objective
    (Shao et al. 2024, arXiv:2402.03300).
    """
    mask = mask.to(values.dtype)
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / _denominator(num_seqs, values)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(values, mask, num_tokens, num_seqs, horizon) -> Tensor:
    """sum_i [ sum_t v_it * m_it ] / num_seqs: each sequence's token sum, averaged.

    Longer sequences weigh more, in proportion to their length: the sequence-level
    REINFORCE objective, as in verl's "seq-mean-token-sum".
    """
    return (values * mask.to(values.dtype)).sum() / _denominator(num_seqs, values)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(values, mask, num_tokens, num_seqs, horizon) -> Tensor:
    """sum_{i,t} v_it * m_it / (num_seqs * horizon), horizon = max response length budget.

    A length-independent constant denominator: Dr.GRPO (Liu et al. 2025, arXiv:2503.20783).
    """
    if horizon is None:
        raise ValueError(
            "loss aggregation mode 'seq-mean-token-sum-norm' needs `horizon` "
            "(the maximum response length); pass horizon=<max response tokens>."
        )
    denominator = _denominator(num_seqs, values) * _denominator(horizon, values)
    return (values * mask.to(values.dtype)).sum() / denominator


def _denominator(count: Tensor | float, like: Tensor) -> Tensor:
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)
