"""Micro-batches formed by a token budget, never by a sample count.

A micro-batch costs (rows x padded length) tokens once its padding columns are trimmed, so
rows are sorted by length and packed greedily: similar lengths share a micro-batch and little
compute is spent on padding. Gradients do not depend on the split because losses are
normalised by the mini-batch's global counts (see `algorithms.aggregation`).
"""

from __future__ import annotations

from grpoflow.data.batch import Batch


def plan_microbatches(prompt_lengths: list[int], response_lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group row indices so each group's padded cost (rows x (max prompt + max response)) <= max_tokens.

    A single row longer than the budget gets a micro-batch of its own. The plan is a pure
    function of the lengths, so it is deterministic.
    """
    order = sorted(range(len(prompt_lengths)), key=lambda i: (prompt_lengths[i] + response_lengths[i], i))
    plans: list[list[int]] = []
    current: list[int] = []
    max_p = max_r = 0
    for i in order:
        p, r = max(max_p, prompt_lengths[i]), max(max_r, response_lengths[i])
        if current and (len(current) + 1) * (p + r) > max_tokens:
            plans.append(current)
            current, p, r = [], prompt_lengths[i], response_lengths[i]
        current.append(i)
        max_p, max_r = p, r
    if current:
        plans.append(current)
    return plans


def split_by_tokens(batch: Batch, max_tokens: int) -> tuple[list[Batch], list[list[int]]]:
    """Trimmed micro-batches of `batch` within the token budget, and the row indices of each."""
    plans = plan_microbatches(batch.prompt_mask.sum(-1).tolist(), batch.response_mask.sum(-1).tolist(), max_tokens)
    return [batch.select(idx).trimmed() for idx in plans], plans
