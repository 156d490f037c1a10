"""Reward functions in the three shapes users bring, each run unchanged behind grpoflow's per-sample contract.

    grpoflow  fn(prompt, completion, **row) -> float | dict | None                 (one sample per call)
    TRL       fn(prompts, completions, **columns) -> list[float | None]            (lists; TRL's GRPOTrainer)
    verl      compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw) -> float | dict

`detect_style(fn)` reads the shape off the signature (`reward.style=auto`; `reward.style` may also be given per
function of reward.functions): verl's by `solution_str` (or `data_source` with `ground_truth`), TRL's by any of
`completions`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric`, or `prompts` first; a callable object
is read by its `__call__`. `adapt(fn, style)` wraps a TRL or verl function as a grpoflow one, so that combinations
(reward.functions, reward.routes), worker processes and timeouts treat every shape alike.

TRL: as TRL's GRPOTrainer does, a TRL-shaped function is called once per step with the whole step's lists (the
scorer runs `TRLReward.call_batch`; in reward worker processes too, with reward.timeout_s bounding that one call),
so a batch-relative reward (`1 - len / max(len)`) means what it means in TRL; within reward.routes, once per route
with the samples of its data sources. `prompts` and `completions` are lists (conversational rows, whose prompt is
chat messages, get `completions=[[{"role": "assistant", "content": ...}]]`), every other column a list with one
entry per sample (None where a row lacks it), `completion_ids`, `trainer_state` (global_step, max_steps),
`log_metric(name, value)` (logged as reward/<name>, the mean of the step's calls) and `log_extra(column, values)`
(numeric columns join each sample's reward parts in train_samples.jsonl). `async def` TRL functions are awaited.
Each sample then reads its own score from the batch's (`SampleContext.batch_scores`), also inside combinations.
verl: keyword arguments, as verl's reward manager calls them, one sample per call: `ground_truth` is the row's
`reward_model.ground_truth` (or `ground_truth`/`answer`), `extra_info` the row's `extra_info`.

What every shape returns is made plain once (grpoflow.rewards.values: bools, NumPy scalars and arrays, tensors,
generators), and every call gets its own deep copy of the rows it reads.

`convention_hint` is the sentence a failed run prints when a function's failures look like a shape mismatch.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.errors import UserError
from grpoflow.rewards.values import plain_score, plain_scores

STYLES = ("auto", "grpoflow", "trl", "verl")
# The keyword under which the scorer hands a sample's context (`SampleContext`) to the functions that take it
# (`takes_context`): the adapters here and the combinations of reward.functions / reward.routes.
CONTEXT = "__grpoflow_sample_context__"
# Parameter names that only TRL hands a reward function: any of them (or `prompts` first) marks the TRL shape.
TRL_NAMES = ("completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
_KEYS = itertools.count()

SHAPES = {
    "grpoflow": "grpoflow's per-sample shape fn(prompt, completion, **row) -> float | dict | None",
    "trl": "TRL's batched shape fn(prompts, completions, **columns) -> list[float | None]",
    "verl": "verl's compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict",
}


@dataclass(frozen=True)
class TrainerState:
    """What TRL's `trainer_state` argument offers a reward function, as far as a grpoflow run has it."""
    global_step: int = 0
    max_steps: int = 0


@dataclass(frozen=True)
class SampleContext:
    """A sample's context beyond its row: the row's own prompt (text or chat messages, before any template), the
    response's token ids, the trainer's state, and what the step's batched (TRL-shaped) calls gave this sample, by
    the function's `TRLReward.key`."""
    row_prompt: Any = None
    completion_ids: list = field(default_factory=list)
    trainer_state: TrainerState = field(default_factory=TrainerState)
    batch_scores: dict = field(default_factory=dict)


def takes_context(fn: Callable) -> bool:
    """Whether the scorer passes `fn` the sample's context (as keyword CONTEXT): declared by the adapters here
    and by the combinations (grpoflow.rewards.combine), whose parts may be adapters."""
    return bool(getattr(fn, "takes_context", False))  # declared: a class attribute, or the combination's own


