"""The loss functions the Tinker API names (`forward_backward(data, loss_fn)`), one datum at a time.

Tinker's losses are SUMS over a datum's positions, never means: whatever normalisation a program
wants it puts into `weights` or `advantages` itself, so chunking a batch never changes the gradient.
Every function has the family signature

    fn(target_logprobs [N], inputs: {name: Tensor [N]}, config: {name: float}) -> loss (scalar)

`target_logprobs[i]` is log p(target_tokens[i] | model_input[:i + 1]) under the policy being trained
(gradients flow through it only); `inputs` are the datum's other `loss_fn_inputs` as float32 [N]
tensors (`logprobs` is the SAMPLING policy's log-prob of the same token, `advantages` the per-token
advantage, 0 on prompt positions); `config` is the request's `loss_fn_config`, defaults filled in.
`TINKER_LOSSES[name]` says which inputs a loss needs and which config keys it takes, so a request is
checked (`check_request`) before any model runs.

`stable_reinforce` is named by the SDK but its objective is not published (it uses per-sequence
"stability information" recorded by the hosted sampler), so it is refused with a sentence saying so;
`custom` losses run in the SDK itself (a forward, the user's torch loss, then `cross_entropy` with the
loss's gradient as weights), so the server needs nothing more for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from torch import Tensor

__all__ = ["TINKER_LOSSES", "TinkerLoss", "check_request", "cross_entropy", "importance_sampling", "ppo", "cispo",
           "dro", "gspo"]

# exp(20) ~ 4.9e8: a ratio this far from 1 means the policies have drifted apart; the cap keeps it finite.
_MAX_LOG_RATIO = 20.0


def _ratio(target_logprobs: Tensor, sampling_logprobs: Tensor) -> Tensor:
    return torch.exp((target_logprobs - sampling_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def cross_entropy(target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Weighted negative log-likelihood: loss = -sum_i weights_i * target_logprobs_i.

    `weights` [N] defaults to 1 on every position (the SDK's own examples send only target_tokens).
    A custom loss C arrives here as weights = -dC/dlogprobs, so its gradient is exactly C's.
    """
    weights = inputs.get("weights")
    if weights is None:
        weights = torch.ones_like(target_logprobs)
    return -(weights * target_logprobs).sum()


