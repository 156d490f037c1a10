"""Environments: what answers the model between its turns (`rollout.env`).

An environment is a class, gym style, one instance per trajectory:

    class GuessNumber:
        tools = []                                   # optional: functions the model may call
        def reset(self, *, seed, **row) -> str | list[dict] | None:
            ...                                      # the first user message(s); None: the dataset prompt
        def step(self, assistant_text) -> (observation, done, reward):
            ...                                      # observation: str, list of messages, or None (over)
        def get_reward(self) -> float | dict:        # optional: the outcome reward (else the steps' sum)
        def close(self): ...                         # optional

`reset` receives the dataset row's columns as keywords (the ones its signature names, or all with
**row) and `seed`: the same for the `n` trajectories of a group, so they start from the same state.
`step` may return (observation, done) without a reward. The environment's reward is added to the
configured reward functions' score and logged as reward/env/mean (each key of a dict as
reward/env/<key>/mean).

Given as `rollout.env=path/to/file.py:Class` or a name registered with `@register_env("name")`.
"""

from __future__ import annotations

import inspect
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from grpoflow.plugins import Registry

ENVIRONMENTS = Registry("environment")


def register_env(name: str, *, override: bool = False) -> Callable[[type], type]:
    """Make an environment class selectable as `rollout.env=name`."""
    return ENVIRONMENTS.register(name, override=override)  # type: ignore[return-value]


class Environment(Protocol):
    def reset(self, **row: Any) -> str | list[dict] | None: ...

    def step(self, assistant_text: str) -> tuple: ...


@dataclass
class StepResult:
    messages: list[dict]     # what the environment says next (empty when it is over)
    done: bool
    reward: float


def with_system_prompt(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """`messages` with a system message `system_prompt` first, unless it is None or empty or they hold one."""
    if not system_prompt or any(m.get("role") == "system" for m in messages):
        return list(messages)
    return [{"role": "system", "content": system_prompt}] + list(messages)


def as_messages(observation: str | list[dict] | None, role: str = "user") -> list[dict]:
    """An observation as chat messages: a string is one `role` message, a list is taken as messages."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    if isinstance(observation, list) and all(isinstance(m, dict) and "role" in m for m in observation):
        return list(observation)
    raise TypeError(f"an environment returned {type(observation).__name__} {observation!r:.80}; return a string, "
                    "a list of chat messages ({'role': ..., 'content': ...}) or None.")


def reset_env(env: Environment, row: dict, seed: int) -> list[dict] | None:
    """`env.reset` with `seed` and the row columns its signature takes; its first messages (None: none)."""
    params = inspect.signature(env.reset).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in row.items() if takes_all or k in params}
    if takes_all or "seed" in params:
        kwargs["seed"] = seed
    first = env.reset(**kwargs)
    return None if first is None else as_messages(first)


def step_env(env: Environment, text: str) -> StepResult:
    """`env.step(text)`, its (observation, done[, reward]) normalised."""
    out = env.step(text)
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise TypeError(f"{type(env).__name__}.step returned {out!r:.80}; return (observation, done) or "
                        "(observation, done, reward).")
    observation, done = out[0], bool(out[1])
    reward = float(out[2]) if len(out) == 3 and out[2] is not None else 0.0
    messages = as_messages(observation)
    return StepResult(messages, done or not messages, reward)


def final_reward(env: Environment, step_rewards: float) -> dict[str, float]:
    """The environment's reward parts: `get_reward()` when it has one (a float is part "env"), else the sum of
    its step rewards."""
    get = getattr(env, "get_reward", None)
    if get is None:
        return {"env": step_rewards}
    value = get()
    if isinstance(value, dict):
        return {f"env/{k}": float(v) for k, v in value.items()}
    return {"env": float(value)}


def load_env(spec: str) -> type:
    """The environment class of `rollout.env` (a registered name or `path/to/file.py:Class`)."""
    try:
        cls = ENVIRONMENTS.resolve(spec)
    except ValueError as e:
        raise ValueError(f"rollout.env={spec!r}: {e}") from None
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not inspect.isclass(cls) or missing:
        raise ValueError(f"rollout.env={spec!r} is not an environment class: it needs reset(**row) and "
                         f"step(assistant_text) methods (missing: {missing or 'it is not a class'}).")
    return cls  # type: ignore[return-value]


# ---------------------------------------------------------------- built-in: guess the number


@register_env("guess_number")
class GuessNumber:
    """Find a hidden number in 1..`high` from "higher"/"lower" replies. The secret is the row's `secret`
    column, or drawn from the seed. Reward 1 when found (within rollout.max_turns), else 0."""

    def reset(self, *, seed: int, secret: int | None = None, high: int = 8, **_: Any) -> str:
        self.high = int(high)
        self.secret = int(secret) if secret is not None else random.Random(seed).randint(1, self.high)
        self.found = False
        return f"Guess 1-{self.high}"

    def step(self, assistant_text: str) -> tuple[str | None, bool, float]:
        guess = re.search(r"-?\d+", assistant_text)
        if guess is None:
            return "a number", False, 0.0
        value = int(guess.group())
        if value == self.secret:
            self.found = True
            return None, True, 1.0
        return ("higher" if value < self.secret else "lower"), False, 0.0
