"""Pure tensor algorithms: advantage estimators, policy and value losses, KL, aggregation, shaping.

Torch only: nothing here imports the config, workers or torch.distributed. Importing this
package registers every built-in in its registry.

    registry.py            the family registries + metadata + call_with_available (a function's signature = its inputs)
    shapes.py              the shared shape checks and per-group max/min
    advantages.py          group statistics; grpo, rloo, remax, reinforce_plus_plus_baseline, grpo_passk
    returns.py             discounted returns; gae, reinforce_plus_plus
    policy_loss.py         ppo (low/high clip, dual-clip), gspo, cispo, reinforce; truncated IS weights
    value_loss.py          PPO's clipped value loss
    kl.py                  k1, k2, k3, k3+; KL in the reward; fixed and adaptive KL controllers
    aggregation.py         token-mean, seq-mean-token-mean, seq-mean-token-sum(-norm) (global denominators)
    shaping.py             DAPO overlong penalty, groups with signal (dynamic sampling)
    distill.py             on-policy distillation: reverse-KL advantage mixed with the task's, top-k forward KL
    tinker_losses.py       the Tinker API's losses per datum (cross_entropy, importance_sampling, ppo, cispo, dro, gspo)
"""

from grpoflow.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    call_with_available,
    get_advantage,
    get_policy_loss,
    load_from_file,
    register_advantage,
    register_policy_loss,
    required_inputs,
)
from grpoflow.algorithms.advantages import (
    group_mean_std,
    grpo_advantage,
    grpo_passk_advantage,
    reinforce_plus_plus_baseline_advantage,
    remax_advantage,
    rloo_advantage,
    whiten,
)
from grpoflow.algorithms.returns import (
    discounted_returns,
    gae_advantage,
    gae_advantages_and_returns,
    reinforce_plus_plus_advantage,
)
from grpoflow.algorithms.policy_loss import (
    cispo_loss,
    gspo_loss,
    ppo_clip_loss,
    reinforce_loss,
    truncated_is_weights,
)
from grpoflow.algorithms.mismatch import mismatch_metrics
from grpoflow.algorithms.value_loss import clipped_value_loss
from grpoflow.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    kl_in_reward,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_k3_plus,
    kl_penalty,
)
from grpoflow.algorithms.aggregation import aggregate_loss, masked_mean
from grpoflow.algorithms.shaping import groups_with_signal, overlong_penalty
from grpoflow.algorithms.distill import distill_advantages, topk_forward_kl

__all__ = [
    "Registry",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "KL_ESTIMATORS",
    "KL_CONTROLLERS",
    "LOSS_AGGREGATIONS",
    "register_advantage",
    "register_policy_loss",
    "get_advantage",
    "get_policy_loss",
    "load_from_file",
    "call_with_available",
    "required_inputs",
    "group_mean_std",
    "whiten",
    "grpo_advantage",
    "rloo_advantage",
    "remax_advantage",
    "reinforce_plus_plus_baseline_advantage",
    "grpo_passk_advantage",
    "discounted_returns",
    "gae_advantages_and_returns",
    "reinforce_plus_plus_advantage",
    "gae_advantage",
    "ppo_clip_loss",
    "gspo_loss",
    "cispo_loss",
    "reinforce_loss",
    "truncated_is_weights",
    "mismatch_metrics",
    "clipped_value_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_k3_plus",
    "kl_penalty",
    "kl_in_reward",
    "FixedKLController",
    "AdaptiveKLController",
    "aggregate_loss",
    "masked_mean",
    "overlong_penalty",
    "groups_with_signal",
    "distill_advantages",
    "topk_forward_kl",
]
