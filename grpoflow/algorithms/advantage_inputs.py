"""What a step hands an advantage estimator, by name: the estimator family's contract (`call_with_available` passes
those a signature names; the start-up check refuses an estimator that asks for something no step provides)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from torch import Tensor


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything a step can hand an advantage estimator, by the names estimators use as parameters
    (`call_with_available` passes those a signature names). `values` and `baselines` cost extra work (a
    critic, a greedy rollout), done only when the configured estimator's signature asks for them."""
    scores: Tensor                  # [B] the outcome reward (token-level rewards summed)
    token_level_rewards: Tensor     # [B, R]
    response_mask: Tensor           # [B, R] float, the loss mask
    group_ids: Tensor               # [B]
    values: Optional[Tensor]        # [B, R] critic values
    baselines: Optional[Tensor]     # [B] greedy-response rewards (ReMax)
    norm_adv_by_std: bool
    epsilon: float
    gamma: float
    lam: float
    completions: list               # [B] texts
    rows: list                      # [B] dataset rows

    def kwargs(self) -> dict[str, Any]:
        """The fields by name (shallow: the tensors themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# The names a step provides: what an estimator's signature may ask for (checked at start-up, plan/checks.py).
ADVANTAGE_INPUTS = tuple(f.name for f in dataclasses.fields(AdvantageInputs))
