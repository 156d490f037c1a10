"""Several reward functions as one: a weighted sum, and routing by the row's `data_source`.

Both results are reward functions themselves (same contract), so the scorer treats them like
any other, and they pickle (for the scorer's worker processes) when their parts do.

A sample is scored only if every part scores it: a part that returns None makes the whole
sample None (it gets the error score and is counted in `reward/none`), and a part that raises
or returns a non-number makes the whole sample an error (`reward/errors`, with the part's name
in the logged message). A partial sum would silently change the scale of the reward.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from grpoflow.errors import UserError
from grpoflow.plugins import is_file_spec
from grpoflow.rewards.functions import RewardFn, is_async_reward, load_reward_function, short_repr, split_value
from grpoflow.rewards.shapes import CONTEXT, STYLES, TRLReward, takes_context
from grpoflow.rewards.values import call_reward


def _call_part(fn: RewardFn, prompt: str, completion: str, row: dict, context: Any) -> Any:
    """A part's value, made plain, from its own copy of the row; the sample's context goes only to a part that
    takes it (an adapted TRL/verl function)."""
    if context is not None and takes_context(fn):
        return call_reward(fn, prompt, completion, {**row, CONTEXT: context})
    return call_reward(fn, prompt, completion, row)


def _score_of(name: str, value: Any) -> tuple[float, dict[str, float]]:
    score, extras = split_value(value)
    if score is None:
        raise UserError(f"reward part {name!r} returned {short_repr(value)}, not a finite number or a dict with a "
                        f"numeric 'score'.")
    return score, extras


class CombinedReward:
    """score = sum_i weights[i] * functions[i](...), returned as a dict that also holds each part:

        {"score": total, "<name>": part score, "<name>/<key>": a part's own extras, ...}

    so each part is logged as `reward/<name>/mean`.
    """

    def __init__(self, functions: Sequence[tuple[str, RewardFn]], weights: Sequence[float] | None = None):
        functions = list(functions)
        if not functions:
            raise UserError("CombinedReward needs at least one (name, function) pair.")
        names = [name for name, _ in functions]
        if len(set(names)) != len(names) or "score" in names:
            raise UserError(f"CombinedReward: names {names} must be unique and not 'score' (they are log keys).")
        for name, fn in functions:
            if not callable(fn) or is_async_reward(fn):
                raise UserError(f"CombinedReward: part {name!r} must be a plain (not async) function "
                                f"fn(prompt, completion, **row); got {fn!r}.")
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(functions) or not all(math.isfinite(w) for w in weights):
            raise UserError(f"CombinedReward: weights {weights} must be {len(functions)} finite numbers, "
                            f"one per function {names}.")
        self.functions, self.weights = functions, weights
        self.takes_context = any(takes_context(fn) for _, fn in functions)

    def __call__(self, prompt: str, completion: str, **row: Any) -> dict[str, float] | None:
        parts: dict[str, float] = {}
        total = 0.0
        context = row.pop(CONTEXT, None)
        for (name, fn), weight in zip(self.functions, self.weights):
            value = _call_part(fn, prompt, completion, row, context)
            if value is None:
                return None
            score, extras = _score_of(name, value)
            parts[name] = score
            parts.update({f"{name}/{k}": v for k, v in extras.items()})
            total += weight * score
        return {"score": total, **parts}

    def __repr__(self) -> str:
        return f"CombinedReward({[n for n, _ in self.functions]}, weights={self.weights})"


class RoutedReward:
    """Scores a sample with `routes[row["data_source"]]`, or with `default` for other sources.

    Returns {"score": s, "<route>/score": s, "<route>/<key>": the route's extras, "route": name},
    where the route's name is its data_source ("default" for the fallback), so each source's mean
    reward is logged as `reward/<data_source>/score/mean`. ("route" is text, so it is not logged.)
    """

    def __init__(self, default: RewardFn, routes: dict[str, RewardFn], default_name: str = "default"):
        self.default, self.routes, self.default_name = default, dict(routes), default_name
        self.takes_context = any(takes_context(fn) for fn in [default, *self.routes.values()])

    def route_of(self, row: dict) -> tuple[str, RewardFn]:
        """(route name, function) of a row: its data_source's, else the default."""
        source = row.get("data_source")
        if isinstance(source, str) and source in self.routes:
            return source, self.routes[source]
        return self.default_name, self.default

    def __call__(self, prompt: str, completion: str, **row: Any) -> dict[str, Any] | None:
        context = row.pop(CONTEXT, None)
        name, fn = self.route_of(row)
        value = _call_part(fn, prompt, completion, row, context)
        if value is None:
            return None
        score, extras = _score_of(name, value)
        return {"score": score, f"{name}/score": score, **{f"{name}/{k}": v for k, v in extras.items()},
                "route": name}

    def __repr__(self) -> str:
        return f"RoutedReward(default={self.default!r}, routes={self.routes!r})"


def batched_parts(fn: RewardFn) -> list[TRLReward]:
    """The TRL-shaped functions in `fn` (itself, a combination's parts, a routing's routes), in a fixed order: each
    is called once per step with the step's lists (grpoflow.rewards.scoring)."""
    if isinstance(fn, TRLReward):
        return [fn]
    if isinstance(fn, CombinedReward):
        return [p for _, part in fn.functions for p in batched_parts(part)]
    if isinstance(fn, RoutedReward):
        return [p for part in (fn.default, *fn.routes.values()) for p in batched_parts(part)]
    return []


def batched_samples(fn: RewardFn, rows: Sequence[dict], samples: list[int]) -> list[tuple[TRLReward, list[int]]]:
    """Each TRL-shaped function in `fn` with the samples (positions in `rows`, of `samples`) it scores: all of
    them, or in a routing the samples its route takes."""
    if isinstance(fn, TRLReward):
        return [(fn, samples)] if samples else []
    if isinstance(fn, CombinedReward):
        return [pair for _, part in fn.functions for pair in batched_samples(part, rows, samples)]
    if isinstance(fn, RoutedReward):
        taken = {i: fn.route_of(rows[i])[1] for i in samples}
        return [pair for part in (fn.default, *fn.routes.values())
                for pair in batched_samples(part, rows, [i for i in samples if taken[i] is part])]
    return []


def build_reward(spec: str | Sequence[str], weights: Sequence[float] | None = None,
                 routes: dict[str, str | Sequence[str]] | None = None,
                 style: str | Sequence[str] = "auto") -> RewardFn:
    """The reward function that a config names.

    spec: a built-in name or `path/to/file.py:function`, or a list of them (a `CombinedReward`,
        each part named by its built-in name or its function's name).
    weights: one per spec (default 1.0 each); with a single spec and weights, a `CombinedReward`
        of one part.
    routes: data_source -> spec (or list of specs, equally weighted) for samples of that source;
        other samples use `spec`. The result is a `RoutedReward`.
    style: the shape of user functions (grpoflow.rewards.shapes): auto (from each one's signature), grpoflow,
        trl or verl; built-ins are grpoflow's. A list gives one per spec (as weights does); routes then read
        their functions' shapes off their signatures.
    """
    fn = _build_one(spec, weights, style)
    if not routes:
        return fn
    route_style = style if isinstance(style, str) else "auto"
    return RoutedReward(fn, {source: _build_one(s, None, route_style) for source, s in routes.items()})


def _styles(style: str | Sequence[str], specs: list[str]) -> list[str]:
    """One style per spec: `style` for all, or its entries one by one."""
    styles = [style] * len(specs) if isinstance(style, str) else list(style)
    if len(styles) != len(specs):
        raise UserError(f"reward.style={list(style)} has {len(styles)} entries for {len(specs)} reward function(s) "
                        f"{specs}; give one style per function, or one style for all.")
    for s in styles:
        if s not in STYLES:
            raise UserError(f"reward.style={s!r}; use one of {list(STYLES)} (or a list of them, one per function).")
    return styles


def _build_one(spec: str | Sequence[str], weights: Sequence[float] | None, style: str | Sequence[str]) -> RewardFn:
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs or not all(isinstance(s, str) for s in specs):
        raise UserError(f"reward spec {spec!r} must be a name or `file.py:function`, or a non-empty list of them.")
    styles = _styles(style, specs)
    if len(specs) == 1 and weights is None:
        return load_reward_function(specs[0], styles[0])
    names: list[str] = []
    for s in specs:
        base = s.rsplit(":", 1)[1] if is_file_spec(s) else s
        name, i = base, 2
        while name in names:
            name, i = f"{base}_{i}", i + 1
        names.append(name)
    return CombinedReward([(n, load_reward_function(s, st)) for n, s, st in zip(names, specs, styles)], weights)
