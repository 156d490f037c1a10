"""The top-p nucleus the sampler and the trainer share (models/nucleus.py), against hand values."""

import math

import pytest
import torch

from grpoflow.engines.sampling import top_p_filter
from grpoflow.models.nucleus import nucleus_floor, truncated_log_probs

# sorted probabilities 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95
PROBS = torch.tensor([[0.15, 0.5, 0.05, 0.3]])


@pytest.mark.parametrize("top_p, last_kept, first_cut", [(0.45, 0.5, 0.3), (0.7, 0.3, 0.15), (0.81, 0.15, 0.05)])
def test_the_floor_lies_halfway_between_the_last_kept_and_the_first_cut_log_prob(top_p, last_kept, first_cut):
    floor = nucleus_floor(PROBS.log(), top_p)
    torch.testing.assert_close(floor, torch.tensor([(math.log(last_kept) + math.log(first_cut)) / 2]))
    # the tokens at or above it are the ones the sampler keeps (from the same exp(log-probs), as sample_tokens)
    assert torch.equal(PROBS.log() >= floor[:, None], top_p_filter(PROBS.log().exp(), top_p) > 0)


def test_nothing_cut_gives_minus_infinity_and_the_plain_log_softmax():
    lp = PROBS.log()
    assert nucleus_floor(lp, 0.96).item() == float("-inf") and nucleus_floor(lp, 1.0).item() == float("-inf")
    labels = torch.tensor([2])
    torch.testing.assert_close(truncated_log_probs(lp, labels, nucleus_floor(lp, 1.0)), lp[0, 2:3])


def test_the_log_prob_is_renormalised_over_the_kept_tokens_and_so_is_its_gradient():
    # top_p 0.7 keeps 0.5 and 0.3: token 3 (0.3) -> log(0.3 / 0.8); d/dz = onehot - p_kept = [0, -0.625, 0, 0.625]
    z = (PROBS.log() + 1.7).requires_grad_(True)  # a shift leaves every softmax as it is
    floor = nucleus_floor(z.detach().log_softmax(-1), 0.7)
    lp = truncated_log_probs(z, torch.tensor([3]), floor)
    torch.testing.assert_close(lp, torch.tensor([math.log(0.3 / 0.8)]))
    lp.sum().backward()
    torch.testing.assert_close(z.grad, torch.tensor([[0.0, -0.625, 0.0, 0.625]]))


def test_the_label_counts_as_kept_even_below_the_floor():
    # a token the trainer's rounding put just under the floor was still sampled: its mass joins the kept set
    lp = PROBS.log()
    floor = torch.tensor([math.log(0.3)])  # keeps 0.5 and 0.3
    out = truncated_log_probs(lp, torch.tensor([0]), floor)  # token 0 (0.15) sits below
    torch.testing.assert_close(out, torch.tensor([math.log(0.15 / 0.95)]))
