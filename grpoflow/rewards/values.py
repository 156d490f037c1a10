"""What a reward function is handed and what it gives back, each made a plain value in one place.

In: every call gets its own deep copy of the row (and, for TRL's batched shape, of the step's columns), so a
function that changes what it was handed (appends to a list column, counts in a dict in `extra_info`) changes
nothing that the next call, the next sample of the group, the next step or the logged rows see.

Out: what TRL and verl accept is accepted here, made plain once, before anything else reads it (in this process
and in a reward worker process, before the value is sent back as JSON):

    bool                                          -> 0.0 / 1.0
    NumPy scalar, 0-d or one-element array/tensor -> float (int for integer dtypes, as .tolist() gives)
    a dict                                        -> the same dict with each entry made plain
    (batched shape) list, tuple, NumPy array, tensor, generator or other iterator -> a list of plain values

NumPy and torch are recognised only when the function's own process has imported them (a value of theirs cannot
exist otherwise), so reward scoring itself never imports them.
"""

from __future__ import annotations

import copy
import numbers
import sys
from collections.abc import Iterator
from typing import Any, Callable


def _array_types() -> tuple[type, ...]:
    """NumPy's arrays and scalars and torch's tensors, as far as this process has imported them."""
    found: list[type] = []
    np = sys.modules.get("numpy")
    if np is not None:
        found += [np.ndarray, np.generic]
    torch = sys.modules.get("torch")
    if torch is not None:
        found.append(torch.Tensor)
    return tuple(found)


def plain_score(value: Any) -> Any:
    """A per-sample return value made plain (module docstring); anything else is returned unchanged, for the caller
    to report."""
    if isinstance(value, dict):
        return {k: plain_score(v) for k, v in value.items()}
    if isinstance(value, bool):
        return float(value)
    arrays = _array_types()
    if arrays and isinstance(value, arrays):
        items = value.tolist()  # type: ignore[attr-defined]  # ndarray, generic and Tensor all have it
        if isinstance(items, list):  # an array: one element is a score, more are not
            if len(items) != 1 or isinstance(items[0], list):
                return value
            items = items[0]
        return float(items) if isinstance(items, bool) else items
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)):  # e.g. fractions.Fraction
        return float(value)
    return value


def plain_scores(values: Any) -> Any:
    """A batched return value (one score per completion) as a list of plain values; a value that is no sequence
    (a float, a string, a dict) is returned unchanged, for the caller to report."""
    arrays = _array_types()
    if arrays and isinstance(values, arrays):
        items = values.tolist()  # type: ignore[attr-defined]
        values = items if isinstance(items, list) else values
    elif isinstance(values, Iterator):
        values = list(values)
    if isinstance(values, (list, tuple)):
        return [plain_score(v) for v in values]
    return values


def call_reward(fn: Callable[..., Any], prompt: str, completion: str, row: dict) -> Any:
    """fn(prompt, completion, **row) on a deep copy of `row`, its value made plain."""
    return plain_score(fn(prompt, completion, **copy.deepcopy(row)))
