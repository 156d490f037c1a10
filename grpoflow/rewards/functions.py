"""Reward functions: the contract, the built-ins, and loading a user's function.

Contract: `fn(prompt: str, completion: str, **row_columns) -> float | dict | None`.
`row_columns` are the dataset row's other columns (e.g. `answer`, `data_source`,
verl's `reward_model` and `extra_info`). A dict must hold a "score"; its other numeric
entries are logged as `reward/<key>/mean`. None means "cannot score" and gets the
configured error score.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

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
    if ":" in spec and spec.split(":", 1)[0].endswith(".py"):
        path_text, name = spec.rsplit(":", 1)
        path = Path(path_text)
        if not path.exists():
            raise FileNotFoundError(f"reward.function={spec}: file {path} does not exist.")
        module_name = f"grpoflow_user_reward_{path.stem}"
        spec_obj = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[module_name] = module
        spec_obj.loader.exec_module(module)
        fn = getattr(module, name, None)
        if not callable(fn):
            names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            raise ValueError(f"reward.function={spec}: {path} has no function {name!r}; it defines {names}.")
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
