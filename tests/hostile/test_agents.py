"""Issue 36, finding 4 (agents): an agent program that cannot run at all (rollout.agent.program=verifiers offline:
its harness cannot be fetched, so every episode raises the same error) stops the run with that error; it never
trains on reward.error_score alone and exits 0."""

from __future__ import annotations

import pytest

from grpoflow.data.dataset import PromptItem
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories.agents import AgentEpisodes, AgentFailure
from grpoflow.trajectories.endpoint import Endpoint
from grpoflow.engines.protocol import EngineAbilities, SamplingParams
from scripted import play


class Never:  # no agent here reaches the model
    version, busy, tok = 0, False, build_char_tokenizer()
    abilities = EngineAbilities(stepping=True)

    def end_rollout(self):
        pass

    def admit(self, requests):
        raise AssertionError("unused")

    tick = admit


def episodes_of(agent, endpoint):
    return AgentEpisodes(agent, endpoint, timeout_s=5.0, error_score=-1.0,
                         opening=lambda row: [{"role": "user", "content": row["prompt"]}])


ITEMS = [PromptItem([], "", {"prompt": f"p{i}"}, "x", index=i) for i in range(2)]


def test_every_episode_failing_with_one_error_stops_the_run_with_it():
    async def offline(row, client):
        raise RuntimeError("uv could not fetch the harness from https://pypi.org (network unreachable)")

    with Endpoint(build_char_tokenizer()) as endpoint:
        with pytest.raises(AgentFailure, match=r"every one of this step's 4 agent episodes failed: RuntimeError: uv "
                                               r"could not fetch the harness.*the run stops"):
            play(episodes_of(offline, endpoint), Never(), ITEMS, SamplingParams(n=2, max_new_tokens=10), 0,
                 agent=True)


def test_some_episodes_failing_is_scored_not_stopped():
    async def half(row, client):
        if row["prompt"] == "p1":
            raise RuntimeError("this task is broken")
        return 1.0

    with Endpoint(build_char_tokenizer()) as endpoint:
        batch, metrics = play(episodes_of(half, endpoint), Never(), ITEMS, SamplingParams(n=1, max_new_tokens=10), 0,
                              agent=True)
    assert batch.env_rewards.tolist() == [1.0, -1.0] and metrics["agent/errors"] == 1
    assert metrics["rollout/ending/error"] == 0.5


def test_an_agent_that_changes_its_row_changes_no_other_episode():
    row = {"prompt": "p0", "seen": []}

    async def hoarder(row, client):  # keeps a note in its row: the next episode and the next step must not see it
        row["seen"].append(1)
        return float(len(row["seen"]))

    items = [PromptItem([], "", row, "x", index=0)]
    with Endpoint(build_char_tokenizer()) as endpoint:
        for seed in (0, 1):
            batch, _ = play(episodes_of(hoarder, endpoint), Never(), items, SamplingParams(n=3, max_new_tokens=10),
                            seed, agent=True)
            assert batch.env_rewards.tolist() == [1.0, 1.0, 1.0]
    assert row == {"prompt": "p0", "seen": []}
