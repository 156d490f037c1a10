"""Per-token estimators of KL(pi || pi_ref) from tokens sampled from pi.

With log r = ref_log_probs - log_probs (r = pi_ref / pi at the sampled token), Schulman's
approximations (http://joschu.net/blog/kl-approx.html) are
    k1 = -log r                  unbiased, high variance, can be negative
    k2 = 0.5 * (log r)^2         biased, low variance, >= 0
    k3 = (r - 1) - log r         unbiased, low variance, >= 0  (verl's "low_var_kl")
Every estimator shares the signature `fn(log_probs, ref_log_probs) -> Tensor[B, R]`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.registry import KL_ESTIMATORS

__all__ = ["kl_k1", "kl_k2", "kl_k3", "kl_penalty"]

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


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate [B, R] from the estimator registered as `estimator` ("k1"/"k2"/"k3")."""
    return KL_ESTIMATORS.get(estimator)(log_probs, ref_log_probs)
