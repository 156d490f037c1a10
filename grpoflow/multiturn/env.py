"""Environments: what answers the model between its turns (`rollout.multi_turn.env`).

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

Given as `rollout.multi_turn.env=path/to/file.py:Class` or a name registered with `@register_env("name")`.

The environment is user code, so it runs under the rule every callback follows (rewards, tools, agents):
`guarded(cls)` wraps each instance so that an exception (`sys.exit` too) in its constructor, `reset`,
`step`, `get_reward` or `close`, or a reward that is not a finite real number (NaN, inf, a string, 10**400),
ends that trajectory with a NaN environment reward and a warning naming the class, the method and the
cause. The reward assembly (controller/rewarding.py) scores such a sample `reward.error_score` and counts it
in reward/errors and reward/env/errors.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from grpoflow.errors import UserError
from grpoflow.plugins import Registry

ENVIRONMENTS = Registry("environment")
log = logging.getLogger("grpoflow.env")


def register_env(name: str, *, override: bool = False) -> Callable[[type], type]:
    """Make an environment class selectable as `rollout.multi_turn.env=name`."""
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
    reward = env_number(out[2], f"{type(env).__name__}.step's reward") if len(out) == 3 and out[2] is not None \
        else 0.0
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


def env_number(value: Any, what: str) -> float:
    """`value` as a float if it is a finite real number (not a bool, not a string); TypeError otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        number = float(value) if ok else math.nan
    except OverflowError:
        number = math.nan
    if not math.isfinite(number):
        raise TypeError(f"{what} is {str(value)[:60]!r}, not a finite number; return an int or a float.")
    return number


class GuardedEnvironment:
    """One environment instance under the callback rule (module docstring); `failure` says why it stopped."""

    def __init__(self, cls: type, kwargs: dict | None = None) -> None:
        self.name = cls.__name__
        self.failure: str | None = None
        self._steps_total = 0.0
        self.inner: Any = None
        try:
            self.inner = cls(**(kwargs or {}))
        except (Exception, SystemExit) as e:
            self._fail("__init__", e)
        self.tools = getattr(self.inner, "tools", [])

    def reset(self, **row: Any) -> list[dict] | None:
        if self.failure is None:
            seed = row.pop("seed", 0)
            try:
                return reset_env(self.inner, row, seed)
            except (Exception, SystemExit) as e:
                self._fail("reset", e)
        return None  # the dataset prompt opens the conversation; the first step ends it

    def step(self, assistant_text: str) -> tuple:
        if self.failure is None:
            try:
                result = step_env(self.inner, assistant_text)
                self._steps_total += result.reward
                return result.messages, result.done, result.reward
            except (Exception, SystemExit) as e:
                self._fail("step", e)
        return None, True, 0.0

    def get_reward(self) -> float | dict[str, float]:
        """The inner environment's reward (its get_reward, else the sum of its step rewards), checked; NaN once
        it failed."""
        if self.failure is None:
            try:
                get = getattr(self.inner, "get_reward", None)
                value = get() if get is not None else self._steps_total
                if isinstance(value, dict):
                    return {str(k): env_number(v, f"{self.name}.get_reward()[{k!r}]") for k, v in value.items()}
                return env_number(value, f"{self.name}.get_reward()")
            except (Exception, SystemExit) as e:
                self._fail("get_reward", e)
        return math.nan

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            try:
                close()
            except (Exception, SystemExit) as e:
                log.warning("environment %s.close raised %s: %s (ignored).", self.name, type(e).__name__, e)

    def _fail(self, method: str, error: BaseException) -> None:
        self.failure = f"{self.name}.{method} raised {type(error).__name__}: {str(error)[:300]}"
        log.warning("environment %s; its trajectory ends here and scores reward.error_score (counted in "
                    "reward/env/errors).", self.failure)


def guarded(cls: type, kwargs: dict | None = None) -> Callable[[], GuardedEnvironment]:
    """A factory of `cls(**kwargs)` instances (rollout.multi_turn.env_args) under the callback rule, for EnvLoop's
    `env_cls`."""
    def make() -> GuardedEnvironment:
        return GuardedEnvironment(cls, kwargs)
    make.tools = getattr(cls, "tools", [])  # type: ignore[attr-defined]
    return make


def load_env(spec: str) -> type:
    """The environment class of `rollout.multi_turn.env` (a registered name or `path/to/file.py:Class`)."""
    try:
        cls = ENVIRONMENTS.resolve(spec)
    except FileNotFoundError:  # a missing file.py: the message names it
        raise
    except ValueError as e:
        raise UserError(f"rollout.multi_turn.env={spec!r}: {e}") from None
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not inspect.isclass(cls) or missing:
        raise UserError(f"rollout.multi_turn.env={spec!r} is not an environment class: it needs reset(**row) and "
                        f"step(assistant_text) methods (missing: {missing or 'it is not a class'}).")
    return cls  # type: ignore[return-value]


# ---------------------------------------------------------------- built-in: guess the number


@register_env("guess_number")
class GuessNumber:
    """Find a hidden number in 1..`high` from "higher"/"lower" replies. The secret is the row's `secret`
    column, or drawn from the seed. Reward 1 when found (within rollout.multi_turn.max_turns), else 0."""

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


# ---------------------------------------------------------------- environments of the field (docs/environments.md)
# Their modules import their package only when an environment is played (optional extras).

from grpoflow.multiturn.openenv_env import OpenEnvEnvironment  # noqa: E402
from grpoflow.multiturn.reasoning_gym_env import ReasoningGymEnv  # noqa: E402

register_env("reasoning_gym")(ReasoningGymEnv)
register_env("openenv")(OpenEnvEnvironment)
