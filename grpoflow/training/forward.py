"""A no-grad log-prob pass over a whole batch, in token-budget micro-batches (actor and reference)."""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.data.batch import Batch
from grpoflow.training.collectives import to_device
from grpoflow.training.microbatch import split_by_tokens
from grpoflow.models.logprobs import response_log_probs


@torch.no_grad()
def batch_log_probs(model: torch.nn.Module, batch: Batch, *, temperature: float, max_tokens: int,
                    chunk_size: int, with_entropy: bool = False, compute_dtype: str | None = None
                    ) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, R] (and entropy [B, R]) of every response in `batch`, in its row order, on the CPU.
    `compute_dtype` (model.compute_dtype): bfloat16 runs the forward under autocast.

    A collective when the model is sharded: every rank runs the same number of micro-batches.
    """
    b, r = batch.response_ids.shape
    log_probs = torch.zeros(b, r)
    entropy = torch.zeros(b, r) if with_entropy else None
    device = next(model.parameters()).device
    microbatches, plans = split_by_tokens(batch, max_tokens)
    for mb, idx in zip(microbatches, plans):
        mb = to_device(mb, device)
        lp, ent = response_log_probs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                     temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
                                     compute_dtype=compute_dtype)
        if not idx:  # a padding micro-batch: only here to join the collective forward
            continue
        width = lp.shape[1]
        rows = torch.as_tensor(idx)
        log_probs[rows, :width] = (lp * mb.response_mask).cpu()
        if entropy is not None:
            entropy[rows, :width] = (ent * mb.response_mask).cpu()
    return log_probs, entropy
