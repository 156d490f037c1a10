"""How far the rollout engine's log-probs are from the trainer's, per step (the `mismatch/*` metrics).

The engine samples token y_t and reports log pi_rollout(y_t); the trainer recomputes log pi_old(y_t) for the same
weights (or, async, for newer ones). In exact arithmetic the two agree; in practice kernels, batch shapes and
precision move them apart, and that silent gap biases the policy gradient (verl #6780, TRL #6789). With
d_t = log pi_old(y_t) - log pi_rollout(y_t) and r_t = exp(d_t) over valid tokens:

    abs_log_ratio_mean   mean |d_t|
    abs_log_ratio_max    max |d_t|
    k3_kl                mean (r_t - 1 - d_t), the k3 estimate of KL(pi_rollout || pi_old) from samples of
                         pi_rollout (Schulman, "Approximating KL divergence", 2020); >= 0 token by token
    ratio_mean           mean r_t: 1 in expectation when pi_rollout is the distribution the tokens came from
                         (TRL #7269 measured 0.896 with top-p sampling scored against the full distribution)
    outside_clip_frac    share of tokens with r_t outside PPO's band [1 - clip_low, 1 + clip_high]
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms.shapes import same_token_shape

__all__ = ["mismatch_metrics"]

# exp(20) ~ 4.9e8: keeps r_t finite when the two policies are far apart (a broken engine, not healthy training)
_MAX_LOG_RATIO = 20.0


def mismatch_metrics(old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, *,
                     clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> dict[str, Tensor]:
    """The mismatch between the trainer's and the engine's log-probs of the sampled tokens.

    Args:
        old_log_probs: [B, R] log pi_old of the sampled tokens, as the trainer computes them.
        rollout_log_probs: [B, R] the same as the rollout engine reported them.
        response_mask: [B, R], 1 on the tokens the engine sampled, 0 on padding (and on tool output).
        clip_ratio_low, clip_ratio_high: PPO's clip band [1 - low, 1 + high] for `outside_clip_frac`.

    Returns:
        detached float32 scalars keyed "mismatch/<name>" (names in the module docstring): masked means over
        the valid tokens, and the max; all 0 when no token is valid.
    """
    same_token_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs, response_mask=response_mask)
    with torch.no_grad():
        mask = response_mask.bool()
        zeros = torch.zeros_like(old_log_probs, dtype=torch.float32)
        d = torch.where(mask, (old_log_probs.float() - rollout_log_probs.float()), zeros)
        bounded = d.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        ratio = torch.exp(bounded)
        k3 = torch.where(mask, ratio - 1.0 - bounded, zeros)
        outside = mask & ((ratio < 1.0 - clip_ratio_low) | (ratio > 1.0 + clip_ratio_high))
        count = mask.sum().clamp(min=1)
        return {
            "mismatch/abs_log_ratio_mean": d.abs().sum() / count,
            "mismatch/abs_log_ratio_max": d.abs().max() if d.numel() else zeros.sum(),
            "mismatch/k3_kl": k3.sum() / count,
            "mismatch/ratio_mean": torch.where(mask, ratio, zeros).sum() / count,
            "mismatch/outside_clip_frac": outside.float().sum() / count,
        }
