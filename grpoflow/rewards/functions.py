"""Reward functions: the contract, the registry, and loading a user's function.

Contract: `fn(prompt: str, completion: str, **row_columns) -> float | dict | None`.
`row_columns` are the dataset row's other columns (e.g. `answer`, `data_source`,
verl's `reward_model` and `extra_info`). A dict must hold a "score"; its other numeric
entries are logged as `reward/<key>/mean`. None means "cannot score" and gets the
configured error score. A coroutine function (`async def`) is accepted too; the scorer
awaits it (scoring.py).

The built-ins live next to this file (answers.py, countdown.py, form.py) and register
themselves when `grpoflow.rewards` is imported, which happens before this module runs.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

from grpoflow.errors import UserError
from grpoflow.plugins import Registry, is_file_spec
from grpoflow.rewards.shapes import adapt

RewardFn = Callable[..., Any]
REWARD_FUNCTIONS = Registry("reward function")


def register_reward(name: str, *, override: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Make `fn` selectable as `reward.function=name` (a taken name is an error unless `override`)."""
    return REWARD_FUNCTIONS.register(name, override=override)


def ground_truth_of(row: dict) -> str | None:
    """The reference answer of a row: verl's reward_model.ground_truth, else `ground_truth`, else `answer`."""
    rm = row.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        return str(rm["ground_truth"])
    for key in ("ground_truth", "answer", "solution"):
        if row.get(key) is not None:
            return str(row[key])
    return None


@register_reward("exact_match")
def exact_match(prompt: str, completion: str, **row: Any) -> float | None:
    """1.0 if the completion (stripped) equals the row's ground truth, else 0.0; None without one."""
    truth = ground_truth_of(row)
    if truth is None:
        return None
    return float(completion.strip() == truth.strip())


@register_reward("length")
def length(prompt: str, completion: str, **row: Any) -> float:
    """The completion's length in characters (a toy score: a policy that learns writes longer answers)."""
    return float(len(completion))


def split_value(value: Any) -> tuple[float | None, dict[str, float]]:
    """(score, numeric extras) of a non-None return value; score is None if it is not a finite number.

    A dict gives its "score" and its other int/float entries; a bool is not a number. An integer too large
    for a float (10**400), as the score or an entry, makes the whole value bad (score None).
    """
    extras: dict[str, float] = {}
    try:
        if isinstance(value, dict):
            extras = {str(k): float(v) for k, v in value.items()
                      if k != "score" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            value = value.get("score")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, extras
        value = float(value)
    except OverflowError:
        return None, {}
    return (value if math.isfinite(value) else None), extras


def short_repr(value: Any, limit: int = 120) -> str:
    """repr(value) cut to `limit` characters, for messages; never raises (huge ints, broken __repr__)."""
    try:
        text = repr(value)
    except Exception as e:  # ValueError for ints over sys.get_int_max_str_digits(), or a user __repr__ that raises
        text = f"<a {type(value).__name__} whose repr fails: {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def is_async_reward(fn: Any) -> bool:
    """Whether calling `fn` gives a coroutine: an `async def` function, or an object with `async def __call__`."""
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(fn.__call__))


def load_reward_function(spec: str, style: str = "auto") -> RewardFn:
    """A built-in name, or `path/to/file.py:function` in any shape (grpoflow.rewards.shapes: `style` auto reads it
    off the signature), as a grpoflow reward function."""
    fn = REWARD_FUNCTIONS.resolve_key("reward.function", spec, " A user function is named `path/to/file.py:function`.")
    if not is_file_spec(spec):
        return fn  # built-ins are grpoflow-shaped
    adapted = adapt(fn, style)
    if adapted is fn:
        _check_signature(fn, spec)
    return adapted


def _check_signature(fn: RewardFn, spec: str) -> None:
    try:
        inspect.signature(fn).bind_partial("prompt", "completion")
    except TypeError as e:
        raise UserError(f"reward.function={spec}: it must accept (prompt, completion, **row_columns), or be written "
                        f"in TRL's shape (prompts, completions, **columns) or verl's (data_source, solution_str, "
                        f"ground_truth, extra_info), with those parameter names or reward.style=trl|verl; it cannot "
                        f"take two positional arguments: {e}.") from None
