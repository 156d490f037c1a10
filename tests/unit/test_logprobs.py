"""Log-probs and entropy from logits, chunked, against direct computation."""

import math

import pytest
import torch

from grpoflow.models.logprobs import token_log_probs


def test_log_probs_hand_computed():
    # logits [0, ln 3] -> softmax [1/4, 3/4]; label 1 -> log(3/4); entropy = -(1/4 ln 1/4 + 3/4 ln 3/4)
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    lp, ent = token_log_probs(logits, torch.tensor([[1]]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_chunking_does_not_change_results(chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    lp, ent = token_log_probs(logits, labels, chunk_size=chunk, with_entropy=True)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(lp, ref)
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1))


def test_gradient_flows_through_log_probs_only():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    lp, ent = token_log_probs(logits, torch.zeros(2, 3, dtype=torch.long), with_entropy=True)
    assert lp.requires_grad and not ent.requires_grad
    lp.sum().backward()
    assert logits.grad.abs().sum() > 0
