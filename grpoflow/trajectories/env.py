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

Each method may be a plain function or an `async def` (which must await, not block: a blocking one stalls every
trajectory). `reset` receives the dataset row's columns as keywords (the ones its signature names, or all with
**row) and `seed`: the same for the `n` trajectories of a group, so they start from the same state.
`step` may return (observation, done) without a reward. The environment's reward is added to the
configured reward functions' score and logged as reward/env/mean (each key of a dict as
reward/env/<key>/mean).

Given as `rollout.multi_turn.env=path/to/file.py:Class` or a name registered with `@register_env("name")`.

The environment is user code, so it runs under the rule every callback follows (rewards, tools, agents):
`GuardedEnvironment` wraps each instance so that its constructor, `reset`, `step`, `get_reward` and `close` run
off the event loop within rollout.multi_turn.env_timeout_s each, and so that an exception (`sys.exit` too) or a
call past the limit in any of them, or a reward that is not a finite real number (NaN, inf, a string, 10**400),
ends that trajectory (end reason "error" or "timeout") with a NaN environment reward and a warning naming the
class, the method and the cause; the run goes on. The reward assembly (controller/rewarding.py) scores such a
sample `reward.error_score` and counts it in reward/errors and reward/env/errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import math
import random
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from grpoflow.errors import UserError
from grpoflow.plugins import Registry
from grpoflow.trajectories.trajectory import EndState

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


def reset_kwargs(reset: Callable[..., Any], row: dict, seed: int) -> dict:
    """The keywords of `reset`: `seed` and the row columns its signature takes (all with **row)."""
    params = inspect.signature(reset).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in row.items() if takes_all or k in params}
    if takes_all or "seed" in params:
        kwargs["seed"] = seed
    return kwargs


def step_result(name: str, out: Any) -> StepResult:
    """What `name.step` returned, (observation, done[, reward]), normalised."""
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise TypeError(f"{name}.step returned {out!r:.80}; return (observation, done) or "
                        "(observation, done, reward).")
    observation, done = out[0], bool(out[1])
    reward = env_number(out[2], f"{name}.step's reward") if len(out) == 3 and out[2] is not None else 0.0
    messages = as_messages(observation)
    return StepResult(messages, done or not messages, reward)


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
    """One environment instance under the callback rule (module docstring), each call bounded by `timeout_s`
    (rollout.multi_turn.env_timeout_s) and off the event loop: a plain method runs in a daemon thread of its own
    (so a slow one stalls neither the event loop nor the other trajectories, and a hung one is left behind
    without holding up the end of the run), an `async def` one is awaited under the bound (it must await, not
    block). `failure` says why it stopped; `end` is then EndState.ERROR or TIMEOUT (the trajectory's end)."""

    def __init__(self, cls: type, kwargs: dict | None = None, *, timeout_s: float = 60.0) -> None:
        self.cls, self.kwargs, self.timeout_s = cls, dict(kwargs or {}), timeout_s
        self.name = cls.__name__
        self.failure: str | None = None
        self.end: EndState | None = None
        self._steps_total = 0.0
        self.inner: Any = None
        self.tools = getattr(cls, "tools", [])

    async def start(self) -> None:
        """Build the instance (its constructor is user code too: bounded and off the event loop)."""
        try:
            self.inner = await bounded(self.cls, timeout_s=self.timeout_s,  # a copy: env_args serve every instance
                                       **copy.deepcopy(self.kwargs))
        except BaseException as e:
            self._fail("__init__", e)

    async def reset(self, row: dict, seed: int) -> list[dict] | None:
        """The first messages (None: the dataset prompt opens the conversation; after a failure the first step
        ends it)."""
        if self.failure is None:
            try:
                first = await bounded(self.inner.reset, timeout_s=self.timeout_s,  # a copy: the row is shared
                                      **copy.deepcopy(reset_kwargs(self.inner.reset, row, seed)))
                return None if first is None else as_messages(first)
            except BaseException as e:
                self._fail("reset", e)
        return None

    async def step(self, assistant_text: str) -> StepResult:
        if self.failure is None:
            try:
                result = step_result(self.name, await bounded(self.inner.step, assistant_text,
                                                              timeout_s=self.timeout_s))
                self._steps_total += result.reward
                return result
            except BaseException as e:
                self._fail("step", e)
        return StepResult([], True, 0.0)

    async def reward(self) -> dict[str, float]:
        """The environment's reward parts: its get_reward (a float is part "env"), else the sum of its step
        rewards, checked; {"env": NaN} once it failed."""
        if self.failure is None:
            try:
                get = getattr(self.inner, "get_reward", None)
                value = await bounded(get, timeout_s=self.timeout_s) if get is not None else self._steps_total
                if isinstance(value, dict):
                    return {f"env/{k}": env_number(v, f"{self.name}.get_reward()[{k!r}]") for k, v in value.items()}
                return {"env": env_number(value, f"{self.name}.get_reward()")}
            except BaseException as e:
                self._fail("get_reward", e)
        return {"env": math.nan}

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            try:
                await bounded(close, timeout_s=self.timeout_s)
            except BaseException as e:
                log.warning("environment %s.close %s (ignored).", self.name, describe(e, self.timeout_s))

    def refuse(self, method: str, why: str) -> None:
        """What `method` returned cannot be used (`why`, e.g. "returned ..."): the environment fails as if it had
        raised."""
        self._failed(EndState.ERROR, f"{self.name}.{method} {why}")

    def _fail(self, method: str, error: BaseException) -> None:
        if isinstance(error, asyncio.CancelledError):
            raise error
        self._failed(EndState.TIMEOUT if isinstance(error, asyncio.TimeoutError) else EndState.ERROR,
                     f"{self.name}.{method} {describe(error, self.timeout_s)}")

    def _failed(self, end: EndState, failure: str) -> None:
        self.end, self.failure = end, failure
        log.warning("environment %s; its trajectory ends here and scores reward.error_score (counted in "
                    "reward/env/errors).", self.failure)


