"""Micro-batches formed by a token budget, never by a sample count.

A micro-batch costs (rows x padded length) tokens once its padding columns are trimmed, so
rows are sorted by length and packed greedily: similar lengths share a micro-batch and little
compute is spent on padding. Gradients do not depend on the split because losses are
normalised by the mini-batch's global counts (see `algorithms.aggregation`).

With several ranks the model is sharded (FSDP), and every forward and backward pass is a
collective: all ranks must run the same number of micro-batches. `split_by_tokens` agrees on
the largest count over ranks, cuts the costliest groups in two until a rank has that many, and
fills what is still missing (a rank with fewer rows than micro-batches, or none at all) with
`PaddingBatch`es: a stand-in row whose loss the engine multiplies by zero.
"""

from __future__ import annotations

import dataclasses

import torch

from grpoflow.data.batch import Batch
from grpoflow.training.collectives import global_max


class PaddingBatch(Batch):
    """A stand-in micro-batch (one row) that only exists so this rank joins a collective forward/backward:
    its loss and metrics count zero and its outputs are discarded."""


def plan_microbatches(prompt_lengths: list[int], response_lengths: list[int], max_tokens: int,
                      min_count: int = 0) -> list[list[int]]:
    """Group row indices so each group's padded cost (rows x (max prompt + max response)) <= max_tokens.

    A single row longer than the budget gets a micro-batch of its own. With `min_count`, the
    costliest group (of two rows or more) is cut in two, in length order, until there are
    `min_count` groups or every group is a single row. The plan is a pure function of the
    lengths, so it is deterministic.
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

    def cost(plan: list[int]) -> int:
        return len(plan) * (max(prompt_lengths[i] for i in plan) + max(response_lengths[i] for i in plan))

    while len(plans) < min_count:
        splittable = [k for k, plan in enumerate(plans) if len(plan) > 1]
        if not splittable:
            break
        k = max(splittable, key=lambda k: (cost(plans[k]), -k))  # earliest of the costliest
        half = (len(plans[k]) + 1) // 2
        plans[k:k + 1] = [plans[k][:half], plans[k][half:]]
    return plans


def split_by_tokens(batch: Batch, max_tokens: int) -> tuple[list[Batch], list[list[int]]]:
    """Trimmed micro-batches of `batch` within the token budget, and the row indices of each.

    Collective when a process group is up: every rank gets the same number of micro-batches,
    the trailing ones `PaddingBatch`es with an empty index list when this rank has too few rows.
    """
    lengths = batch.prompt_mask.sum(-1).tolist(), batch.response_attention_mask.sum(-1).tolist()
    count = global_max(len(plan_microbatches(*lengths, max_tokens)))
    plans = plan_microbatches(*lengths, max_tokens, min_count=count)
    microbatches = [batch.select(idx).trimmed() for idx in plans]
    if len(plans) < count:
        filler = padding_row(batch)
        microbatches += [filler] * (count - len(plans))
        plans += [[] for _ in range(count - len(plans))]
    return microbatches, plans


def padding_row(batch: Batch) -> PaddingBatch:
    """One row to compute on and throw away: the batch's first row, or with an empty batch a row of one
    prompt token (id 0) and one response token whose per-token fields are zeros."""
    if len(batch):
        row = batch.select([0]).trimmed()
    else:
        values = {}
        for f in dataclasses.fields(batch):
            v = getattr(batch, f.name)
            if isinstance(v, torch.Tensor):
                make = torch.ones if f.name.endswith("_mask") else torch.zeros
                v = make((1,) * v.dim(), dtype=v.dtype)
            values[f.name] = v
        row = Batch(**values)
    return PaddingBatch(**{f.name: getattr(row, f.name) for f in dataclasses.fields(row)})
