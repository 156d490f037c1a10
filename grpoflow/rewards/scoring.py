"""Scoring a batch of completions, counting every failure instead of crashing or stalling the step.

`RewardScorer(fn, error_score=, timeout_s=, workers=)` runs the function in one of three ways:

- in this process, one sample after another (`workers=0`, the default; also what
  `score_completions` does): no overhead, no timeout;
- in `workers` worker processes (grpoflow/user_code.py), each call bounded by `timeout_s`: a call that runs
  longer scores `error_score`, is counted in `reward/timeouts`, and its process is killed and
  replaced, so a hung call costs at most `timeout_s` of the step. The function must be picklable:
  a built-in, a module-level function of an importable module or of a `path/to/file.py`, or a
  `CombinedReward`/`RoutedReward` of such. A lambda or closure cannot be; the scorer then warns
  and scores in this process without a timeout;
- a coroutine function (`async def`) runs in this process: all samples of a batch are awaited
  concurrently in one event loop (at most `workers` at a time if `workers > 0`), each bounded by
  `timeout_s` via `asyncio.wait_for`. A coroutine that blocks (e.g. `time.sleep`) cannot be
  timed out this way.

Every way gives the same `Scores`: results in input order, a failure scored `error_score` and
counted (errors, None returns, timeouts), and one warning per batch with the first failure.

TRL-shaped functions (alone or as parts of a combination or routing) are called once per step with the whole
step's lists, before the per-sample calls, the same way (in this process or in a worker, under `timeout_s`): see
grpoflow/rewards/batched.py. Each call gets its own deep copy of its rows, and its value is made plain (bools, NumPy,
tensors, generators) where it runs: grpoflow/rewards/values.py.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from grpoflow.errors import UserError
from grpoflow.rewards.batched import RewardCalls, Spread, batch_tasks, spread
from grpoflow.rewards.functions import RewardFn, is_async_reward, short_repr, split_value
from grpoflow.rewards.shapes import CONTEXT, SampleContext, takes_context
from grpoflow.rewards.values import plain_score
from grpoflow.plugins import fn_name
from grpoflow.user_code import Outcome, UserCodeProcesses, UserCodeStartError, dumps_function

log = logging.getLogger("grpoflow.reward")
RESERVED = ("prompt", "completion")
Call = tuple[int | None, tuple, dict]  # RewardCalls' arguments: (batched part or None, args, kwargs)


@dataclass
class Scores:
    scores: list[float]
    extras: dict[str, list[float]] = field(default_factory=dict)   # per-key values of dict returns
    errors: int = 0      # the function raised or returned NaN/inf or a non-number
    nones: int = 0       # the function returned None
    timeouts: int = 0    # the call ran longer than the scorer's timeout_s
    parts: list[dict[str, float]] = field(default_factory=list)  # per sample: its dict return's extras ({} if none)
    counts: dict[str, float] = field(default_factory=dict)  # other stages' counts, logged as they are (reward/judge/*)
    first_error: str | None = None  # the first failure's text (a traceback, or what a bad return value was)

    @property
    def failed(self) -> int:
        """Samples the reward function could not score: it raised, returned None or a non-number, or timed out."""
        return self.errors + self.nones + self.timeouts

    def metrics(self) -> dict[str, float]:
        """Failure counts and the means of dict-return extras (the score itself is logged by the caller)."""
        out = {"reward/errors": float(self.errors), "reward/none": float(self.nones),
               "reward/timeouts": float(self.timeouts)}
        for k, vs in self.extras.items():
            out[f"reward/{k}/mean"] = sum(vs) / max(len(vs), 1)
        return {**out, **self.counts}

    def merge(self, other: "Scores") -> "Scores":
        """Scores of both calls, in order, with counts added (several draws of one step)."""
        extras = {k: self.extras.get(k, []) + other.extras.get(k, []) for k in {*self.extras, *other.extras}}
        counts = {k: self.counts.get(k, 0.0) + other.counts.get(k, 0.0) for k in {*self.counts, *other.counts}}
        return Scores(self.scores + other.scores, extras, self.errors + other.errors, self.nones + other.nones,
                      self.timeouts + other.timeouts, self.sample_parts() + other.sample_parts(), counts,
                      self.first_error or other.first_error)

    def sample_parts(self) -> list[dict[str, float]]:
        """One dict of reward parts per sample (empty dicts when the scores were built without them)."""
        return self.parts if len(self.parts) == len(self.scores) else [{} for _ in self.scores]


class RewardScorer:
    """Scores batches with one reward function; see the module docstring for how it runs.

    Args:
        fn: the reward function (contract in functions.py), sync or async.
        error_score: the score of a sample whose call raised, returned None/NaN/a non-number, or timed out.
        timeout_s: per-call limit in seconds (None: no limit). A sync function then runs in worker
            processes (at least one, even with `workers=0`), since only a separate process can be stopped
            mid-call.
        workers: worker processes for a sync function (0: call it in this process); for an async
            one, the most calls in flight (0: no limit).

    Owns its worker processes: call `close()` (or use it as a context manager) when done;
    they are also killed when the scorer is garbage-collected or the interpreter exits.
    """

    def __init__(self, fn: RewardFn, *, error_score: float = 0.0, timeout_s: float | None = None,
                 workers: int = 0):
        if not callable(fn):
            raise TypeError(f"RewardScorer needs a callable reward function, got {fn!r}.")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise UserError(f"reward workers={workers!r} must be an int >= 0 (0 scores in this process).")
        if timeout_s is not None and not timeout_s > 0:
            raise UserError(f"reward timeout_s={timeout_s!r} must be a positive number of seconds, or None.")
        self.is_async = is_async_reward(fn)
        if timeout_s is not None and not self.is_async and workers == 0:
            workers = 1  # a hung call is stopped by killing the process that runs it: the timeout needs one
        self.fn, self.error_score, self.timeout_s, self.workers = fn, float(error_score), timeout_s, workers
        self.calls = RewardCalls(fn)
        self._pool: UserCodeProcesses | None = None
        if self.is_async or workers == 0:
            return
        self._pool = self._start_pool(fn, workers)

    def _start_pool(self, fn: RewardFn, workers: int) -> UserCodeProcesses | None:
        fallback = ("; scoring in this process, with no timeout. Use a built-in or a "
                    "module-level function in a file (reward.function=path/to/file.py:name) to get "
                    "worker processes.")
        try:
            payload = dumps_function(self.calls)
        except Exception as e:  # pickling raises PicklingError, AttributeError or TypeError
            log.warning("reward function %r cannot be sent to worker processes (%s)%s", fn, e, fallback)
            return None
        try:
            return UserCodeProcesses(payload, workers)
        except UserCodeStartError as e:
            log.warning("reward worker processes could not start: %s%s", e, fallback)
            return None

    @property
    def uses_processes(self) -> bool:
        """Whether calls run in worker processes (False: in this process)."""
        return self._pool is not None

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current worker processes (empty in-process); a replaced worker gets a new one."""
        return self._pool.pids if self._pool is not None else []

    def score(self, prompts: list[str], completions: list[str], rows: list[dict],
              contexts: list[SampleContext] | None = None) -> Scores:
        """fn(prompt, completion, **row) for each sample (row keys "prompt"/"completion" are dropped). `contexts`
        (one per sample; default: each row's own prompt only) reach the functions that take them (TRL-shaped
        ones: chat prompts, completion_ids, trainer_state; grpoflow.rewards.shapes)."""
        if not len(prompts) == len(completions) == len(rows):
            raise ValueError(f"score() needs one prompt, completion and row per sample; got {len(prompts)}, "
                             f"{len(completions)} and {len(rows)}.")
        if contexts is None:
            contexts = [SampleContext(row_prompt=row.get("prompt")) for row in rows]
        rows = [{k: v for k, v in row.items() if k not in RESERVED} for row in rows]
        if self.is_async:
            awaited = _run_async(self.fn, [(p, c, row) for p, c, row in zip(prompts, completions, rows)],
                                 self.timeout_s, self.workers)
            return _collect(awaited, self.error_score, self.timeout_s, fn_name(self.fn))
        batched = self._batched(prompts, completions, rows, contexts)
        todo = [i for i, outcome in enumerate(batched.outcomes) if outcome is None]
        context_key = [CONTEXT] if takes_context(self.fn) else []
        calls: list[Call] = [(None, (prompts[i], completions[i]),
                              {**rows[i], **{k: batched.contexts[i] for k in context_key}}) for i in todo]
        decided = batched.outcomes
        for i, outcome in zip(todo, self._run(calls)):
            decided[i] = outcome
        outcomes: list[Outcome] = [o for o in decided if o is not None]  # every sample is decided now
        scored = _collect(outcomes, self.error_score, self.timeout_s, fn_name(self.fn))
        scored.counts.update(batched.metrics)
        for parts, columns in zip(scored.parts, batched.columns):
            parts.update(columns)
        return scored

    def _batched(self, prompts: list[str], completions: list[str], rows: list[dict],
                 contexts: list[SampleContext]) -> Spread:
        """The step's one call per TRL-shaped part (grpoflow.rewards.batched), spread over the samples."""
        tasks = batch_tasks(self.calls, prompts, completions, rows, contexts)
        results = self._run([(task.part, (), task.arguments) for task in tasks]) if tasks else []
        return spread(self.calls, tasks, results, contexts)

    def _run(self, calls: list[Call]) -> list[Outcome]:
        """RewardCalls' outcome for each (part, args, kwargs), in the worker processes or in this process."""
        if self._pool is not None:
            return self._pool.run([(call, {}) for call in calls], self.timeout_s)
        return [_call(self.calls, call) for call in calls]

    def close(self) -> None:
        """Kill the worker processes (if any); the scorer cannot score afterwards."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def score_completions(fn: RewardFn, prompts: list[str], completions: list[str], rows: list[dict],
                      *, error_score: float = 0.0) -> Scores:
    """Call fn(prompt, completion, **row) for each sample in this process; failures score `error_score`
    and are counted. The first failure's traceback is logged once per call so a broken function is visible.
    """
    return RewardScorer(fn, error_score=error_score).score(prompts, completions, rows)


# ---------------------------------------------------------------- running the calls


def _call(calls: RewardCalls, call: Call) -> Outcome:
    try:
        return "ok", calls(*call)
    except (Exception, SystemExit):  # a user function may raise anything, sys.exit too; it is counted and reported
        return "error", traceback.format_exc(limit=-3)  # the innermost frames: the user's


def _run_async(fn: RewardFn, tasks: list, timeout_s: float | None, limit: int) -> list[Outcome]:
    """Await every call in a fresh event loop (in a helper thread if this thread already runs one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_gather(fn, tasks, timeout_s, limit))
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, _gather(fn, tasks, timeout_s, limit)).result()


