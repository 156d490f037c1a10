"""On-policy distillation (OPD): a frozen teacher scores the tokens the student sampled.

The student samples y ~ pi_S(. | x); the teacher gives log pi_T(y_t | x, y_<t) for the same tokens.
The per-token reverse KL estimate on the student's own samples,

    kl_t = log pi_S(y_t | ...) - log pi_T(y_t | ...)          (k1 of KL(pi_S || pi_T))

is the signal: the advantage of token t is -kl_t (Tinker's formulation, tinker-cookbook
`distillation`; Agarwal et al. 2024 "On-Policy Distillation of Language Models"; Lu & Thinking
Machines 2025), optionally mixed with the task advantage (`distill_advantages`). Tokens the teacher
finds likelier than the student are pushed up, the others down; the policy-gradient loss then
minimises the reverse KL, mode-seeking, on the states the student itself visits.

`topk_forward_kl` is the optional dense term: the forward KL(pi_T || pi_S) on the teacher's k most
likely tokens at each position, added to the loss (verl OPD's top-k distillation loss).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["distill_advantages", "topk_forward_kl"]


def distill_advantages(task_advantages: Tensor, student_log_probs: Tensor, teacher_log_probs: Tensor,
                       response_mask: Tensor, *, kl_coef: float, task_weight: float
                       ) -> tuple[Tensor, dict[str, Tensor]]:
    """Advantages [B, R] that mix the task's with the teacher's per-token reverse KL.

        teacher_t = -kl_coef * (student_log_probs_t - teacher_log_probs_t) * mask_t
        A_t       = task_weight * task_advantages_t * mask_t + teacher_t

    task_advantages, student_log_probs (the sampling policy's log-probs of the sampled tokens),
    teacher_log_probs, response_mask: [B, R]. `task_weight=0` is pure distillation; `kl_coef=0`
    leaves the task advantage (times `task_weight`).

    Metrics (detached scalars): `distill/teacher_kl` the mean reverse-KL estimate per token,
    `distill/teacher_share` the teacher's share of the signal, sum|teacher_t| / (sum|teacher_t| +
    sum|task part_t|) over real tokens (0 when both are 0), and `distill/teacher_adv_mean` the mean
    teacher part per token.
    """
    mask = response_mask.to(torch.float32)
    kl = (student_log_probs.float() - teacher_log_probs.float()) * mask
    teacher = -kl_coef * kl
    task = task_weight * task_advantages.float() * mask
    tokens = mask.sum().clamp(min=1.0)
    teacher_abs, task_abs = teacher.abs().sum(), task.abs().sum()
    total = teacher_abs + task_abs
    share = torch.where(total > 0, teacher_abs / total.clamp(min=1e-30), torch.zeros(()))
    metrics = {"distill/teacher_kl": (kl.sum() / tokens).detach(), "distill/teacher_share": share.detach(),
               "distill/teacher_adv_mean": (teacher.sum() / tokens).detach()}
    return task + teacher, metrics


def topk_forward_kl(teacher_topk_log_probs: Tensor, student_topk_log_probs: Tensor) -> Tensor:
    """[B, R] forward KL(pi_T || pi_S) over the teacher's top-k tokens of each position.

    teacher_topk_log_probs: [B, R, k] the teacher's log-probs of its k likeliest tokens;
    student_topk_log_probs: [B, R, k] the student's log-probs of the same token ids. Both are
    renormalised over the k tokens (p = softmax of the log-probs over k), so the term is a true KL
    between two distributions on k outcomes, >= 0, and 0 exactly when the student's relative
    probabilities on the teacher's top-k equal the teacher's:

        KL_t = sum_j p_T(j) * (log p_T(j) - log p_S(j)),   p(j) = exp(lp_j) / sum_i exp(lp_i)

    Gradients flow to the student's log-probs only (the teacher is frozen). Mask and aggregate it
    like any per-token loss.
    """
    teacher = torch.log_softmax(teacher_topk_log_probs.detach().float(), dim=-1)
    student = torch.log_softmax(student_topk_log_probs.float(), dim=-1)
    return (teacher.exp() * (teacher - student)).sum(-1)
