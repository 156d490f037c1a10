"""Reward functions: the contract, the built-ins, and loading a user's function.

Contract: `fn(prompt: str, completion: str, **row_columns) -> float | dict | None`.
`row_columns` are the dataset row's other columns (e.g. `answer`, `data_source`,
verl's `reward_model` and `extra_info`). A dict must hold a "score"; its other numeric
entries are logged as `reward/<key>/mean`. None means "cannot score" and gets the
configured error score.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable

from grpoflow.plugins import is_file_spec, load_from_file

RewardFn = Callable[..., Any]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Make `fn` selectable as `reward.function=name`."""
    def wrap(fn: RewardFn) -> RewardFn:
        REWARD_FUNCTIONS[name] = fn
        return fn
    return wrap


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
    """The completion's length in characters (the seed article's toy score)."""
    return float(len(completion))


def load_reward_function(spec: str) -> RewardFn:
    """A built-in name, or `path/to/file.py:function`."""
    if is_file_spec(spec):
        fn = load_from_file(spec)
    elif spec in REWARD_FUNCTIONS:
        fn = REWARD_FUNCTIONS[spec]
    else:
        close = difflib.get_close_matches(spec, list(REWARD_FUNCTIONS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"reward.function={spec!r} is neither a built-in ({sorted(REWARD_FUNCTIONS)}) nor "
                         f"`path/to/file.py:function`.{hint}")
    _check_signature(fn, spec)
    return fn


def _check_signature(fn: RewardFn, spec: str) -> None:
    try:
        inspect.signature(fn).bind_partial("prompt", "completion")
    except TypeError as e:
        raise ValueError(f"reward.function={spec}: it must accept (prompt, completion, **row_columns); "
                         f"it cannot take two positional arguments: {e}.") from None
