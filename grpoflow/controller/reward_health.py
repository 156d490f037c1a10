"""A run never trains on nothing while reporting success: the reward's failures and signal, watched step by step.

- A step on which the reward failed on every sample (raised, returned None or a non-number, timed out, or the
  environment's reward failed) stops the run before that step trains, with the first failure, the function as the
  config names it, and, when the failure looks like another framework's calling convention, the fix
  (grpoflow.rewards.shapes.convention_hint); when every failure was a timeout, the time limit instead (a slow
  function is not a wrong-shaped one).
- More than `reward.max_error_share` of the samples of the last `WINDOW` steps failing stops it the same way.
- Every group of each of the first `SIGNAL_STEPS` steps scoring all alike (no group has a reward spread, so every
  advantage is 0 and nothing is learned) gives one WARNING naming what to check.
- Otherwise, a part of reward.functions that scored the same on every sample of each of those steps (it adds
  nothing to any advantage: e.g. a batch-relative TRL function that scores 0 everywhere, while the other parts
  vary) gives one WARNING naming the part.

Checkpoints already written stay: a rerun of the same command after the fix resumes from the last one.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Sequence

from torch import Tensor

from grpoflow.config import RewardConfig
from grpoflow.errors import UserError
from grpoflow.rewards.combine import CombinedReward
from grpoflow.rewards.scoring import RewardScorer, Scores
from grpoflow.rewards.shapes import convention_hint

log = logging.getLogger("grpoflow.reward")
WINDOW = 5
SIGNAL_STEPS = 3


class RewardFailure(UserError):
    """The reward failed on too many samples to train on; the message names the function, the error and the fix."""


class RewardHealth:
    """Watches each step's scores (see the module docstring).

    Args:
        name: the reward as the config names it (e.g. `reward.function=rewards.py:accuracy`).
        hint: first failure text -> a sentence about the calling convention ('' when none applies).
        max_error_share: reward.max_error_share.
        warn: where the no-signal warning goes (the console).
        timeout_s: reward.timeout_s, named when every failure was a timeout.
    """

    def __init__(self, name: str, hint: Callable[[str | None], str], max_error_share: float,
                 warn: Callable[[str], None], total_steps: int = SIGNAL_STEPS, parts: Sequence[str] = (),
                 timeout_s: float | None = None) -> None:
        self.name, self.hint, self.max_error_share, self.warn = name, hint, max_error_share, warn
        self.timeout_s = timeout_s
        self.signal_steps = max(1, min(SIGNAL_STEPS, total_steps))  # a shorter run is judged on all its steps
        self.window: deque[tuple[int, int]] = deque(maxlen=WINDOW)  # (failed, samples) per step
        self.flat_steps = 0  # steps so far on which every group scored all alike
        self.steps = 0
        self.constant_parts: dict[str, float] = {}  # parts alike on every sample of each step so far -> last value
        self.parts = list(parts)  # the reward parts watched (reward.functions' names)

    def check(self, step: int, scored: Scores, scores: Tensor, group_ids: Tensor) -> None:
        """Raise RewardFailure when the reward failed too often; warn once when the first steps had no signal."""
        total = len(scored.scores)
        if total == 0:
            return
        self.window.append((scored.failed, total))
        if scored.failed == total:
            raise RewardFailure(self._message(step, f"failed on all {total} samples of step {step}", scored))
        failed, samples = (sum(col) for col in zip(*self.window))
        if len(self.window) == WINDOW and failed > self.max_error_share * samples:
            raise RewardFailure(self._message(
                step, f"failed on {failed} of the {samples} samples of steps {step - WINDOW + 1}-{step}, more than "
                      f"reward.max_error_share={self.max_error_share:g}", scored))
        self.steps += 1
        self.flat_steps += int(all_groups_flat(scores, group_ids))
        if self.steps <= self.signal_steps:
            alike = constant_parts(scored.sample_parts(), self.parts)
            self.constant_parts = alike if self.steps == 1 else {k: v for k, v in alike.items()
                                                                 if k in self.constant_parts}
        if self.steps == self.signal_steps and self.flat_steps < self.signal_steps and self.constant_parts:
            named = ", ".join(f"{k} (last {v:.3g})" for k, v in self.constant_parts.items())
            self.warn(f"in each of the first {self.signal_steps} step(s) the reward part(s) {named} of {self.name} "
                      f"scored the same on every sample, so they added nothing to any advantage. Check that each can "
                      f"score this model's answers (train_samples.jsonl's reward_parts); a TRL-shaped function is "
                      f"called with the whole step's lists, as TRL calls it.")
        if self.steps == self.signal_steps and self.flat_steps == self.signal_steps:
            per_group = len(scores) // max(1, n_groups(group_ids))
            self.warn(f"in each of the first {self.signal_steps} step(s) every group's {per_group} samples scored "
                      f"alike (mean score {float(scores.mean()):.3g}), so every advantage was 0 and "
                      f"nothing was learned. Check that {self.name} can score this model's answers: read "
                      f"train_samples.jsonl (or `grpoflow view`), the ground-truth column, rollout.max_new_tokens "
                      f"(answers cut off?) and, with reward.function=auto, which scorer the rows' data_source "
                      f"picks.")

    def _message(self, step: int, what: str, scored: Scores) -> str:
        first = (scored.first_error or "no failure text").strip()
        if scored.timeouts and scored.timeouts == scored.failed:  # slow, not wrong-shaped: no convention hint
            limit = f"reward.timeout_s={self.timeout_s:g} s" if self.timeout_s is not None else "its time limit"
            hint = (f" Every failure was a timeout: each call ran past {limit} and was stopped; make the function "
                    "faster, or raise reward.timeout_s.")
        else:
            hint = self.hint(scored.first_error)
        return (f"Stopped before training step {step}: the reward {self.name} {what}; nothing would be learned."
                f"{hint} Checkpoints written so far are kept; fix the function and run the "
                f"same command to resume. The first failure:\n{first}")


def constant_parts(parts: list[dict[str, float]], names: Sequence[str]) -> dict[str, float]:
    """Of `names`, the parts that every sample has with one value (name -> that value)."""
    out = {}
    for name in names:
        values = {p.get(name) for p in parts}
        if len(values) == 1 and None not in values:
            out[name] = float(values.pop())  # type: ignore[arg-type]
    return out


def n_groups(group_ids: Tensor) -> int:
    return int(group_ids.unique().numel())


def all_groups_flat(scores: Tensor, group_ids: Tensor) -> bool:
    """[B] scores, [B] group ids -> whether every group's scores are all equal."""
    for g in group_ids.unique():
        s = scores[group_ids == g]
        if bool((s != s[0]).any()):
            return False
    return True


def reward_health(cfg: RewardConfig, scorer: RewardScorer | None, warn: Callable[[str], None],
                  total_steps: int) -> RewardHealth:
    """The run's watcher, naming the reward as the config does."""
    spec = cfg.functions or cfg.function
    name = f"reward.functions={list(spec)}" if isinstance(spec, list) else f"reward.function={spec}" if spec else \
        "(the environment's or reward model's)"

    def hint(first_error: str | None) -> str:
        return convention_hint(scorer.fn, first_error) if scorer is not None else ""

    parts = [n for n, _ in scorer.fn.functions] if scorer is not None and isinstance(scorer.fn, CombinedReward) else []
    return RewardHealth(name, hint, cfg.max_error_share, warn, total_steps, parts, timeout_s=cfg.timeout_s)
