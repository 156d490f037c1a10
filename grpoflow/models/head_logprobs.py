"""Log-probs and entropy straight from the last hidden states: the LM head applied in row chunks.

Over a large vocabulary (SmolLM2: 49,152 tokens) the [tokens, V] logits are the biggest tensors of
an RL step: a full float32 log-softmax of 64 x 24 response positions is 300 MB, and autograd keeps
several such copies for the backward. Here the head's matrix product, the log-sum-exp and the
entropy run `chunk_size` rows at a time. What the backward needs is the probabilities: when they fit
in `KEEP_PROBS_BYTES` in the compute dtype (SmolLM2's 1,188 response tokens of a real-model step: 117
MB in bf16) the forward keeps them, and the label's probability in float32; otherwise (and for an
entropy bonus, whose gradient needs the logits) only per-row results are kept ([N] log-sum-exp and
entropy) and the backward recomputes each chunk's logits (one more head matmul). Either way the
backward turns them into the gradient of the hidden states and of the head weight. Only the rows
asked for are computed, so padding positions cost nothing.

For softmax(z), z = logits / T, with lse = logsumexp(z), p = exp(z - lse):

    log_prob = z[label] - lse                   d log_prob / dz = onehot(label) - p
    entropy  = lse - sum_v p_v z_v              d entropy  / dz = -p * (z - (lse - entropy))

and dz / dlogits = 1 / T. Matrix products run in `compute_dtype` (bfloat16 uses the CPU's bf16
units); the softmax arithmetic and the head-weight gradient are float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Rows whose logit gradients are kept (in the compute dtype) for one head-weight gradient product: a [V, rows]
# x [rows, H] product per block runs near the matmul peak, one per small chunk does not.
WEIGHT_GRAD_ROWS = 1024
# The most bytes of [N, V] probabilities (in the compute dtype) the forward keeps for the backward instead of
# recomputing the logits there.
KEEP_PROBS_BYTES = 512 << 20


def head_log_probs(hidden: Tensor, weight: Tensor, labels: Tensor, *, temperature: float = 1.0,
                   chunk_size: int = 128, with_entropy: bool = False, entropy_grad: bool = False,
                   compute_dtype: torch.dtype = torch.float32, keep_probs_bytes: int | None = None
                   ) -> tuple[Tensor, Tensor | None]:
    """log softmax(hidden @ weight.T / T)[label] and (optionally) the entropy of each row.

    hidden: [N, H] (any float dtype), weight: [V, H] (the LM head, no bias), labels: [N] int64.
    Returns log_probs [N] float32 and entropy [N] float32 (or None). Gradients reach `hidden` and
    `weight` through log_probs, and through entropy only with `entropy_grad` (an entropy bonus);
    otherwise entropy is a detached metric. Equal to the unchunked computation up to float rounding
    (tests/unit/test_head_logprobs.py). `keep_probs_bytes`: the most bytes of probabilities the forward keeps for
    the backward (None: `KEEP_PROBS_BYTES`; 0: the backward recomputes the logits).
    """
    keep = KEEP_PROBS_BYTES if keep_probs_bytes is None else keep_probs_bytes
    if not torch.is_grad_enabled():  # a no-grad pass (old or reference log-probs) has no backward to keep them for
        keep = 0
    log_probs, entropy = _HeadLogProbs.apply(hidden, weight, labels, float(temperature), max(int(chunk_size), 1),
                                             compute_dtype, with_entropy, entropy_grad, keep)
    return log_probs, (entropy if with_entropy else None)


def _chunk_logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """[c, V] float32 z = hidden @ weight.T / T, the product in the dtype of its operands."""
    z = torch.mm(hidden, weight.t()).float()
    return z / temperature if temperature != 1.0 else z


def logit_grad(z: Tensor, labels: Tensor, lse: Tensor, grad_log_probs: Tensor, *, entropy: Tensor | None = None,
               grad_entropy: Tensor | None = None) -> Tensor:
    """[c, V] the gradient with respect to z of sum_i g_i log_prob_i (+ sum_i g'_i entropy_i), from z itself.

    z: [c, V] float32 (overwritten), labels: [c], lse / grad_log_probs / entropy / grad_entropy: [c].
    d log_prob / dz = onehot(label) - p and d entropy / dz = -p (z - (lse - entropy)), p = exp(z - lse).
    """
    p = (z - lse[:, None]).exp()
    if grad_entropy is not None and entropy is not None:
        z.sub_((lse - entropy)[:, None]).mul_(grad_entropy[:, None])
        grad = z.add_(grad_log_probs[:, None]).mul_(p).neg_()
    else:
        grad = p.mul_(-grad_log_probs[:, None])
    return grad.scatter_add_(-1, labels[:, None], grad_log_probs[:, None])


def _forward_chunks(h: Tensor, w: Tensor, labels: Tensor, temperature: float, chunk_size: int, with_entropy: bool,
                    log_probs: Tensor, lse: Tensor, entropy: Tensor, probs: Tensor | None) -> None:
    """Fill log_probs, lse and (with_entropy) entropy, all [N], and `probs` [N, V] (if given), chunk by chunk
    (h: [N, H], w: [V, H])."""
    for s in range(0, h.shape[0], chunk_size):
        rows = slice(s, s + chunk_size)
        z = _chunk_logits(h[rows], w, temperature)
        top = z.amax(-1, keepdim=True)
        e = (z - top).exp_()                                   # exp(z - max), [c, V]
        total = e.sum(-1)
        lse[rows] = top.squeeze(-1) + total.log()
        log_probs[rows] = z.gather(-1, labels[rows, None]).squeeze(-1) - lse[rows]
        if with_entropy:  # sum_v p_v z_v = sum_v e_v z_v / sum_v e_v
            entropy[rows] = lse[rows] - torch.linalg.vecdot(e, z) / total
        if probs is not None:
            probs[rows] = e.div_(total[:, None])


def _backward_from_probs(probs: Tensor, h: Tensor, w: Tensor, labels: Tensor, log_probs: Tensor, g_lp: Tensor,
                         temperature: float, want_h: bool, want_w: bool) -> tuple[Tensor | None, Tensor | None]:
    """The gradients of sum_i g_i log_prob_i with respect to h [N, H] and w [V, H] from the kept probabilities
    [N, V] (overwritten: they become the logits' gradient g (onehot(label) - p) / T, in their dtype; the label's
    term comes from its float32 log-prob, so a confident label's 1 - p does not cancel in bf16). One product each:
    the whole [N, V] gradient is at hand."""
    grad = probs.mul_((-g_lp / temperature).to(probs.dtype)[:, None])
    label_grad = g_lp * -torch.expm1(log_probs) / temperature
    grad.scatter_(-1, labels[:, None], label_grad.to(probs.dtype)[:, None])
    return (torch.mm(grad, w) if want_h else None), (torch.mm(grad.t(), h) if want_w else None)


class _HeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, compute_dtype, with_entropy, entropy_grad,
                keep_probs_bytes):
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)  # the casts are explicit: no autocast here
        n = h.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.zeros_like(log_probs)
        keep = any(ctx.needs_input_grad[:2]) and not (with_entropy and entropy_grad) \
            and n * w.shape[0] * w.element_size() <= keep_probs_bytes
        probs = torch.empty(n, w.shape[0], dtype=compute_dtype, device=h.device) if keep else None
        with torch.autocast(h.device.type, enabled=False):
            _forward_chunks(h, w, labels, temperature, chunk_size, with_entropy, log_probs, lse, entropy, probs)
        ctx.probs = probs  # not a saved tensor: nothing else holds or changes it
        ctx.save_for_backward(hidden, weight, labels, lse, entropy, log_probs)
        ctx.settings = (temperature, chunk_size, compute_dtype, with_entropy and entropy_grad)
        if not (with_entropy and entropy_grad):
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, labels, lse, entropy, log_probs = ctx.saved_tensors
        probs, ctx.probs = ctx.probs, None
        temperature, chunk_size, compute_dtype, entropy_grad = ctx.settings
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        g_lp = grad_log_probs.float() if grad_log_probs is not None else torch.zeros_like(lse)
        if probs is not None:
            with torch.autocast(h.device.type, enabled=False):
                grad_h, grad_w = _backward_from_probs(probs, h, w, labels, log_probs, g_lp, temperature,
                                                      ctx.needs_input_grad[0], ctx.needs_input_grad[1])
            return (None if grad_h is None else grad_h.to(hidden.dtype),
                    None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None, None, None)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        use_entropy = entropy_grad and grad_entropy is not None
        with torch.autocast(h.device.type, enabled=False):
            block = max(WEIGHT_GRAD_ROWS // chunk_size, 1) * chunk_size
            for b in range(0, h.shape[0], block):  # the head-weight gradient once per block: one long product
                grad_block = torch.empty(min(block, h.shape[0] - b), w.shape[0], dtype=compute_dtype, device=h.device)
                for s in range(b, b + len(grad_block), chunk_size):
                    rows = slice(s, min(s + chunk_size, b + len(grad_block)))
                    g_ent = grad_entropy[rows].float() if use_entropy else None
                    grad_z = logit_grad(_chunk_logits(h[rows], w, temperature), labels[rows], lse[rows], g_lp[rows],
                                        entropy=entropy[rows], grad_entropy=g_ent)
                    grad_block[s - b:rows.stop - b] = grad_z / temperature if temperature != 1.0 else grad_z
                    if grad_h is not None:
                        grad_h[rows] = torch.mm(grad_block[s - b:rows.stop - b], w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w.add_(torch.mm(grad_block.t(), h[b:b + len(grad_block)]))
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None, None, None)
