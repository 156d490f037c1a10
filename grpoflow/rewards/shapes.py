"""Reward functions in the three shapes users bring, each run unchanged behind grpoflow's per-sample contract.

    grpoflow  fn(prompt, completion, **row) -> float | dict | None                 (one sample per call)
    TRL       fn(prompts, completions, **columns) -> list[float | None]            (lists; TRL's GRPOTrainer)
    verl      compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw) -> float | dict

`detect_style(fn)` reads the shape off the signature (`reward.style=auto`); `adapt(fn, style)` wraps a TRL or
verl function as a grpoflow one, so that combinations (reward.functions, reward.routes), worker processes and
timeouts treat every shape alike.

TRL: each call carries one sample, as TRL would pass it in a batch of one: `prompts` and `completions` as lists
(conversational rows, whose prompt is chat messages, get `completions=[[{"role": "assistant", "content": ...}]]`),
every other column as a one-element list, and `completion_ids` and `trainer_state` (TRL's names) when the trainer
provides them. A TRL function that must see the whole batch at once (e.g. to rank samples against each other) is
not expressible this way. `async def` TRL functions are awaited. verl: keyword arguments, as verl's reward manager
calls them: `ground_truth` is the row's `reward_model.ground_truth` (or `ground_truth`/`answer`), `extra_info` the
row's `extra_info`.

`convention_hint` is the sentence a failed run prints when a function's failures look like a shape mismatch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.errors import UserError

STYLES = ("auto", "grpoflow", "trl", "verl")
# The keyword under which the scorer hands a sample's context (`SampleContext`) to the functions that take it
# (`takes_context`): the adapters here and the combinations of reward.functions / reward.routes.
CONTEXT = "__grpoflow_sample_context__"

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
    response's token ids and the trainer's state."""
    row_prompt: Any = None
    completion_ids: list = field(default_factory=list)
    trainer_state: TrainerState = field(default_factory=TrainerState)


def takes_context(fn: Callable) -> bool:
    """Whether the scorer passes `fn` the sample's context (as keyword CONTEXT): declared by the adapters here
    and by the combinations (grpoflow.rewards.combine), whose parts may be adapters."""
    return bool(getattr(fn, "takes_context", False))  # declared: a class attribute, or the combination's own


def _names(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def detect_style(fn: Callable) -> str:
    """grpoflow, trl or verl, from the parameter names; a signature that names none of them is grpoflow's
    (e.g. `fn(*args, **kwargs)`: give reward.style when it is another shape)."""
    names = _names(fn)
    if "solution_str" in names or ("data_source" in names and "ground_truth" in names):
        return "verl"
    if "completions" in names or (names[:1] == ["prompts"]):
        return "trl"
    return "grpoflow"


def is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(fn.__call__))


def adapt(fn: Callable, style: str = "auto") -> Callable:
    """`fn` as a grpoflow reward function; style auto reads the shape off the signature."""
    if style not in STYLES:
        raise UserError(f"reward.style={style!r}; use one of {list(STYLES)}.")
    style = detect_style(fn) if style == "auto" else style
    if style == "trl":
        return AsyncTRLReward(fn) if is_async_callable(fn) else TRLReward(fn)
    if style == "verl":
        return VerlReward(fn)
    return fn


def style_of(fn: Callable) -> str:
    """The shape an adapted function was written in."""
    return fn.style if isinstance(fn, (TRLReward, VerlReward)) else "grpoflow"


class TRLReward:
    """A TRL reward function called with one sample, its result's only element returned (see the module
    docstring)."""
    style = "trl"
    takes_context = True  # TRL hands the row's chat messages (not rendered text), completion_ids, trainer_state

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def arguments(self, prompt: str, completion: str, row: dict) -> dict:
        context = row.pop(CONTEXT, None) or SampleContext()
        chat = isinstance(context.row_prompt, list)
        columns = {k: [v] for k, v in row.items()}
        return {**columns, "prompts": [context.row_prompt if chat else prompt],
                "completions": [[{"role": "assistant", "content": completion}]] if chat else [completion],
                "completion_ids": [list(context.completion_ids)], "trainer_state": context.trainer_state}

    def __call__(self, prompt: str, completion: str, **row: Any) -> Any:
        return first_of(self.fn(**self.arguments(prompt, completion, row)), self.__name__)

    def __repr__(self) -> str:
        return f"TRL-shaped {self.__name__}"


class AsyncTRLReward(TRLReward):
    """An `async def` TRL reward function (TRL awaits those too)."""

    async def __call__(self, prompt: str, completion: str, **row: Any) -> Any:  # type: ignore[override]
        return first_of(await self.fn(**self.arguments(prompt, completion, row)), self.__name__)


def first_of(values: Any, name: str) -> Any:
    """The one score of a TRL function's list for one sample."""
    if not isinstance(values, (list, tuple)) or len(values) != 1:
        raise TypeError(f"{name} follows TRL's batched shape, so it must return a list with one score per "
                        f"completion; for 1 completion it returned {_brief(values)}.")
    return values[0]


def _brief(value: Any) -> str:
    text = repr(value)
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
