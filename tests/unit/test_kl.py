import math

import pytest
import torch

from grpoflow.algorithms import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_in_reward,
    kl_k2,
    kl_k3,
    kl_penalty,
)


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
    assert {"k1", "k2", "k3", "k3+"} <= set(KL_ESTIMATORS.names())


# ---------------------------------------------------------------- k3+


def test_k3_plus_has_the_value_of_k3_and_the_gradient_of_k2():
    # p = 0.5, p_ref = 0.25: value k3 = 0.193147 (as above); gradient of k2 = 0.5 (logp - ref)^2
    # w.r.t. logp = logp - ref = 0.693147, and -0.693147 w.r.t. ref.
    # (k3's own gradient would be 1 - p_ref / p = 0.5.)
    # Second token: p = 0.25, p_ref = 0.5: k3 = 0.306853, gradient -0.693147 (k3's: -1)
    log_probs = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], requires_grad=True)
    out = kl_penalty(log_probs, ref, "k3+")
    torch.testing.assert_close(out, torch.tensor([[0.193147, 0.306853]]))
    out.sum().backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.693147, -0.693147]]))
    torch.testing.assert_close(ref.grad, torch.tensor([[-0.693147, 0.693147]]))


def test_k3_plus_matches_k3_value_and_k2_gradient_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 7, generator=gen).requires_grad_(True)
    b = torch.randn(4, 7, generator=gen)
    out = kl_penalty(a, b, "k3+")
    torch.testing.assert_close(out, kl_k3(a, b))
    (grad_plus,) = torch.autograd.grad(out.sum(), a)
    (grad_k2,) = torch.autograd.grad(kl_k2(a, b).sum(), a)
    (grad_k3,) = torch.autograd.grad(kl_k3(a, b).sum(), a)
    torch.testing.assert_close(grad_plus, grad_k2)
    assert not torch.allclose(grad_plus, grad_k3)


# ---------------------------------------------------------------- KL in the reward


def test_kl_in_reward_hand_computed():
    # k1 per token = logp - ref = 0.5, -0.2, 0.1 | 0.3, 0.4, masked (9); coef 0.1
    # rewards = scores - 0.1 * k1 = 0 - 0.05, 0 + 0.02, 1 - 0.01 | 0 - 0.03, 2 - 0.04, 0 (masked)
    # kl_mean = (0.5 - 0.2 + 0.1 + 0.3 + 0.4) / 5 valid tokens = 1.1 / 5 = 0.22
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    ref = torch.full((2, 3), -1.0)
    log_probs = (ref + torch.tensor([[0.5, -0.2, 0.1], [0.3, 0.4, 9.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, metrics = kl_in_reward(scores, log_probs, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.02, 0.99], [-0.03, 1.96, 0.0]]))
    torch.testing.assert_close(metrics["kl_in_reward/kl_mean"], torch.tensor(0.22))
    torch.testing.assert_close(metrics["kl_in_reward/coef"], torch.tensor(0.1))
    assert not rewards.requires_grad and rewards.dtype == torch.float32


def test_kl_in_reward_uses_the_named_estimator():
    # k2 = 0.5 * 0.4^2 = 0.08; reward 1 - 0.5 * 0.08 = 0.96
    rewards, metrics = kl_in_reward(torch.tensor([[1.0]]), torch.tensor([[-0.6]]),
                                    torch.tensor([[-1.0]]), torch.ones(1, 1), kl_coef=0.5,
                                    estimator="k2")
    torch.testing.assert_close(rewards, torch.tensor([[0.96]]))
    torch.testing.assert_close(metrics["kl_in_reward/kl_mean"], torch.tensor(0.08))


# ---------------------------------------------------------------- KL controllers


def test_fixed_kl_controller():
    ctrl = KL_CONTROLLERS.get("fixed")(kl_coef=0.05)
    ctrl.update(current_kl=100.0, n_steps=1000)
    assert ctrl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.05


def test_adaptive_kl_controller_hand_computed():
    # init 0.1, target 6, horizon 10000
    # kl 9:   error = clip(9/6 - 1 = 0.5, -0.2, 0.2) = 0.2;   mult 1 + 0.2 * 256/10000 = 1.00512
    #         value 0.1 * 1.00512 = 0.100512
    # kl 3:   error = clip(3/6 - 1 = -0.5) = -0.2;            mult 1 - 0.2 * 1000/10000 = 0.98
    #         value 0.100512 * 0.98 = 0.09850176
    # kl 6.6: error = 6.6/6 - 1 = 0.1 (inside the clip);     mult 1 + 0.1 * 5000/10000 = 1.05
    #         value 0.09850176 * 1.05 = 0.103426848
    ctrl = KL_CONTROLLERS.get("adaptive")(kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512)
    ctrl.update(current_kl=3.0, n_steps=1000)
    assert ctrl.value == pytest.approx(0.09850176)
    ctrl.update(current_kl=6.6, n_steps=5000)
    assert ctrl.value == pytest.approx(0.103426848)

    restored = AdaptiveKLController(kl_coef=1.0, target_kl=1.0, horizon=1)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.state_dict() == ctrl.state_dict()
    restored.update(current_kl=6.0, n_steps=10)  # on target: error 0, value unchanged
    assert restored.value == pytest.approx(0.103426848)


def test_adaptive_kl_controller_rejects_bad_target():
    with pytest.raises(ValueError, match="target_kl > 0"):
        AdaptiveKLController(kl_coef=0.1, target_kl=0.0, horizon=100)
    assert {"adaptive", "fixed"} <= set(KL_CONTROLLERS.names())
