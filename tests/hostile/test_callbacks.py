"""Finding 10: one rule for user callbacks. A reward function or an environment that raises (sys.exit too) or
returns a bad value (10**400, NaN, a string) scores reward.error_score, is counted, and is named in the log; the
run goes on."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from grpoflow.controller.reward_health import RewardFailure
from grpoflow.rewards import RewardScorer, load_reward_function

REWARDS = textwrap.dedent('''
    import sys

    def huge(prompt, completion, **row):
        return 10**400

    def huge_in_dict(prompt, completion, **row):
        return {"score": 1.0, "bonus": 10**400}

    def exits(prompt, completion, **row):
        sys.exit(3)
''')

ENVIRONMENTS = textwrap.dedent('''
    import sys

    class Base:
        def reset(self, *, seed, **row):
            return "Guess 1-8"
        def step(self, text):
            return None, True, 1.0

    class Raises(Base):
        def step(self, text):
            raise RuntimeError("the simulator crashed")

    class ExitsInReset(Base):
        def reset(self, *, seed, **row):
            sys.exit(0)

    class NaNReward(Base):
        def step(self, text):
            return None, True, float("nan")

    class StringReward(Base):
        def step(self, text):
            return None, True, "0.5"

    class HugeReward(Base):
        def get_reward(self):
            return {"found": 10**400}
''')


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("callbacks")
    (folder / "bad_rewards.py").write_text(REWARDS)
    (folder / "bad_envs.py").write_text(ENVIRONMENTS)
    return folder


@pytest.mark.parametrize("name", ["huge", "huge_in_dict", "exits"])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_bad_reward_scores_error_score_in_process_and_in_workers(files, name, workers, caplog):
    fn = load_reward_function(f"{files / 'bad_rewards.py'}:{name}")
    with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
        with RewardScorer(fn, error_score=-1.0, workers=workers) as scorer:
            scores = scorer.score(["p", "p"], ["a", "b"], [{}, {}])
    assert scores.scores == [-1.0, -1.0] and scores.errors == 2
    assert any(name in r.getMessage() and "reward/errors" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("env", ["Raises", "ExitsInReset", "NaNReward", "StringReward", "HugeReward"])
def test_a_bad_environment_scores_error_score_and_the_run_goes_on(files, env, tmp_path, caplog):
    cfg = load_config("guess_number", [
        f"trainer.output_dir={tmp_path / 'run'}", "model.path=builtin:tiny-0.5m", "sft.steps=2",
        f"rollout.multi_turn.env={files / 'bad_envs.py'}:{env}", "data.prompts_per_step=2", "rollout.n=2",
        "rollout.max_new_tokens=16", "rollout.multi_turn.max_turns=2", "trainer.total_steps=1", "trainer.save_every=0",
        "trainer.val_every=0", "reward.error_score=-1"])
    with caplog.at_level(logging.WARNING, logger="grpoflow.env"):
        try:
            train(cfg)
        except RewardFailure as e:  # every trajectory's environment failed: the run must not train on that
            assert "failed on all 4 samples of step 1" in str(e) and "environment" in str(e)
            assert read_metrics(tmp_path / "run") == []
            return
    (record,) = read_metrics(tmp_path / "run")
    failed = record["reward/env/errors"]  # a trajectory cut by its token budget before any step never fails
    assert failed >= 1 and record["reward/errors"] == failed, record
    assert record["critic/score/mean"] == pytest.approx(-failed / 4), record  # each failure scored error_score
    assert any(f"environment {env}." in r.getMessage() for r in caplog.records)


def test_an_agent_that_calls_sys_exit_is_an_error_not_a_timeout(caplog):
    """Agents (rollout.agent) follow the same rule: sys.exit in an episode scores error_score as an error."""
    import torch

    from grpoflow.data.batch import Batch
    from grpoflow.data.dataset import PromptItem
    from grpoflow.models.tiny import build_char_tokenizer
    from grpoflow.trajectories.agents import AgentEpisodes
    from grpoflow.trajectories.endpoint import Endpoint
    from grpoflow.engines.protocol import EngineAbilities, SamplingParams
    from scripted import play

    class Never:  # no agent here calls the model
        version, busy, tok = 0, False, build_char_tokenizer()
        abilities = EngineAbilities(stepping=True)

        def end_rollout(self):
            pass

        def admit(self, requests):
            raise AssertionError("unused")

        tick = admit

    async def agent(row, client):
        if row["prompt"] == "p1":
            raise SystemExit(3)
        return 1.0

    items = [PromptItem([], "", {"prompt": f"p{i}"}, "x", index=i) for i in range(2)]
    with Endpoint(build_char_tokenizer()) as endpoint:
        episodes = AgentEpisodes(agent, endpoint, timeout_s=5.0, error_score=-1.0,
                                 opening=lambda row: [{"role": "user", "content": row["prompt"]}])
        with caplog.at_level(logging.WARNING, logger="grpoflow.agents"):
            batch, metrics = play(episodes, Never(), items, SamplingParams(n=1, max_new_tokens=10), 0, agent=True)
    assert isinstance(batch, Batch) and torch.is_tensor(batch.env_rewards)
    assert batch.env_rewards.tolist() == [1.0, -1.0]
    assert metrics["agent/errors"] == 1 and metrics["agent/timeouts"] == 0, metrics
    assert any("SystemExit" in r.getMessage() or "sys.exit" in r.getMessage() for r in caplog.records)
