"""Issue 36, finding 1: environments are user code like rewards and tools. Each call (constructor, reset, step,
get_reward, close; plain or async def) runs off the event loop under rollout.multi_turn.env_timeout_s: a hung step
ends its own trajectory with end reason "timeout", never the run, and a slow environment does not hold up the
others. Every trajectory says why it ended (rollout/ending/<reason>)."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
import threading
import time

import pytest

from grpoflow.commands.run import train
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.data.dataset import PromptItem
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.loop import EnvLoop
from grpoflow.trajectories.trajectory import EndState
from grpoflow.engines.protocol import SamplingParams
from scripted import ScriptedEngine, play

HUNG = textwrap.dedent('''
    import time

    class HungStep:
        def reset(self, *, seed, **row):
            return "Guess 1-8"
        def step(self, text):
            time.sleep(3600)  # a simulator that never answers
''')


def loop_of(env, timeout_s):
    tok = build_char_tokenizer()
    renderer = ChatRenderer(tok)
    engine = ScriptedEngine(tok, lambda text: "4", renderer.turn.end_token_id)
    loop = EnvLoop(renderer, env_cls=env, tools=None, max_turns=3, env_timeout_s=timeout_s,
                   opening=lambda row: [{"role": "user", "content": "Guess 1-8"}])
    return loop, engine


def items(count):
    return [PromptItem([], "", {"prompt": "Guess 1-8", "who": k}, "g", index=k) for k in range(count)]


class Hangs:
    """Trajectory 0's step never returns; trajectory 1's ends the conversation."""
    def reset(self, *, seed, who):
        self.who = who
        return "Guess 1-8"

    def step(self, text):
        if self.who == 0:
            time.sleep(3600)
        return None, True, 1.0


class AsyncHangs(Hangs):
    async def step(self, text):
        if self.who == 0:
            await asyncio.sleep(3600)
        return None, True, 1.0


@pytest.mark.parametrize("env", [Hangs, AsyncHangs])
def test_a_hung_environment_step_times_out_its_own_trajectory_only(env, caplog):
    loop, engine = loop_of(env, timeout_s=1.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="grpoflow.env"):
        batch, metrics = play(loop, engine, items(2), SamplingParams(n=1, max_new_tokens=200), seed=0)
    assert time.monotonic() - started < 10  # not an hour: the hung thread is left behind, not waited for
    assert [i.end for i in batch.infos] == [EndState.TIMEOUT, EndState.ENV_DONE]
    env_rewards = batch.env_rewards.tolist()
    assert env_rewards[0] != env_rewards[0] and env_rewards[1] == 1.0  # NaN: scored reward.error_score
    assert metrics["rollout/ending/timeout"] == 0.5 and metrics["rollout/ending/env_done"] == 0.5
    assert any(f"{env.__name__}.step took longer than rollout.multi_turn.env_timeout_s=1" in r.getMessage()
               for r in caplog.records)


class Meet:
    """Trajectory k's step lets the other go on and then waits (at most 5 s) for the other to step too: only
    environments stepping at the same time both see the other (on the event loop, the first would wait alone)."""
    arrived = [threading.Event(), threading.Event()]

    def reset(self, *, seed, who):
        self.who = who
        return "Guess 1-8"

    def step(self, text):
        Meet.arrived[self.who].set()
        return None, True, float(Meet.arrived[1 - self.who].wait(5))


def test_a_slow_environment_does_not_hold_up_another_trajectorys_environment():
    loop, engine = loop_of(Meet, timeout_s=30)
    batch, _ = play(loop, engine, items(2), SamplingParams(n=1, max_new_tokens=200), seed=0)
    assert batch.env_rewards.tolist() == [1.0, 1.0]


HALF_HUNG = textwrap.dedent('''
    import itertools
    import time

    CALLS = itertools.count()

    class HalfHung:
        """Every other first step never answers (half the trajectories: a run whose every trajectory failed
        stops, controller/reward_health.py); the others end the conversation."""
        def reset(self, *, seed, **row):
            return "Guess 1-8"
        def step(self, text):
            if next(CALLS) % 2 == 0:
                time.sleep(3600)
            return None, True, 0.0
''')


def test_a_hung_environment_does_not_hang_the_run(tmp_path):
    (tmp_path / "hung.py").write_text(HALF_HUNG)
    cfg = load_config("guess_number", [
        f"trainer.output_dir={tmp_path / 'run'}", "model.path=builtin:tiny-0.5m", "sft.steps=2",
        f"rollout.multi_turn.env={tmp_path / 'hung.py'}:HalfHung", "rollout.multi_turn.env_timeout_s=1",
        "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=16", "rollout.multi_turn.max_turns=2",
        "trainer.total_steps=1", "trainer.save_every=0", "trainer.val_every=0", "reward.error_score=-1",
        "trainer.log_train_every=1", "trainer.log_train_groups=2"])
    train(cfg)
    (record,) = read_metrics(tmp_path / "run")
    timed_out = record.get("rollout/ending/timeout", 0.0) * 4
    assert timed_out >= 1 and record["reward/env/errors"] == timed_out, record
    logged = [json.loads(line) for line in (tmp_path / "run" / "train_samples.jsonl").read_text().splitlines()]
    ended = [s["ended"] for g in logged for s in g["samples"]]  # what `grpoflow view` shows beside each sample
    assert ended.count("timeout") == timed_out and set(ended) <= {"timeout", "token_budget", "eos", "env_done"}, ended


class Greedy:
    """Takes the row's list of hints for itself (a careless environment mutating what it was handed)."""
    def reset(self, *, seed, hints):
        self.hints = hints
        first = hints.pop(0) if hints else "none left"
        return f"Guess 1-8 ({first})"

    def step(self, text):
        return None, True, 1.0


def test_an_environment_that_changes_its_row_does_not_change_its_siblings():
    loop, engine = loop_of(Greedy, timeout_s=30)
    row = {"prompt": "Guess 1-8", "hints": ["odd"]}
    batch, _ = play(loop, engine, [PromptItem([], "", row, "g", index=0)], SamplingParams(n=3, max_new_tokens=200),
                    seed=0)
    assert [c[0]["content"] for c in batch.conversations] == ["Guess 1-8 (odd)"] * 3 and row["hints"] == ["odd"]


class Hoarder:
    """Keeps what its constructor was handed (rollout.multi_turn.env_args) and adds to it at every step."""
    def __init__(self, budget):
        self.budget = budget

    def reset(self, *, seed, **row):
        return "Guess 1-8"

    def step(self, text):
        self.budget.append(1)
        return None, True, float(len(self.budget))


def test_an_environment_that_changes_its_env_args_does_not_change_the_next_instance():
    tok = build_char_tokenizer()
    renderer = ChatRenderer(tok)
    engine = ScriptedEngine(tok, lambda text: "4", renderer.turn.end_token_id)
    env_args = {"budget": []}
    loop = EnvLoop(renderer, env_cls=Hoarder, env_args=env_args, tools=None, max_turns=3, env_timeout_s=30,
                   opening=lambda row: [{"role": "user", "content": "Guess 1-8"}])
    for seed in (0, 1):  # two steps of a group of 3: every instance starts from the configured list
        batch, _ = play(loop, engine, items(1), SamplingParams(n=3, max_new_tokens=200), seed=seed)
        assert batch.env_rewards.tolist() == [1.0, 1.0, 1.0]
    assert env_args == {"budget": []}