def describe(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return (f"took longer than rollout.multi_turn.env_timeout_s={timeout_s:g} s (left running in its thread; "
                "raise the limit if it is just slow)")
    return f"raised {type(error).__name__}: {str(error)[:300]}"


# Environment calls left running in their threads past their timeout (a `close` that hangs left one per trajectory
# per step): while this many still run, a new call is not started and fails instead. The calls of the step that
# reaches it may all have started by then: at most this plus one step's calls.
MAX_LEFT_BEHIND = 64
_left_behind: set[threading.Thread] = set()
_left_lock = threading.Lock()


async def bounded(fn: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` within `timeout_s` seconds (asyncio.TimeoutError past it), off the event loop: an
    `async def` is awaited under the bound; anything else runs in a daemon thread of its own (a hung call is left
    behind there: no executor waits for it at the end of the run, and MAX_LEFT_BEHIND bounds how many), and an
    awaitable it returns is awaited."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(_without_exit(fn(*args, **kwargs)), timeout_s)
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as e:  # SystemExit too: the callback rule makes it an ordinary failure
            result, error = None, e if isinstance(e, Exception) else RuntimeError(f"{type(e).__name__}: {e}")
        with contextlib.suppress(RuntimeError):  # the event loop is gone (a call left behind after the run)
            loop.call_soon_threadsafe(settle, result, error)

    with _left_lock:
        _left_behind.difference_update([t for t in _left_behind if not t.is_alive()])
        if len(_left_behind) >= MAX_LEFT_BEHIND:
            raise RuntimeError(f"not started: {len(_left_behind)} earlier environment calls still run past "
                               f"rollout.multi_turn.env_timeout_s in threads of their own (at most {MAX_LEFT_BEHIND} "
                               f"are kept); fix the environment method that hangs")
    thread = threading.Thread(target=run, daemon=True, name=f"grpoflow-env-{getattr(fn, '__name__', 'call')}")
    thread.start()
    try:
        result = await asyncio.wait_for(future, timeout_s)
    except asyncio.TimeoutError:
        with _left_lock:
            _left_behind.add(thread)
        raise
    if inspect.isawaitable(result):
        result = await asyncio.wait_for(result, max(deadline - loop.time(), 0.0))
    return result


async def _without_exit(call: Any) -> Any:
    """Await `call` with its sys.exit turned into an ordinary error (asyncio would let SystemExit end the event
    loop, and with it every trajectory)."""
    try:
        return await call
    except SystemExit as e:
        raise RuntimeError(f"sys.exit({e.code!r})") from None


def load_env(spec: str) -> type:
    """The environment class of `rollout.multi_turn.env` (a registered name or `path/to/file.py:Class`)."""
    cls = ENVIRONMENTS.resolve_key("rollout.multi_turn.env", spec)
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

from grpoflow.trajectories.openenv_env import OpenEnvEnvironment  # noqa: E402
from grpoflow.trajectories.reasoning_gym_env import ReasoningGymEnv  # noqa: E402

register_env("reasoning_gym")(ReasoningGymEnv)
register_env("openenv")(OpenEnvEnvironment)