def _names(fn: Callable) -> list[str]:
    """The named parameters of a function, or of a callable object's `__call__` (without `self`: inspect reads it)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def detect_style(fn: Callable) -> str:
    """grpoflow, trl or verl, from the parameter names (a callable object's: its `__call__`'s); a signature that
    names none of them is grpoflow's (e.g. `fn(*args, **kwargs)`: give reward.style when it is another shape)."""
    names = _names(fn)
    if "solution_str" in names or ("data_source" in names and "ground_truth" in names):
        return "verl"
    if any(name in names for name in TRL_NAMES) or names[:1] == ["prompts"]:
        return "trl"
    return "grpoflow"


def adapt(fn: Callable, style: str = "auto") -> Callable:
    """`fn` as a grpoflow reward function; style auto reads the shape off the signature."""
    if style not in STYLES:
        raise UserError(f"reward.style={style!r}; use one of {list(STYLES)}.")
    style = detect_style(fn) if style == "auto" else style
    if style == "trl":
        return TRLReward(fn)
    if style == "verl":
        return VerlReward(fn)
    return fn


def style_of(fn: Callable) -> str:
    """The shape an adapted function was written in."""
    return fn.style if isinstance(fn, (TRLReward, VerlReward)) else "grpoflow"


class TRLReward:
    """A TRL reward function: called once per step with the step's lists (`call_batch`, run by the scorer, in a
    reward worker process too), each sample then reading its own score from its context (`batch_scores`, by
    `key`); called alone (outside a scorer) it scores a batch of one. See the module docstring."""
    style = "trl"
    takes_context = True  # TRL hands the row's chat messages (not rendered text), completion_ids, trainer_state

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.key = next(_KEYS)  # which of a step's batched calls is this one's (kept when pickled to a worker)

    def arguments(self, prompts: list[str], completions: list[str], rows: list[dict],
                  contexts: list[SampleContext]) -> dict:
        """TRL's keyword arguments for these samples: every column as a list (None where a row lacks it),
        `prompts` (chat rows: their messages), `completions` (chat rows: a list of one assistant message),
        `completion_ids`, `trainer_state` (the step's). Each sample's values are its own deep copies (the samples
        of a group share one row; in TRL each has its own)."""
        rows = [copy.deepcopy({k: v for k, v in row.items() if k != CONTEXT}) for row in rows]
        names = list(dict.fromkeys(k for row in rows for k in row))
        columns = {k: [row.get(k) for row in rows] for k in names}
        chat = [isinstance(c.row_prompt, list) for c in contexts]
        return {**columns, "prompts": [copy.deepcopy(c.row_prompt) if is_chat else p
                                       for p, c, is_chat in zip(prompts, contexts, chat)],
                "completions": [[{"role": "assistant", "content": t}] if is_chat else t
                                for t, is_chat in zip(completions, chat)],
                "completion_ids": [list(c.completion_ids) for c in contexts],
                "trainer_state": contexts[0].trainer_state if contexts else TrainerState()}

    def call_batch(self, arguments: dict) -> dict:
        """One call over a batch (`arguments`: from `arguments`, this call's own), as plain JSON data:
        {"scores": one value per completion (None where it gave None or no number, which `bad` then describes by
        position), "bad": {position: repr}, "metrics": log_metric's values (means), "columns": log_extra's columns
        (numbers only), "unkept": the names of its other columns}. TypeError (naming TRL's convention) when it
        returned no list of the right length."""
        n = len(arguments["completions"])
        metrics: dict[str, list[float]] = {}
        columns: dict[str, list] = {}

        def log_metric(name: str, value: Any) -> None:
            metrics.setdefault(str(name), []).append(float(plain_score(value)))

        def log_extra(column: str, values: Any) -> None:
            columns[str(column)] = plain_scores(values)

        value = self.fn(**arguments, log_extra=log_extra, log_metric=log_metric)
        if inspect.isawaitable(value):
            value = run_coroutine(value)
        values = plain_scores(value)
        if not isinstance(values, list) or len(values) != n:
            raise TypeError(f"{self.__name__} follows TRL's batched shape, so it must return a list with one score "
                            f"per completion; for {n} completion(s) it returned {_brief(value)}.")
        bad = {str(i): _brief(v) for i, v in enumerate(values) if v is not None and not is_number(v)}
        return {"scores": [None if str(i) in bad else v for i, v in enumerate(values)], "bad": bad,
                "metrics": {k: sum(v) / len(v) for k, v in metrics.items()},
                "columns": {k: v for k, v in columns.items() if numeric_column(v, n)},
                "unkept": sorted(k for k, v in columns.items() if not numeric_column(v, n))}

    def __call__(self, prompt: str, completion: str, **row: Any) -> Any:
        context = row.pop(CONTEXT, None) or SampleContext()
        if self.key in context.batch_scores:
            return context.batch_scores[self.key]
        out = self.call_batch(self.arguments([prompt], [completion], [row], [context]))
        if out["bad"]:
            raise TypeError(f"{self.__name__} returned {out['bad']['0']} for a completion, not a number or None.")
        return out["scores"][0]

    def __repr__(self) -> str:
        return f"TRL-shaped {self.__name__}"


