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
from grpoflow.controller.run import train
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
        f"rollout.env={files / 'bad_envs.py'}:{env}", "data.prompts_per_step=2", "rollout.n=2",
        "rollout.max_new_tokens=16", "rollout.max_turns=2", "trainer.total_steps=1", "trainer.save_every=0",
        "trainer.val_every=0", "reward.error_score=-1"])
    with caplog.at_level(logging.WARNING, logger="grpoflow.env"):
        train(cfg)
    (record,) = read_metrics(tmp_path / "run")
    failed = record["reward/env/errors"]  # a trajectory cut by its token budget before any step never fails
    assert failed >= 1 and record["reward/errors"] == failed, record
    assert record["critic/score/mean"] == pytest.approx(-failed / 4), record  # each failure scored error_score
    assert any(f"environment {env}." in r.getMessage() for r in caplog.records)
