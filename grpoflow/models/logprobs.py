"""Per-token log-probabilities and entropy of a causal LM's responses.

Log-softmax over a large vocabulary is the memory peak of an RL step (B x T x V floats), so
it is computed in chunks of tokens, in float32, and only for the response positions
(`logits_to_keep`), never for the prompt.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_log_probs(logits: Tensor, labels: Tensor, *, chunk_size: int = 1024,
                    with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """log p(label) and (optionally) the entropy of each position.

    logits: [B, T, V] (any float dtype; computed in float32), labels: [B, T] int64.
    Returns log_probs [B, T] float32 and entropy [B, T] float32 (or None), where
    entropy = logsumexp(z) - sum_v softmax(z)_v * z_v. Gradients flow through log_probs, and
    through entropy only with `entropy_grad` (an entropy bonus); otherwise it is a detached metric.
    """
    b, t, v = logits.shape
    flat = logits.reshape(b * t, v)
    flat_labels = labels.reshape(b * t)
    logps, ents = [], []
    for start in range(0, b * t, max(chunk_size, 1)):
        z = flat[start:start + chunk_size].float()
        lse = torch.logsumexp(z, dim=-1)
        logps.append(z.gather(-1, flat_labels[start:start + chunk_size, None]).squeeze(-1) - lse)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ents.append(lse - (torch.softmax(z, dim=-1) * z).sum(-1))
    log_probs = torch.cat(logps).reshape(b, t) if logps else logits.new_zeros(b, t, dtype=torch.float32)
    entropy = (torch.cat(ents).reshape(b, t) if ents else log_probs.detach() * 0) if with_entropy else None
    return log_probs, entropy


def response_log_probs(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                       response_mask: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024,
                       with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, R] (and entropy [B, R]) of the response tokens given left-padded prompts.

    prompt_ids/prompt_mask: [B, P] (left-padded), response_ids/response_mask: [B, R]
    (right-padded). The logits at input position P - 1 + t predict response token t; they
    are divided by `temperature` so the result matches the sampling distribution.
    Padding positions hold arbitrary values: mask them with `response_mask`.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    r = response_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=r + 1, use_cache=False)
    logits = out.logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    return token_log_probs(logits, response_ids, chunk_size=chunk_size, with_entropy=with_entropy,
                           entropy_grad=entropy_grad)
