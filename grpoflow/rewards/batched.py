"""The calls a reward makes in a step: one per sample, and one per step for each TRL-shaped part.

`RewardCalls(fn)` is the one callable that runs them, in this process or pickled into a reward worker process
(grpoflow/user_code.py), so both make the same copies of what they hand the function and the same plain values
of what it returns (grpoflow.rewards.values):

    calls(None, (prompt, completion), row)  fn's value for one sample
    calls(k, (), arguments)                 the k-th TRL-shaped part's value for its samples (TRLReward.call_batch)

`batch_tasks` builds a step's batched calls (which part scores which samples: grpoflow.rewards.combine's
`batched_samples`), and `spread` hands their results to the samples: a batched call that failed (raised, timed
out, returned no list of the right length) fails every sample it covered; a None or a non-number in its list
fails that sample (None counted as reward/none); every other sample reads its score from its context
(`SampleContext.batch_scores`) when its per-sample call runs, or takes it directly when the reward is that one
TRL-shaped function.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from grpoflow.rewards.combine import batched_parts, batched_samples
from grpoflow.rewards.functions import RewardFn
from grpoflow.rewards.shapes import SampleContext, TRLReward
from grpoflow.rewards.values import call_reward

log = logging.getLogger("grpoflow.reward")
_said: set[tuple[str, str]] = set()  # (function, log_extra column) already warned about, once per process
Outcome = tuple  # ("ok", value) | ("error", text) | ("timeout", None) | ("killed", why), as grpoflow.user_code's


class RewardCalls:
    """The callable that runs a reward's calls (module docstring); picklable when `fn` is."""

    def __init__(self, fn: RewardFn) -> None:
        self.fn = fn
        self.parts = batched_parts(fn)

    def __call__(self, part: int | None, args: tuple, kwargs: dict) -> Any:
        if part is None:
            prompt, completion = args
            return call_reward(self.fn, prompt, completion, kwargs)
        return self.parts[part].call_batch(kwargs)


@dataclass
class BatchTask:
    part: int               # index into RewardCalls.parts
    samples: list[int]      # the step's samples it scores, in order
    arguments: dict         # TRL's keyword arguments for them


@dataclass
class Spread:
    """What a step's batched calls decided, per sample."""
    outcomes: list[Outcome | None]            # a failure or None decided by a batched call; None: not decided
    contexts: list[SampleContext]             # each sample's context, with its batched scores
    metrics: dict[str, float] = field(default_factory=dict)       # log_metric's values, as reward/<name>
    columns: list[dict[str, float]] = field(default_factory=list)  # per sample: log_extra's numeric columns


def batch_tasks(calls: RewardCalls, prompts: list[str], completions: list[str], rows: list[dict],
                contexts: list[SampleContext]) -> list[BatchTask]:
    """One task per TRL-shaped part (per route it sits in) that scores any of the step's samples."""
    tasks = []
    for part, samples in batched_samples(calls.fn, rows, list(range(len(rows)))):
        arguments = part.arguments([prompts[i] for i in samples], [completions[i] for i in samples],
                                   [rows[i] for i in samples], [contexts[i] for i in samples])
        tasks.append(BatchTask(next(k for k, p in enumerate(calls.parts) if p is part), samples, arguments))
    return tasks


def spread(calls: RewardCalls, tasks: list[BatchTask], results: list[Outcome],
           contexts: list[SampleContext]) -> Spread:
    """Each sample's share of the batched calls' `results` (one per task; module docstring)."""
    n = len(contexts)
    outcomes: list[Outcome | None] = [None] * n
    scores: list[dict[int, float]] = [dict(c.batch_scores) for c in contexts]
    columns: list[dict[str, float]] = [{} for _ in range(n)]
    metrics: dict[str, list[float]] = {}
    for task, (kind, info) in zip(tasks, results):
        part: TRLReward = calls.parts[task.part]
        if kind != "ok":
            for i in task.samples:
                outcomes[i] = outcomes[i] or (kind, info)
            continue
        for name, value in info["metrics"].items():
            metrics.setdefault(f"reward/{name}", []).append(value)
        for column in info["unkept"]:
            if (part.__name__, column) not in _said:
                _said.add((part.__name__, column))
                log.warning("%s passed log_extra(%r, ...) values that are not one number per completion; "
                            "train_samples.jsonl keeps numeric columns only (in reward_parts), so it is not kept.",
                            part.__name__, column)
        for j, i in enumerate(task.samples):
            value = info["scores"][j]
            if str(j) in info["bad"]:
                outcomes[i] = outcomes[i] or ("error", f"{part.__name__} returned {info['bad'][str(j)]} for this "
                                                       f"completion, not a number or None")
            elif value is None:
                outcomes[i] = outcomes[i] or ("ok", None)
            else:
                scores[i][part.key] = value
                columns[i].update({k: v[j] for k, v in info["columns"].items()})
    if isinstance(calls.fn, TRLReward):  # the reward is that one function: its scores are the samples' values
        outcomes = [o or ("ok", s[calls.fn.key]) for o, s in zip(outcomes, scores)]
    return Spread(outcomes, [replace(c, batch_scores=s) for c, s in zip(contexts, scores)],
                  {k: sum(v) / len(v) for k, v in metrics.items()}, columns)
