"""Grouped-query attention as two batched matrix products, for short sequences on a CPU.

torch's CPU `scaled_dot_product_attention` is a flash kernel written for long sequences: on the
short rows of RL on chat prompts (SmolLM2: 24 response queries against 70 keys, 9 query heads
sharing 3 key/value heads) its bf16 backward takes several times the time of plain matrix products (the figures:
docs/performance-log.md, "The real-model row: SmolLM2-135M-Instruct", item 2), and
transformers first repeats every key/value head for the query heads that share it. Here the query
heads of one key/value head are stacked along the query axis ([B, Hk, g * q, d]), so keys and
values are used as they are, and the attention is

    softmax(Q K^T * scaling + mask) V        (softmax in float32, as transformers' eager attention)

with transformers' additive float mask (0 where a key is visible, the dtype's minimum elsewhere).

`register()` adds it to transformers' public `AttentionInterface` / `AttentionMaskInterface` under
`GROUPED_ATTENTION`; a model uses it after `model.set_attn_implementation(GROUPED_ATTENTION)`. The
actor and the frozen models (reference, teacher) use it on a CPU, in bf16 and in float32, since it lets their
log-prob passes run packed (below). The transformers rollout engine decodes with it in float32 on a CPU (less
sampling time than sdpa's kernel, whose cost per call dominates one query per row); in bf16 sdpa was as fast or
faster (`bench/ablation.py`, training/precision.py; the figures: docs/performance-log.md, "Packed in float32 too" and
"The float32 row against TRL fp32, on a CPU without bf16 units").

Given a `packed` layout (models/packed.py: a batch's prompts and responses laid end to end without
padding), it attends within each packed sequence's blocks instead: only a model whose implementation
is this one can run packed (`attends_packed`).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

from grpoflow.models.packed import PackedLayout, packed_attention

GROUPED_ATTENTION = "grpoflow_grouped"


def grouped_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, scaling: float, dropout: float = 0.0,
                      packed: PackedLayout | None = None, **_) -> tuple[Tensor, None]:
    """query: [B, H, q, d]; key, value: [B, Hk, k, d] with H = g * Hk (query head j uses key/value head j // g);
    attention_mask: [B, 1, q, k] additive float, or None. Returns ([B, q, H, d], None), transformers' layout.
    With `packed` (B = 1, the packed sequence), each of the layout's blocks attends within itself and
    `attention_mask` is not read."""
    if packed is not None:
        def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
            return grouped_attention(module, q, k, v, mask, scaling, dropout)[0]
        return packed_attention(query, key, value, packed, attend), None
    b, h, q, d = query.shape
    hk, k = key.shape[1], key.shape[2]
    g = h // hk
    scores = torch.matmul(query.reshape(b, hk, g * q, d), key.transpose(2, 3)) * scaling   # [B, Hk, g*q, k]
    if attention_mask is not None:
        scores = scores.view(b, hk, g, q, k) + attention_mask[:, :, None, :, :k]
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype).view(b, hk, g * q, k)
    if dropout > 0.0 and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    out = torch.matmul(probs, value)                                                       # [B, Hk, g*q, d]
    return out.view(b, h, q, d).transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `GROUPED_ATTENTION` a valid `attn_implementation` (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    AttentionMaskInterface.register(GROUPED_ATTENTION, eager_mask)
    return GROUPED_ATTENTION


def attends_packed(model: torch.nn.Module) -> bool:
    """Whether `model` attends with `grouped_attention`, so that it can run a packed batch (models/packed.py)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == GROUPED_ATTENTION


Model = TypeVar("Model", bound=torch.nn.Module)


def use_grouped_attention(model: Model) -> Model:
    """Switch `model` to `grouped_attention` (training/precision.py decides which roles do: the trained and frozen
    ones on a CPU-only machine, where it lets their passes run packed and torch's bf16 attention kernel is the slow
    part of a short-sequence step, docs/performance-log.md). Models outside transformers' attention interface (no
    `set_attn_implementation`) are left as they are. Returns the model."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(register())  # type: ignore[operator]
    return model
