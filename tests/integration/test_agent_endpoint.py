"""Agent episodes through the endpoint on the tiny model: the ids and log-probs recorded per call are what the
engine sampled, an agent and the same episodes written as an environment give the same trajectories for the same
seed, and the calculator example agent trains end to end."""

from pathlib import Path

import pytest
import torch

from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.controller.rollouts import metrics_of
from grpoflow.commands.run import sft_stage, train
from grpoflow.data.dataset import PromptItem
from grpoflow.trajectories.agents import AgentEpisodes
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.endpoint import Endpoint
from grpoflow.trajectories.env import GuessNumber
from grpoflow.trajectories.loop import EnvLoop, RolloutItem
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.trajectories.turns import stream_seed
from grpoflow.engines.protocol import SamplingParams
from grpoflow.workers.rollout import RolloutWorker
from recording import Recording

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agents"
BASE = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=64",
        "rollout.multi_turn.max_turns=3", "trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1",
        "trainer.resume=never"]
MAX_TURNS, BUDGET = 3, 200


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> str:
    """The tiny model warm-started on guess-the-number conversations (so it ends its turns)."""
    run = tmp_path_factory.mktemp("warm")
    return sft_stage(load_config("guess_number", BASE + ["sft.steps=60", "sft.batch_size=16",
                                                         f"trainer.output_dir={run}"]))


async def guess_agent(row, client):
    """Guess-the-number as an OpenAI-client agent: the same game as the GuessNumber environment."""
    env = GuessNumber()
    messages = [{"role": "user", "content": env.reset(seed=0, secret=row["secret"])}]
    total = 0.0
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        observation, done, reward = env.step(text)  # the environment scores every turn, a cut one too
        total += reward
        if done or observation is None or reply.choices[0].finish_reason == "length":
            break
        messages.append({"role": "user", "content": observation})
    return total


def rows_of(batch, row):
    on = batch.response_attention[row].bool()
    return (batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist(), batch.response_ids[row][on].tolist(),
            batch.response_mask[row][on].tolist(), batch.rollout_log_probs[row][on])


def test_an_agent_and_the_same_episodes_as_an_environment_give_the_same_trajectories(warm_model):
    worker = RolloutWorker(0, 1, model_path=warm_model)
    items = [PromptItem([], "", {"prompt": "Guess 1-8", "secret": s}, "g", index=i) for i, s in enumerate((2, 5, 8))]
    params = SamplingParams(n=4, max_new_tokens=BUDGET, temperature=1.0)
    requests = [RolloutItem(it.prompt_ids, it.index, k, it.row) for k, it in enumerate(items)]
    loop = EnvLoop(ChatRenderer(worker.tokenizer), env_cls=GuessNumber, tools=None, max_turns=MAX_TURNS,
                   opening=lambda row: [{"role": "user", "content": "Guess 1-8"}])
    expected = run_rollout(loop, worker.engine, requests, params, 11, decode=worker.tokenizer.decode)
    loop_metrics = metrics_of(expected, True, False, episodes=12)
    engine = Recording(worker.engine)
    with Endpoint(worker.tokenizer, max_calls=MAX_TURNS) as endpoint:
        episodes = AgentEpisodes(guess_agent, endpoint, timeout_s=60, error_score=0.0,
                                 opening=lambda row: [{"role": "user", "content": "Guess 1-8"}])
        batch = run_rollout(episodes, engine, requests, params, 11, decode=worker.tokenizer.decode)
        metrics = metrics_of(batch, True, True, episodes=12)
    sampled = {(tuple(p), stream): (ids, torch.tensor(lps)) for stream, (p, ids, lps) in engine.sampled.items()}
    assert loop_metrics["multi_turn/turns/max"] >= 2, "the warm-started model should play several turns"
    assert metrics["agent/samples/mean"] == 1 and metrics["agent/errors"] == 0
    assert metrics["agent/calls/mean"] == pytest.approx(loop_metrics["multi_turn/turns/mean"])
    assert len(batch) == len(expected) == 12
    assert batch.group_ids.tolist() == expected.group_ids.tolist()
    assert batch.env_rewards.tolist() == expected.env_rewards.tolist()
    assert batch.truncated.tolist() == expected.truncated.tolist()
    for row in range(len(batch)):
        prompt, ids, mask, log_probs = rows_of(batch, row)
        e_prompt, e_ids, e_mask, e_log_probs = rows_of(expected, row)
        assert (prompt, ids, mask) == (e_prompt, e_ids, e_mask), row
        assert torch.allclose(log_probs, e_log_probs, atol=1e-5)
        assert batch.conversations[row] == expected.conversations[row]
    # every model segment recorded is what the engine sampled for that call, ids and log-probs
    model_ids = [i for row in range(len(batch)) for i, m in zip(rows_of(batch, row)[1], rows_of(batch, row)[2]) if m]
    assert model_ids == [t for row in range(len(batch)) for t in
                         [i for i, m in zip(rows_of(expected, row)[1], rows_of(expected, row)[2]) if m]]
    for row in range(len(batch)):  # row = episode j of item i, sample 0
        prompt, ids, mask, log_probs = rows_of(batch, row)
        at, prefix, turn = 0, list(prompt), 0
        while at < len(ids):
            if mask[at]:  # a model segment: the engine's reply to the trajectory so far, on the call's stream
                got, lps = sampled[tuple(prefix), stream_seed(11, row // 4, 4, row % 4, turn)]
                assert ids[at:at + len(got)] == got
                assert torch.equal(log_probs[at:at + len(got)], lps)
                prefix, at, turn = prefix + got, at + len(got), turn + 1
            else:
                prefix, at = prefix + [ids[at]], at + 1


def test_the_calculator_agent_example_trains(tmp_path, warm_model):
    train(load_config(str(EXAMPLE / "calculator_agent.yaml"), [
        f"model.path={warm_model}", "sft.steps=0", f"trainer.output_dir={tmp_path}", "trainer.total_steps=1",
        "trainer.val_every=1", "data.val_max_prompts=4", "data.prompts_per_step=2", "rollout.n=2",
        f"rollout.agent.program={EXAMPLE / 'calculator_agent.py'}:run", "trainer.log_samples=2"]))
    (record,) = [r for r in read_metrics(tmp_path) if r["step"] == 1]
    for key in ("agent/calls/mean", "agent/samples/mean", "agent/errors", "agent/timeouts", "reward/agent/mean",
                "critic/score/mean", "actor/pg_loss", "val/mean@1"):
        assert key in record, key
    assert record["agent/errors"] == 0 and record["agent/timeouts"] == 0 and record["agent/calls/mean"] >= 1
