"""Per-token estimators of KL(pi || pi_ref) from tokens sampled from pi.

With log r = ref_log_probs - log_probs (r = pi_ref / pi at the sampled token), Schulman's
approximations (http://joschu.net/blog/kl-approx.html) are
    k1 = -log r                  unbiased, high variance, can be negative
    k2 = 0.5 * (log r)^2         biased, low variance, >= 0
    k3 = (r - 1) - log r         unbiased, low variance, >= 0  (verl's "low_var_kl")
    k3+                          the value of k3 with the gradient of k2
Every estimator shares the signature `fn(log_probs, ref_log_probs) -> Tensor[B, R]`.

The KL enters training either as a loss term (an estimator above, aggregated like the policy
loss) or as a per-token reward penalty (`kl_in_reward`), whose coefficient a KL controller
(`KL_CONTROLLERS`: "fixed", "adaptive") may steer toward a target KL.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.registry import KL_CONTROLLERS, KL_ESTIMATORS
from grpoflow.algorithms.shapes import same_token_shape

__all__ = [
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_k3_plus",
    "kl_penalty",
    "kl_in_reward",
    "FixedKLController",
    "AdaptiveKLController",
]

_MAX_LOG_RATIO = 20.0  # keeps exp() in k3 finite
_K3_BOUND = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = log_probs - ref_log_probs, shapes [B, R] -> [B, R] (Schulman 2020)."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2")
def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = 0.5 * (log_probs - ref_log_probs)^2, shapes [B, R] -> [B, R] (Schulman 2020)."""
    return 0.5 * (log_probs - ref_log_probs).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = exp(d) - d - 1 with d = ref_log_probs - log_probs, shapes [B, R] -> [B, R].

    d is clamped to [-20, 20] before exp and the result to [-10, 10] for numerical safety,
    as in verl's low_var_kl (Schulman 2020, http://joschu.net/blog/kl-approx.html).
    """
    d = (ref_log_probs - log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (torch.exp(d) - d - 1.0).clamp(-_K3_BOUND, _K3_BOUND)


@KL_ESTIMATORS.register("k3+")
def kl_k3_plus(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Straight-through k3: the value of k3, the gradient of k2; [B, R] -> [B, R].

    k3+ = k2 - sg(k2) + sg(k3). k3's gradient w.r.t. log_probs, 1 - pi_ref / pi, explodes
    where pi_ref >> pi; k2's, log(pi / pi_ref), is the unbiased gradient of KL(pi || pi_ref)
    for on-policy samples (verl's "low_var_kl+" / "k3+"; Schulman 2020).
    """
    k2 = kl_k2(log_probs, ref_log_probs)
    return k2 - k2.detach() + kl_k3(log_probs, ref_log_probs).detach()


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate [B, R] from the estimator registered as `estimator` (e.g. "k3")."""
    return KL_ESTIMATORS.get(estimator)(log_probs, ref_log_probs)


def kl_in_reward(
    token_level_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Subtract a per-token KL penalty from the rewards (the KL as part of the reward).

    token_level_rewards_it = token_level_scores_it - kl_coef * kl_it * m_it
    with kl_it the `estimator`'s per-token estimate of KL(pi_old || pi_ref) (Ziegler et al.
    2019, "Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593; Ouyang
    et al. 2022). Everything is detached: a reward carries no gradient.

    Args:
        token_level_scores: [B, R] float, the score at the last valid token, 0 elsewhere.
        log_probs: [B, R] log-probs of the sampled tokens under the rollout policy.
        ref_log_probs: [B, R] the same under the reference policy.
        response_mask: [B, R], 1 on response tokens, 0 on padding.
        kl_coef: penalty coefficient (e.g. a KL controller's `.value`).
        estimator: a name registered in KL_ESTIMATORS ("k1", "k2", "k3", ...).

    Returns:
        token_level_rewards: [B, R] float32.
        metrics: detached scalars: "kl_in_reward/kl_mean", the masked mean of kl_it over
            valid tokens; "kl_in_reward/coef", kl_coef.
    """
    same_token_shape(token_level_scores=token_level_scores, log_probs=log_probs, ref_log_probs=ref_log_probs,
                     response_mask=response_mask)
    with torch.no_grad():
        mask = response_mask.bool()
        kl = kl_penalty(log_probs.float(), ref_log_probs.float(), estimator)
        kl = torch.where(mask, kl, torch.zeros_like(kl))
        rewards = token_level_scores.float() - kl_coef * kl
        metrics = {
            "kl_in_reward/kl_mean": kl.sum() / mask.sum().clamp(min=1),
            "kl_in_reward/coef": torch.tensor(float(kl_coef), device=kl.device),
        }
    return rewards, metrics


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """A constant KL coefficient; `update` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Proportional controller steering the KL coefficient toward a target KL.

    error = clip(current_kl / target_kl - 1, -0.2, 0.2)
    value <- value * (1 + error * n_steps / horizon)
    (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences",
    arXiv:1909.08593, section 2.2.) A KL above target raises the coefficient, below lowers it,
    by at most 20% per `horizon` steps.

    Args:
        kl_coef: the starting coefficient (the fixed controller's one coefficient: the same config key,
            algorithm.kl_ctrl.kl_coef).
        target_kl: the KL (per sequence or per token, as the caller measures it) to track; > 0.
        horizon: number of steps (samples, in the paper) over which a 20% change may build up.
    """

    def __init__(self, kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(
                f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got target_kl="
                f"{target_kl}, horizon={horizon}."
            )
        self.value = float(kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move `value` after observing `current_kl` over `n_steps` steps."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target_kl = float(state["target_kl"])
        self.horizon = int(state["horizon"])
