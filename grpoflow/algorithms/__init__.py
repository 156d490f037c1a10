"""Pure tensor algorithms: advantage estimators, policy losses, KL estimators, aggregation.

Torch only: nothing here imports the config, workers or torch.distributed. Importing this
package registers every built-in in its registry.
"""

from grpoflow.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    call_with_available,
    get_advantage,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
    required_inputs,
)
from grpoflow.algorithms.advantages import group_mean_std, grpo_advantage
from grpoflow.algorithms.policy_loss import ppo_clip_loss
from grpoflow.algorithms.kl import kl_k1, kl_k2, kl_k3, kl_penalty
from grpoflow.algorithms.aggregation import aggregate_loss, masked_mean

__all__ = [
    "Registry",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "register_advantage",
    "register_policy_loss",
    "get_advantage",
    "get_policy_loss",
    "call_with_available",
    "required_inputs",
    "group_mean_std",
    "grpo_advantage",
    "ppo_clip_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "aggregate_loss",
    "masked_mean",
]