def importance_sampling(target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]
                        ) -> Tensor:
    """REINFORCE corrected for off-policy samples: loss = -sum_i r_i * A_i, r_i = exp(lp_i - q_i),
    with lp the trained policy's and q the sampler's log-prob (`logprobs`). On-policy (lp = q) the gradient
    is -sum_i A_i * d lp_i, plain REINFORCE."""
    ratio = _ratio(target_logprobs, inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


def ppo(target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """PPO's clipped surrogate per token (Schulman et al. 2017):
    loss = -sum_i min(r_i * A_i, clip(r_i, clip_low_threshold, clip_high_threshold) * A_i)."""
    ratio = _ratio(target_logprobs, inputs["logprobs"])
    advantages = inputs["advantages"]
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def cispo(target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """CISPO (MiniMax-M1, arXiv:2506.13585): the clipped ratio is a detached weight on REINFORCE, so every token
    keeps a gradient: loss = -sum_i sg(clip(r_i, clip_low_threshold, clip_high_threshold)) * lp_i * A_i."""
    weight = _ratio(target_logprobs, inputs["logprobs"]).clamp(config["clip_low_threshold"],
                                                                config["clip_high_threshold"]).detach()
    return -(weight * target_logprobs * inputs["advantages"]).sum()


def dro(target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Direct reward optimisation (Richemond et al. 2024): REINFORCE with a quadratic penalty that keeps the policy
    near the sampler: loss = -sum_i (lp_i * A_i - beta / 2 * (lp_i - q_i)^2)."""
    penalty = 0.5 * config["beta"] * (target_logprobs - inputs["logprobs"]) ** 2
    return -(target_logprobs * inputs["advantages"] - penalty).sum()


def gspo(target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): one importance ratio per sequence, the geometric mean of the
    token ratios over the positions `sequence_ratio_mask` marks (default: all),
        s = exp(sum_i m_i (lp_i - q_i) / sum_i m_i),
    clipped PPO-style on every marked position: loss = -sum_i m_i * min(s * A_i, clip(s, low, high) * A_i).
    d s / d lp_i = s * m_i / sum(m): each token's share of the sequence ratio."""
    mask = inputs.get("sequence_ratio_mask")
    if mask is None:
        mask = torch.ones_like(target_logprobs)
    count = mask.sum().clamp(min=1.0)
    log_ratio = (mask * (target_logprobs - inputs["logprobs"])).sum() / count
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    advantages = inputs["advantages"]
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -(mask * torch.minimum(ratio * advantages, clipped * advantages)).sum()


@dataclass(frozen=True)
class TinkerLoss:
    """A Tinker loss: its function, the `loss_fn_inputs` it needs (besides target_tokens), the ones it may take,
    and its `loss_fn_config` keys with their defaults (None: the key is required)."""
    fn: Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], Tensor]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    config: Mapping[str, float | None] = field(default_factory=dict)


_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
TINKER_LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(cross_entropy, optional=("weights",)),
    "importance_sampling": TinkerLoss(importance_sampling, required=("logprobs", "advantages")),
    "ppo": TinkerLoss(ppo, required=("logprobs", "advantages"), config=_CLIP),
    "cispo": TinkerLoss(cispo, required=("logprobs", "advantages"), config=_CLIP),
    "dro": TinkerLoss(dro, required=("logprobs", "advantages"), config={"beta": None}),
    # the GSPO paper's clip range: 3e-4 below, 4e-4 above 1 (sequence ratios stay much closer to 1 than token ones)
    "gspo": TinkerLoss(gspo, required=("logprobs", "advantages"), optional=("sequence_ratio_mask",),
                       config={"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4}),
}
REFUSED = {
    "stable_reinforce": "loss_fn='stable_reinforce' is not supported by grpoflow serve tinker: its objective uses "
                        "per-sequence stability information recorded by Tinker's hosted sampler, whose definition is "
                        "not published; use importance_sampling, ppo, cispo, gspo or dro.",
    "custom": "loss_fn='custom' with a server-side loss id is not supported: this server runs custom losses in the "
              "SDK (forward_backward_custom with a Python function), which needs nothing from the server.",
}


def check_request(loss_fn: str, input_names: set[str], config: Mapping[str, float | str] | None) -> dict[str, float]:
    """The loss's config with defaults filled in; a ValueError naming the problem if `loss_fn`, a datum's
    `loss_fn_inputs` (`input_names`, target_tokens included) or the config does not fit it."""
    if loss_fn in REFUSED:
        raise ValueError(REFUSED[loss_fn])
    if loss_fn not in TINKER_LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; this server has {sorted(TINKER_LOSSES)}.")
    spec = TINKER_LOSSES[loss_fn]
    missing = [k for k in ("target_tokens", *spec.required) if k not in input_names]
    if missing:
        raise ValueError(f"loss_fn={loss_fn!r} needs loss_fn_inputs {missing} in every datum (it has "
                         f"{sorted(input_names)}).")
    extra = sorted(input_names - {"target_tokens", *spec.required, *spec.optional})
    if extra:
        raise ValueError(f"loss_fn={loss_fn!r} does not use loss_fn_inputs {extra}; it takes target_tokens, "
                         f"{list(spec.required + spec.optional)}.")
    given = dict(config or {})
    unknown = sorted(set(given) - set(spec.config))
    if unknown:
        raise ValueError(f"loss_fn={loss_fn!r} has no loss_fn_config keys {unknown}; it takes {sorted(spec.config)}.")
    resolved: dict[str, float] = {}
    for key, default in spec.config.items():
        value = given.get(key, default)
        if value is None:
            raise ValueError(f"loss_fn={loss_fn!r} needs loss_fn_config={{{key!r}: ...}}.")
        if isinstance(value, str):
            raise ValueError(f"loss_fn_config[{key!r}] must be a number, got the string {value!r}.")
        resolved[key] = float(value)
    return resolved
