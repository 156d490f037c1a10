import math

import pytest
import torch

from grpoflow.algorithms import KL_ESTIMATORS, kl_penalty


def test_estimators_hand_computed():
    # p = 0.5, p_ref = 0.25: log p - log p_ref = log 2 = 0.693147
    # k1 = 0.693147
    # k2 = 0.5 * 0.693147^2 = 0.240227
    # k3: d = log p_ref - log p = -0.693147; exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # and the reverse (p = 0.25, p_ref = 0.5): k1 = -0.693147, k2 = 0.240227,
    # k3: d = +0.693147; 2 - 0.693147 - 1 = 0.306853
    log_probs = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    torch.testing.assert_close(kl_penalty(log_probs, ref, "k1"), torch.tensor([[0.693147, -0.693147]]))
    torch.testing.assert_close(kl_penalty(log_probs, ref, "k2"), torch.tensor([[0.240227, 0.240227]]))
    torch.testing.assert_close(kl_penalty(log_probs, ref, "k3"), torch.tensor([[0.193147, 0.306853]]))


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_identical_policies_give_zero(name):
    logp = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    assert torch.all(kl_penalty(logp, logp.clone(), name) == 0.0)


def test_k3_is_clamped():
    # d = ref - logp = -50 -> clamped to -20: exp(-20) + 20 - 1 = 19.0 -> clamped to 10
    # d = +30 -> clamped to 20: exp(20) - 21 = 4.85e8 -> clamped to 10
    # d = 3 (inside): exp(3) - 3 - 1 = 20.0855 - 4 = 16.0855 -> clamped to 10
    # d = 2 (inside): exp(2) - 2 - 1 = 7.389056 - 3 = 4.389056
    logp = torch.tensor([[50.0, -30.0, -3.0, -2.0]])
    out = kl_penalty(logp, torch.zeros_like(logp), "k3")
    torch.testing.assert_close(out, torch.tensor([[10.0, 10.0, 10.0, 4.389056]]))


def test_unbiased_estimators_match_true_kl_in_expectation():
    # KL(p || q) = sum p log(p/q) over 4 outcomes; k1 and k3 averaged over samples from p
    # must match it (k2 is biased, so it is not checked here).
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    true_kl = (p * (p / q).log()).sum()  # 0.106440
    idx = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, logq = p.log()[idx], q.log()[idx]
    for name in ("k1", "k3"):
        estimate = kl_penalty(logp, logq, name).mean()
        assert abs(estimate - true_kl) < 5e-3, (name, estimate, true_kl)


def test_unknown_estimator_names_closest():
    with pytest.raises(ValueError, match="KL estimator 'k4'.*did you mean 'k"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())
