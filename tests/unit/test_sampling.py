"""Token sampling: nucleus filtering by hand, greedy, and the log-prob that is returned."""

import math

import pytest
import torch

from grpoflow.engines.sampling import sample_tokens, top_p_filter


@pytest.mark.parametrize("top_p, kept", [(0.5, [0]), (0.7, [0, 1]), (0.8, [0, 1]), (0.81, [0, 1, 2]),
                                         (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_that_reaches_top_p(top_p, kept):
    # sorted: 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95; kept while that is < top_p
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    order = [1, 3, 0, 2]  # token ids from most to least likely
    out = top_p_filter(probs, top_p)
    expected = torch.zeros_like(probs)
    for rank in kept:
        expected[0, order[rank]] = probs[0, order[rank]]
    torch.testing.assert_close(out, expected)


def test_greedy_returns_the_argmax_and_its_unscaled_log_prob():
    logits = torch.tensor([[0.0, math.log(3.0)], [2.0, 0.0]])
    token, lp, floor = sample_tokens(logits, temperature=0.0, top_p=1.0)
    assert token.tolist() == [1, 0] and (floor == float("-inf")).all()
    # softmax([0, ln 3]) = [1/4, 3/4]; softmax([2, 0])[0] = e^2 / (e^2 + 1)
    torch.testing.assert_close(lp, torch.tensor([math.log(0.75), 2 - math.log(math.exp(2) + 1)]))


def test_sampled_log_prob_is_under_the_renormalised_nucleus_with_top_p():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]]).repeat(200, 1)
    torch.manual_seed(0)
    token, lp, floor = sample_tokens(logits, temperature=0.5, top_p=0.9)
    full = torch.log_softmax(logits[0] / 0.5, -1)
    # the nucleus of softmax(logits / 0.5) at 0.9: tokens 1 (0.84) and 0 (0.11); the others are never drawn
    assert set(token.tolist()) == {0, 1}
    kept = torch.logsumexp(full[[0, 1]], -1)
    torch.testing.assert_close(lp, full[token] - kept)
    # the floor: halfway between token 0's log-prob (last kept) and token 2's (first cut)
    torch.testing.assert_close(floor, ((full[0] + full[2]) / 2).expand(200))
    # top_p 1: the full distribution's log-prob, nothing cut
    token, lp, floor = sample_tokens(logits, temperature=0.5, top_p=1.0)
    torch.testing.assert_close(lp, full[token])
    assert (floor == float("-inf")).all()


def test_sampling_follows_the_global_seed():
    logits = torch.randn(16, 11)
    torch.manual_seed(3)
    a = sample_tokens(logits, temperature=1.0, top_p=1.0)[0]
    torch.manual_seed(3)
    b = sample_tokens(logits, temperature=1.0, top_p=1.0)[0]
    assert torch.equal(a, b)


def test_given_uniforms_draw_by_inverse_cdf_of_the_nucleus():
    # softmax([ln 1, ln 3, ln 6]) = [0.1, 0.3, 0.6]; top_p 0.8 keeps tokens 2 (0.6) and 1 (0.3):
    # cumulative kept mass [0, 0.3, 0.9], so u in [0, 1/3) -> token 1, u in [1/3, 1) -> token 2
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]]).repeat(3, 1)
    token, lp, _ = sample_tokens(logits, temperature=1.0, top_p=0.8, uniform=torch.tensor([0.0, 0.3, 0.34]))
    assert token.tolist() == [1, 1, 2]
    # under the nucleus {1, 2} renormalised: 0.3 / 0.9 and 0.6 / 0.9
    torch.testing.assert_close(lp, torch.tensor([math.log(1 / 3), math.log(1 / 3), math.log(2 / 3)]))


def test_draws_from_the_global_generator_follow_the_distribution():
    # softmax([ln 1, ln 2, ln 7]) = [0.1, 0.2, 0.7]; 20,000 rows: each frequency within 4 standard errors
    logits = torch.tensor([[0.0, math.log(2.0), math.log(7.0)]]).repeat(20_000, 1)
    torch.manual_seed(0)
    token, _, _ = sample_tokens(logits, temperature=1.0, top_p=1.0)
    freq = torch.bincount(token, minlength=3).float() / len(token)
    for f, p in zip(freq.tolist(), [0.1, 0.2, 0.7]):
        assert abs(f - p) < 4 * math.sqrt(p * (1 - p) / len(token))


def test_sampled_log_probs_have_no_offset_over_a_wide_vocabulary():
    """Over 49,152 logits spread as a trained LM's, the sampler's log-probs are the float64 ones rounded: no
    one-signed offset (issue 51). torch.log_softmax's float32 sums on a CPU ran low there, every log-prob +3.9e-6
    (models/log_softmax.py); the trainer's log-sum-exps have no such offset."""
    from grpoflow.models.head_logprobs import head_log_probs

    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(64, 64, generator=g), torch.randn(49152, 64, generator=g) * 0.5  # logits ~ N(0, 16)
    logits = hidden @ weight.t()
    exact = torch.log_softmax(logits.double(), -1)
    for temperature in (1.0, 0.0):
        token, log_prob, _ = sample_tokens(logits, temperature=temperature, top_p=1.0,
                                           uniform=torch.rand(64, generator=g))
        d = log_prob.double() - exact.gather(-1, token[:, None]).squeeze(-1)
        assert abs(d.mean().item()) < 3e-7 and d.abs().max().item() < 5e-6, (temperature, d.mean(), d.abs().max())
        trainer, _ = head_log_probs(hidden, weight, token)  # the fused head grpoflow train and the Tinker server use
        assert abs((log_prob - trainer).double().mean().item()) < 3e-7


def test_the_samplers_log_softmax_is_batch_invariant():
    """Each row's log-probs do not depend on the rows beside it (the exact mode compares the sampler's rows with the
    trainer's bit for bit)."""
    from grpoflow.models.log_softmax import accurate_log_softmax

    z = torch.randn(48, 49152, generator=torch.Generator().manual_seed(1)) * 4
    together = accurate_log_softmax(z)
    assert together.dtype == torch.float32
    assert torch.equal(together[5:17], accurate_log_softmax(z[5:17]))
    assert all(torch.equal(together[i], accurate_log_softmax(z[i:i + 1])[0]) for i in (0, 31, 47))
