"""Scoring a batch of completions, counting every failure instead of crashing the step."""

from __future__ import annotations

import logging
import math
import traceback
from dataclasses import dataclass, field
from typing import Any

from grpoflow.rewards.functions import RewardFn

log = logging.getLogger("grpoflow.reward")
RESERVED = ("prompt", "completion")


@dataclass
class Scores:
    scores: list[float]
    extras: dict[str, list[float]] = field(default_factory=dict)   # per-key values of dict returns
    errors: int = 0      # the function raised or returned NaN/inf or a non-number
    nones: int = 0       # the function returned None

    def metrics(self) -> dict[str, float]:
        """Failure counts and the means of dict-return extras (the score itself is logged by the caller)."""
        out = {"reward/errors": float(self.errors), "reward/none": float(self.nones)}
        for k, vs in self.extras.items():
            out[f"reward/{k}/mean"] = sum(vs) / max(len(vs), 1)
        return out

    def merge(self, other: "Scores") -> "Scores":
        """Scores of both calls, in order, with counts added (several draws of one step)."""
        extras = {k: self.extras.get(k, []) + other.extras.get(k, []) for k in {*self.extras, *other.extras}}
        return Scores(self.scores + other.scores, extras, self.errors + other.errors, self.nones + other.nones)


def score_completions(fn: RewardFn, prompts: list[str], completions: list[str], rows: list[dict],
                      *, error_score: float = 0.0) -> Scores:
    """Call fn(prompt, completion, **row) for each sample; failures score `error_score` and are counted.

    The first failure's traceback is logged once per call so a broken function is visible.
    """
    result = Scores(scores=[])
    first_error: str | None = None
    for prompt, completion, row in zip(prompts, completions, rows):
        kwargs = {k: v for k, v in row.items() if k not in RESERVED}
        try:
            value = fn(prompt, completion, **kwargs)
            score = _to_score(value, result.extras)
        except Exception:  # a user function may raise anything; it is counted and reported
            score = None
            result.errors += 1
            first_error = first_error or traceback.format_exc(limit=3)
        else:
            if value is None:
                result.nones += 1
            elif score is None:
                result.errors += 1
                first_error = first_error or f"it returned {value!r}, not a finite number or a dict with 'score'"
        result.scores.append(error_score if score is None else score)
    if first_error:
        log.warning("reward function failed on %d of %d samples (scored %s); first failure:\n%s",
                    result.errors, len(prompts), error_score, first_error)
    return result


def _to_score(value: Any, extras: dict[str, list[float]]) -> float | None:
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "score" and isinstance(v, (int, float)) and not isinstance(v, bool):
                extras.setdefault(k, []).append(float(v))
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
