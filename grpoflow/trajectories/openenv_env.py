"""`rollout.multi_turn.env=openenv`: an OpenEnv environment served over HTTP/WebSocket, driven as a grpoflow
environment.

OpenEnv (`openenv-core`, pip install 'grpoflow[openenv]') serves an environment with `create_app(EnvClass,
ActionClass, ObservationClass)`; clients talk to it through `openenv.core.GenericEnvClient` (one WebSocket
session, one server-side environment instance, per client). This adapter is one such client per trajectory:

- `reset(seed)` resets the server's environment with the group's seed (the n trajectories of a group start from
  the same state when the environment honours `seed`); its observation is the first user message;
- each model turn is sent as the action `{action_field: text}`;
- the observation that comes back is the next user message; `done` ends the conversation; the step's OpenEnv
  `reward` is the step reward, and their sum the environment reward (reward/env/mean).

An observation becomes text as: its `observation_field` when given; else its only string field (besides
OpenEnv's `done`, `reward`, `metadata`); else its fields as JSON. Settings come from `rollout.multi_turn.env_args`
(`{url: http://127.0.0.1:8000, action_field: message}`), the keyword arguments of `OpenEnvEnvironment`.
Registered in env.py; imports openenv only when an environment is built.
"""

from __future__ import annotations

import json
from typing import Any

from grpoflow.errors import MissingExtraError, UserError

EXTRA = "pip install 'grpoflow[openenv]'"
OPENENV_FIELDS = ("done", "reward", "metadata")


def generic_client_class() -> Any:
    """openenv's GenericEnvClient, or an ImportError naming the extra that installs it."""
    try:
        from openenv.core import GenericEnvClient
    except ImportError:
        raise MissingExtraError(f"rollout.multi_turn.env=openenv needs the openenv-core package: {EXTRA}.") from None
    return GenericEnvClient


def observation_text(observation: dict, field: str | None = None) -> str:
    """An OpenEnv observation (a dict) as the text of a user message (module docstring)."""
    if field is not None:
        if field not in observation:
            raise KeyError(f"the OpenEnv observation has no field {field!r} (its fields: {sorted(observation)}); "
                           "set rollout.multi_turn.env_args.observation_field to one of them.")
        return str(observation[field])
    own = {k: v for k, v in observation.items() if k not in OPENENV_FIELDS}
    if len(own) == 1 and isinstance(next(iter(own.values())), str):
        return next(iter(own.values()))
    return json.dumps(own, sort_keys=True, default=str)


class OpenEnvEnvironment:
    """One OpenEnv session per trajectory (module docstring)."""

    def __init__(self, *, url: str, action_field: str = "message", observation_field: str | None = None,
                 timeout_s: float = 60.0) -> None:
        """url: the OpenEnv server (http://host:port); action_field: the action's field that carries the model's
        text; observation_field: the observation's field shown to the model (None: its only field when a string,
        else all as JSON); timeout_s: seconds to connect and for each reply."""
        if not url:
            raise UserError("rollout.multi_turn.env=openenv needs the server's address: "
                            "rollout.multi_turn.env_args={url: http://127.0.0.1:8000} (a server started with uvicorn "
                            "on openenv's create_app).")
        client = generic_client_class()(base_url=url, connect_timeout_s=timeout_s, message_timeout_s=timeout_s)
        self.client = client.sync()
        self.action_field, self.observation_field = action_field, observation_field

    def reset(self, *, seed: int, **_: Any) -> str:
        result = self.client.reset(seed=seed)
        return observation_text(result.observation, self.observation_field)

    def step(self, assistant_text: str) -> tuple[str | None, bool, float]:
        result = self.client.step({self.action_field: assistant_text})
        reward = 0.0 if result.reward is None else float(result.reward)
        if result.done:
            return None, True, reward
        return observation_text(result.observation, self.observation_field), False, reward

    def close(self) -> None:
        self.client.close()
