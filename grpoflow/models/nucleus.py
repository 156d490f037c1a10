"""Top-p (nucleus) sampling's distribution, shared by the sampler and the trainer so both score a token alike.

With top_p < 1 the engine draws from the smallest set of likeliest tokens whose mass reaches top_p, renormalised:

    pi_p(y) = pi(y) / sum_{v kept} pi(v)  for y kept, 0 otherwise

so that distribution, not the full one, is what sampled the tokens, and the log-prob the trainer must
recompute for an importance ratio of 1 (TRL #7269 measured a mean ratio of 0.896 scoring top-p samples under the
full distribution; prime-rl #3235's fix is this one). The engine records, per sampled token, the *floor* of the
kept set: a log-prob under the full temperature-scaled distribution, midway between the least likely kept token
and the likeliest cut one, so the trainer's own log-probs (equal to the engine's up to rounding, ~1e-7) fall on
the same side of it and keep the same set. -inf: nothing was cut (top_p = 1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.models.log_softmax import accurate_log_softmax

NO_CUT = float("-inf")


def nucleus_floor(log_probs: Tensor, top_p: float) -> Tensor:
    """[A] the floor of each row's nucleus: log_probs [A, V] (a full log-softmax), top_p in (0, 1].

    A token is kept when the mass of the tokens likelier than it is below top_p (the likeliest always is); the
    floor lies halfway between the last kept log-prob and the first cut one (-inf when none is cut). Ties at the
    boundary are kept together (the sampler, `top_p_filter`, keeps them in sort order; exact ties are rare).
    """
    if top_p >= 1.0:
        return torch.full(log_probs.shape[:1], NO_CUT, dtype=torch.float32, device=log_probs.device)
    sorted_lp, _ = log_probs.float().sort(-1, descending=True)
    probs = sorted_lp.exp()
    kept = ((probs.cumsum(-1) - probs) < top_p).sum(-1)  # [A], >= 1
    last = sorted_lp.gather(-1, (kept - 1)[:, None]).squeeze(-1)
    first_cut = sorted_lp.gather(-1, kept.clamp(max=sorted_lp.shape[-1] - 1)[:, None]).squeeze(-1)
    return torch.where(kept < sorted_lp.shape[-1], (last + first_cut) / 2, torch.full_like(last, NO_CUT))


def truncated_log_probs(z: Tensor, labels: Tensor, floors: Tensor) -> Tensor:
    """[N] log pi_p(label): the label's log-prob renormalised over the tokens kept above each row's floor.

    z: [N, V] float32 temperature-scaled logits; labels: [N] int64; floors: [N] float32 (-inf: nothing cut, the
    plain log-softmax). kept = {v : accurate_log_softmax(z)_v >= floor} (the sampler's own log-probs) plus the
    label itself (sampled, so kept), and
    log pi_p(label) = z_label - logsumexp_{v kept} z_v. Differentiable in z: the gradient is onehot(label) - pi_p
    (the kept set is a constant of the sample).
    """
    with torch.no_grad():
        kept = (accurate_log_softmax(z) >= floors[:, None]).scatter_(-1, labels[:, None], True)
    return z.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(z.masked_fill(~kept, float("-inf")), -1)