def numeric_column(values: Any, n: int) -> bool:
    """Whether a log_extra column (made plain) holds one number per completion."""
    return isinstance(values, list) and len(values) == n and all(is_number(x) for x in values)


def is_number(value: Any) -> bool:
    """Whether a plain value (grpoflow.rewards.values) is a finite int or float."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_coroutine(coroutine: Any) -> Any:
    """Await `coroutine` to its end from synchronous code (in a helper thread when this thread runs an event loop)."""
    async def wait() -> Any:
        return await coroutine

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, wait()).result()


def _brief(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as e:  # a huge int, or a user __repr__ that raises
        text = f"<a {type(value).__name__} whose repr fails: {type(e).__name__}>"
    return text if len(text) <= 80 else text[:80] + "..."


class VerlReward:
    """A verl `compute_score` called with keywords, as verl's reward manager does."""
    style = "verl"
    takes_context = True  # only to drop it: verl's arguments are the row's

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, prompt: str, completion: str, **row: Any) -> Any:
        row.pop(CONTEXT, None)
        rm = row.get("reward_model")
        truth = rm.get("ground_truth") if isinstance(rm, dict) else None
        if truth is None:
            truth = row.get("ground_truth", row.get("answer"))
        return self.fn(data_source=row.get("data_source"), solution_str=completion, ground_truth=truth,
                       extra_info=row.get("extra_info"))

    def __repr__(self) -> str:
        return f"verl-shaped {self.__name__}"


def convention_hint(fn: Callable, first_error: str | None) -> str:
    """One sentence naming the shape the function was called in and, when its failure looks like another
    shape's, the fix; '' when nothing suggests a mismatch."""
    style = style_of(fn)
    text = first_error or ""
    if style == "grpoflow" and ("returned [" in text or "returned (" in text):
        return (f" It was called in {SHAPES['grpoflow']} and returned a list: a TRL-shaped function takes "
                "(prompts, completions, **columns); name its parameters so, or set reward.style=trl.")
    if style == "grpoflow" and "TypeError" in text and ("argument" in text or "positional" in text):
        return (f" It was called in {SHAPES['grpoflow']}; if it is written for TRL ({SHAPES['trl']}) or verl "
                f"({SHAPES['verl']}), set reward.style=trl or reward.style=verl (docs/data-and-rewards.md).")
    if style in ("trl", "verl"):
        return (f" It was called in {SHAPES[style]} (chosen from its signature; reward.style sets it); check that "
                "it accepts those arguments and returns that type (docs/data-and-rewards.md).")
    return ""
