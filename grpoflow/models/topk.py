"""Log-probs of chosen tokens beside the sampled one, for top-k distillation.

The teacher returns, at each response position, its k likeliest tokens and their log-probs
(`teacher_topk`); the student's loss needs its own log-probs of those ids (`log_probs_at`). Both
read the full [b, R, V] logits of one micro-batch (the fused-head path of `models.logprobs` keeps
only the sampled token's row), so the top-k term costs b x R x V float32 per micro-batch: lower
`actor.max_tokens_per_microbatch` for a large vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.models.logprobs import compute_autocast, response_outputs


def response_log_softmax(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                         response_mask: Tensor, *, temperature: float, compute_dtype: str | None) -> Tensor:
    """[b, R, V] float32 log softmax(logits / temperature) at the positions that predict each response token."""
    with compute_autocast(compute_dtype, prompt_ids.device, model):
        logits = response_outputs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    z = logits.float()
    z = z / temperature if temperature != 1.0 else z
    return z - torch.logsumexp(z, -1, keepdim=True)  # not torch.log_softmax (models/log_softmax.py)


@torch.no_grad()
def teacher_topk(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                 response_mask: Tensor, *, k: int, temperature: float, compute_dtype: str | None
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """(log-probs of the sampled tokens [b, R], top-k ids [b, R, k] int64, their log-probs [b, R, k]) from one
    forward; padding positions hold arbitrary values (mask them)."""
    logp = response_log_softmax(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                temperature=temperature, compute_dtype=compute_dtype)
    top = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return logp.gather(-1, response_ids[..., None]).squeeze(-1), top.indices, top.values


def log_probs_at(log_softmax: Tensor, response_ids: Tensor, ids: Tensor, *, entropy_grad: bool = False
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """From [b, R, V] log-probs: (the sampled tokens' [b, R], the entropy [b, R], those of `ids` [b, R, k]).
    Gradients flow through the sampled tokens' and `ids`' log-probs, and through the entropy with `entropy_grad`."""
    sampled = log_softmax.gather(-1, response_ids[..., None]).squeeze(-1)
    logp = log_softmax if entropy_grad else log_softmax.detach()
    entropy = -(logp.exp() * logp).sum(-1)
    return sampled, entropy, log_softmax.gather(-1, ids)
