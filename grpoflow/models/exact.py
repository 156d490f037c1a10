"""Batch-invariant kernels: a token's numbers do not depend on what else is in its batch (rollout.exact).

The rollout engine computes a token's log-prob while decoding: one query per sequence, against its KV cache, in a
batch of whatever sequences are running. The trainer computes it again over whole sequences, in micro-batches
cut by a token budget, packed or padded. Each operation gives the same value for a row whatever the batch only if
its reduction order does not depend on the batch's shape, and two of a Llama's do not (measured on a CPU here):

- matrix products: MKL's float32 GEMM picks another kernel below 7 rows (a decode step of few sequences) than
  above, and the kernels sum in different orders. `BatchInvariantOps` runs every `F.linear` in tiles of exactly
  `TILE_ROWS` rows (the last one zero-padded), so every row goes through the same kernel with the same shape; a
  row's result then depends on that row alone (its position in the tile does not change it). bf16 products
  (oneDNN) are invariant already; they are tiled all the same.
- attention: a decode query reads its cache's columns, the trainer's query row a padded, masked [q, k] block:
  the softmax and the value product then sum over different lengths (with masked zeros in between).
  `exact_attention` computes each query against exactly the keys it may read, in position order, batched with
  the queries that read as many keys, so the engine and the trainer compute it alike.

The rest of a Llama is elementwise or reduces within a row (RMSNorm, log-softmax), which no batch shape changes.
With both in place the engine's and the trainer's log-probs are bitwise equal on a CPU, in float32 and in bf16
(`tests/integration/test_exact_mode.py`); the backward is not made invariant (gradients are sums over the batch).
Cost: one small product per tile, and per layer one attention call per distinct number of visible keys
(docs/numerics.md).
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

EXACT_ATTENTION = "grpoflow_exact"
TILE_ROWS = 16


def tiled_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) with the rows of x ([..., K]) taken `TILE_ROWS` at a time: the same result for
    a row whatever the other rows (every product has the shape [TILE_ROWS, K] x [K, N])."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    padded = -(-n // TILE_ROWS) * TILE_ROWS
    if padded != n:
        rows = torch.cat([rows, rows.new_zeros(padded - n, rows.shape[1])])
    out = torch.cat([F.linear(rows[s:s + TILE_ROWS], weight, bias) for s in range(0, padded, TILE_ROWS)])
    return out[:n].reshape(*x.shape[:-1], weight.shape[0])


class BatchInvariantOps(TorchFunctionMode):
    """Inside it, `F.linear` (every nn.Linear of a model) runs as `tiled_linear`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return tiled_linear(*args, **kwargs)
        return func(*args, **kwargs)


def exact_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                    attention_mask: Tensor | None, scaling: float, dropout: float = 0.0, **_) -> tuple[Tensor, None]:
    """query: [B, H, q, d]; key, value: [B, Hk, k, d] (H = g * Hk); attention_mask: [B, 1, q, k] additive float
    (0 where a key is visible), or None (causal, query i reads keys up to k - q + i). Returns ([B, q, H, d], None).

    Each query attends to exactly the n keys it may read, in order: softmax((Q_i K_vis^T) * scaling) V_vis with the
    softmax in float32. The queries that read the same number of keys go through one batched product (a batched
    product's slices equal the lone products: checked in tests/unit/test_exact_ops.py), so a query's call has the
    same shapes and values whatever the batch or its padding."""
    b, h, q, d = query.shape
    hk, k = key.shape[1], key.shape[2]
    g = h // hk
    if attention_mask is not None:
        visible = attention_mask[:, 0, :, :k] == 0                                              # [B, q, k]
    else:
        visible = (torch.arange(k, device=query.device)[None, :]
                   <= torch.arange(q, device=query.device)[:, None] + (k - q)).expand(b, q, k)
    counts = visible.sum(-1)                                                                    # [B, q]
    queries, keys, values = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, *, H(k), d]
    out = query.new_zeros(b, q, h, d)
    for n in counts.unique().tolist():
        if n == 0:
            continue
        rows, at = (counts == n).nonzero(as_tuple=True)                                         # [P] each
        cols = visible[rows, at].nonzero(as_tuple=True)[1].view(-1, n)                         # [P, n], in order
        ks = keys[rows[:, None], cols].permute(0, 2, 1, 3).contiguous()                        # [P, Hk, n, d]
        vs = values[rows[:, None], cols].permute(0, 2, 1, 3).contiguous()
        qs = queries[rows, at].reshape(-1, hk, g, d)                                            # [P, Hk, g, d]
        scores = torch.matmul(qs, ks.transpose(2, 3)) * scaling                                 # [P, Hk, g, n]
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        out[rows, at] = torch.matmul(probs, vs).reshape(-1, h, d)
    return out, None


def register() -> str:
    """Make `EXACT_ATTENTION` a valid `attn_implementation` (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(EXACT_ATTENTION, exact_attention)
    AttentionMaskInterface.register(EXACT_ATTENTION, eager_mask)
    return EXACT_ATTENTION


Model = TypeVar("Model", bound=torch.nn.Module)


def use_exact_attention(model: Model) -> Model:
    """Switch `model` to `exact_attention` (models outside transformers' attention interface are left as they
    are). Returns the model."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(register())  # type: ignore[operator]
    return model
