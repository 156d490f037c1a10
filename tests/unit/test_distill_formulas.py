"""On-policy distillation formulas against hand-computed values (grpoflow/algorithms/distill.py)."""

import math

import torch

from grpoflow.algorithms import distill_advantages, topk_forward_kl


def test_reverse_kl_advantage_hand_values():
    # Two tokens of one sample, the second is padding.
    # token 0: log pS = log 0.5, log pT = log 0.25 -> kl = log 2 = 0.693147; teacher part = -2 * 0.693147 = -1.386294
    # task advantage 1.0 with task_weight 0.5 -> 0.5; A_0 = 0.5 - 1.386294 = -0.886294
    # token 1 is masked: A_1 = 0 whatever its values
    task = torch.tensor([[1.0, 1.0]])
    student = torch.tensor([[math.log(0.5), -3.0]])
    teacher = torch.tensor([[math.log(0.25), -1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    adv, m = distill_advantages(task, student, teacher, mask, kl_coef=2.0, task_weight=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.886294, 0.0]]))
    torch.testing.assert_close(m["distill/teacher_kl"], torch.tensor(0.693147))
    # share = 1.386294 / (1.386294 + 0.5) = 0.734920
    torch.testing.assert_close(m["distill/teacher_share"], torch.tensor(0.734920))
    torch.testing.assert_close(m["distill/teacher_adv_mean"], torch.tensor(-1.386294))


def test_teacher_likelier_token_gets_positive_advantage_and_pure_distillation():
    # pure distillation (task_weight 0): A_t = -(log pS - log pT) = log pT - log pS
    # token 0: pT = 0.8, pS = 0.2 -> log 4 = 1.386294 (pushed up); token 1: pT = 0.1, pS = 0.4 -> -log 4
    student = torch.log(torch.tensor([[0.2, 0.4]]))
    teacher = torch.log(torch.tensor([[0.8, 0.1]]))
    adv, m = distill_advantages(torch.full((1, 2), 5.0), student, teacher, torch.ones(1, 2), kl_coef=1.0,
                                task_weight=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.386294, -1.386294]]))
    assert float(m["distill/teacher_share"]) == 1.0
    torch.testing.assert_close(m["distill/teacher_kl"], torch.tensor(0.0))  # (-1.386 + 1.386) / 2


def test_no_teacher_weight_leaves_the_task_advantage():
    task = torch.tensor([[0.3, -0.2, 0.7]])
    adv, m = distill_advantages(task, torch.zeros(1, 3), torch.full((1, 3), -1.0), torch.tensor([[1.0, 1.0, 0.0]]),
                                kl_coef=0.0, task_weight=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.3, -0.2, 0.0]]))
    assert float(m["distill/teacher_share"]) == 0.0


def test_topk_forward_kl_hand_values():
    # teacher top-2 probs 0.6, 0.2 -> renormalised 0.75, 0.25; student probs on the same ids 0.1, 0.1 -> 0.5, 0.5
    # KL = 0.75 * log(0.75 / 0.5) + 0.25 * log(0.25 / 0.5) = 0.75 * 0.405465 - 0.25 * 0.693147 = 0.130812
    teacher = torch.log(torch.tensor([[[0.6, 0.2]]]))
    student = torch.log(torch.tensor([[[0.1, 0.1]]]))
    torch.testing.assert_close(topk_forward_kl(teacher, student), torch.tensor([[0.130812]]))


def test_topk_forward_kl_zero_when_relative_probs_match_and_gradient_to_student_only():
    teacher = torch.log(torch.tensor([[[0.5, 0.3, 0.1]]])).requires_grad_(True)
    student = (torch.log(torch.tensor([[[0.5, 0.3, 0.1]]])) - 1.0).requires_grad_(True)  # same ratios, other mass
    kl = topk_forward_kl(teacher, student)
    torch.testing.assert_close(kl, torch.zeros(1, 1), atol=1e-6, rtol=0)
    student2 = torch.log(torch.tensor([[[0.2, 0.3, 0.5]]])).requires_grad_(True)
    topk_forward_kl(teacher, student2).sum().backward()
    assert teacher.grad is None and student2.grad is not None and student2.grad.abs().sum() > 0