async def _gather(fn: RewardFn, tasks: list, timeout_s: float | None, limit: int) -> list[Outcome]:
    gate = asyncio.Semaphore(limit) if limit > 0 else None

    async def one(prompt: str, completion: str, kwargs: dict) -> Outcome:
        if gate is None:
            return await _await_call(fn, prompt, completion, kwargs, timeout_s)
        async with gate:
            return await _await_call(fn, prompt, completion, kwargs, timeout_s)

    return list(await asyncio.gather(*(one(*task) for task in tasks)))


async def _await_call(fn: RewardFn, prompt: str, completion: str, kwargs: dict,
                      timeout_s: float | None) -> Outcome:
    try:
        return "ok", plain_score(await asyncio.wait_for(fn(prompt, completion, **copy.deepcopy(kwargs)), timeout_s))
    except asyncio.TimeoutError:
        return "timeout", None
    except (Exception, SystemExit):
        return "error", traceback.format_exc(limit=-3)


def _collect(outcomes: list[Outcome], error_score: float, timeout_s: float | None,
             name: str = "reward function") -> Scores:
    """Scores from per-sample outcomes; one warning for errors and one for timeouts."""
    result = Scores(scores=[])
    first_error: str | None = None
    for kind, info in outcomes:
        score: float | None = None
        extras: dict[str, float] = {}
        if kind == "timeout":
            result.timeouts += 1
        elif kind in ("error", "killed"):  # "killed": a resource limit (none is set for rewards today)
            result.errors += 1
            first_error = first_error or info
        elif info is None:
            result.nones += 1
        else:
            score, extras = split_value(info)
            for k, v in extras.items():
                result.extras.setdefault(k, []).append(v)
            if score is None:
                result.errors += 1
                first_error = first_error or (f"it returned {short_repr(info)}, not a finite number or a dict with "
                                              f"a finite 'score'")
        result.scores.append(error_score if score is None else score)
        result.parts.append(extras)
    result.first_error = first_error if first_error else \
        ("it timed out" if result.timeouts else "it returned None" if result.nones else None)
    if first_error:
        log.warning("reward function %s failed on %d of %d samples (scored reward.error_score=%s, counted in "
                    "reward/errors); first failure:\n%s", name, result.errors, len(outcomes), error_score, first_error)
    if result.timeouts:
        log.warning("reward function timed out on %d of %d samples (over %s s; scored %s); each hung call was "
                    "stopped.", result.timeouts, len(outcomes), timeout_s, error_score)
    return result
