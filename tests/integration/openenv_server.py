"""A small OpenEnv environment written with openenv-core's own server API (Environment, Action, Observation,
create_app), served by `uvicorn openenv_server:app` for tests/integration/test_openenv.py: guess a number in 1..8
from "higher"/"lower" replies, reward 1 when found."""

import random
import re
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., description="the guess, as text")


class GuessObservation(Observation):
    text: str = Field(default="", description="what the environment says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 1

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = random.Random(seed).randint(1, 8)
        return GuessObservation(text="Guess 1-8", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.search(r"-?\d+", action.message)
        if found is None:
            return GuessObservation(text="a number", done=False, reward=0.0)
        guess = int(found.group())
        if guess == self.secret:
            return GuessObservation(text="found", done=True, reward=1.0)
        return GuessObservation(text="higher" if guess < self.secret else "lower", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=256)
