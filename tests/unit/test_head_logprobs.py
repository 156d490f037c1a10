"""The LM head applied in chunks (`head_log_probs`) against hand-computed values and the naive computation."""

import math

import pytest
import torch

from grpoflow.models import head_logprobs
from grpoflow.models.head_logprobs import head_log_probs, logit_grad


def test_hand_computed_log_prob_and_entropy():
    # hidden [1, 0] and head rows [0, 0], [ln 3, 0] give logits [0, ln 3] -> softmax [1/4, 3/4];
    # label 1 -> log(3/4); entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    lp, ent = head_log_probs(hidden, weight, torch.tensor([1]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    # temperature 2: logits [0, ln 3] / 2 -> softmax [1, sqrt 3] / (1 + sqrt 3); label 0 -> -log(1 + sqrt 3)
    lp, _ = head_log_probs(hidden, weight, torch.tensor([0]), temperature=2.0)
    assert lp.item() == pytest.approx(-math.log(1 + math.sqrt(3.0)), abs=1e-6)


def test_hand_computed_logit_gradient():
    # z = [0, ln 3], p = [1/4, 3/4], label 1, g = 2: d(g log p_1)/dz = g (onehot - p) = [-1/2, 1/2]
    z = torch.tensor([[0.0, math.log(3.0)]])
    lse = torch.tensor([math.log(4.0)])
    grad = logit_grad(z.clone(), torch.tensor([1]), lse, torch.tensor([2.0]))
    torch.testing.assert_close(grad, torch.tensor([[-0.5, 0.5]]))
    # entropy H = 0.5623, mean_p z = lse - H = 3/4 ln 3 = 0.8240; dH/dz = -p (z - 0.8240)
    #   = [-1/4 (0 - 0.8240), -3/4 (1.0986 - 0.8240)] = [0.2060, -0.2060]; with g = 0 on the log-prob
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    grad = logit_grad(z.clone(), torch.tensor([1]), lse, torch.tensor([0.0]), entropy=torch.tensor([h]),
                      grad_entropy=torch.tensor([1.0]))
    mean_z = 0.75 * math.log(3.0)
    torch.testing.assert_close(grad, torch.tensor([[0.25 * mean_z, -0.75 * (math.log(3.0) - mean_z)]]))


def _naive(hidden, weight, labels, temperature):
    """The unchunked computation: full logits, log-softmax, entropy = -sum p log p."""
    logp = torch.log_softmax(hidden @ weight.t() / temperature, -1)
    return logp.gather(-1, labels[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _inputs(n=13, h=8, v=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64).float().requires_grad_()
    weight = torch.randn(v, h, generator=g).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets, torch.randn(n, generator=g), torch.randn(n, generator=g)


@pytest.mark.parametrize("chunk", [1, 4, 13, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("weight_grad_rows", [5, 1024])  # 5: several head-weight products per backward
@pytest.mark.parametrize("keep_probs_bytes", [0, 1 << 20])   # 0: the backward recomputes the logits
def test_chunked_values_and_gradients_equal_the_naive_computation(chunk, temperature, weight_grad_rows,
                                                                  keep_probs_bytes, monkeypatch):
    monkeypatch.setattr(head_logprobs, "WEIGHT_GRAD_ROWS", weight_grad_rows)
    monkeypatch.setattr(head_logprobs, "KEEP_PROBS_BYTES", keep_probs_bytes)
    hidden, weight, labels, g_lp, _ = _inputs()
    lp, ent = head_log_probs(hidden, weight, labels, temperature=temperature, chunk_size=chunk, with_entropy=True)
    assert not ent.requires_grad  # a metric unless entropy_grad
    (lp * g_lp).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = _naive(hidden, weight, labels, temperature)
    (ref_lp * g_lp).sum().backward()
    torch.testing.assert_close(lp, ref_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-5, rtol=1e-5)


def test_entropy_gradient_equals_the_naive_computation():
    hidden, weight, labels, g_lp, g_ent = _inputs(seed=1)
    lp, ent = head_log_probs(hidden, weight, labels, temperature=0.7, chunk_size=5, with_entropy=True,
                             entropy_grad=True)
    ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = _naive(hidden, weight, labels, 0.7)
    ((ref_lp * g_lp).sum() + (ref_ent * g_ent).sum()).backward()
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-5, rtol=1e-5)


def test_bf16_products_stay_close_and_return_fp32():
    hidden, weight, labels, g_lp, _ = _inputs(n=32, h=64, v=500)
    lp16, ent16 = head_log_probs(hidden, weight, labels, chunk_size=8, with_entropy=True,
                                 compute_dtype=torch.bfloat16)
    (lp16 * g_lp).sum().backward()
    assert lp16.dtype == ent16.dtype == hidden.grad.dtype == weight.grad.dtype == torch.float32
    g16 = weight.grad.clone()
    weight.grad = None
    lp32, ent32 = _naive(hidden, weight, labels, 1.0)
    (lp32 * g_lp).sum().backward()
    assert not torch.equal(lp16, lp32.detach())  # the products did run in bf16
    assert (lp16 - lp32).abs().max() < 0.2 and (ent16 - ent32).abs().max() < 0.1
    assert torch.nn.functional.cosine_similarity(g16.flatten(), weight.grad.flatten(), dim=0) > 0.99


def test_kept_bf16_probabilities_give_the_recomputed_gradient_of_a_confident_label(monkeypatch):
    # a label at p ~ 0.999: its logit gradient g (1 - p) comes from the float32 log-prob, not from 1 - bf16(p)
    hidden, weight, labels, g_lp, _ = _inputs(n=16, h=32, v=300)
    with torch.no_grad():  # row 0's label logit set to logsumexp(the others) + ln 999: p = 0.999
        others = torch.cat([hidden[0] @ weight[:labels[0]].t(), hidden[0] @ weight[labels[0] + 1:].t()])
        target = torch.logsumexp(others, 0) + math.log(999.0)
        weight[labels[0]] = hidden[0] * target / hidden[0].dot(hidden[0])
    ref_lp, _ = _naive(hidden.double(), weight.double(), labels, 1.0)
    assert 0.99 < ref_lp[0].exp() < 0.9999
    ref = torch.autograd.grad((ref_lp * g_lp.double()).sum(), hidden)[0]
    errors = []
    for keep in (1 << 30, 0):
        monkeypatch.setattr(head_logprobs, "KEEP_PROBS_BYTES", keep)
        lp, _ = head_log_probs(hidden, weight, labels, chunk_size=4, compute_dtype=torch.bfloat16)
        grad = torch.autograd.grad((lp * g_lp).sum(), hidden)[0].double()
        errors.append([((grad - ref).norm() / ref.norm()).item(), ((grad[0] - ref[0]).norm() / ref[0].norm()).item()])
    kept, recomputed = errors
    assert kept[0] < 2 * recomputed[0] + 1e-3  # the whole gradient: bf16's own error, about as large either way
    assert kept[1] < 2 * recomputed[1] + 1e-3  # the confident row: no 1 - bf16(p) cancellation


def test_no_grad_and_frozen_head():
    hidden, weight, labels, _, _ = _inputs()
    with torch.no_grad():
        lp, ent = head_log_probs(hidden, weight, labels)
    assert ent is None and not lp.requires_grad
    weight.requires_grad_(False)  # e.g. a LoRA run: only the hidden states get a gradient
    head_log_probs(hidden, weight, labels)[0].sum().backward()
    assert hidden.grad is not None and weight.grad is None
