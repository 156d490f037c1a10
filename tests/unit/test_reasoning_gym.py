"""reasoning-gym as a task source (tasks/reasoning_gym_tasks.py), its verifier as the `reasoning_gym` reward and
the retrying environment, against the real reasoning-gym package."""

import asyncio

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

from grpoflow.config import ConfigError, load_config  # noqa: E402
from grpoflow.plan.run_plan import read_rows, val_files  # noqa: E402
from grpoflow.trajectories.env import GuardedEnvironment, load_env, reset_kwargs  # noqa: E402
from grpoflow.rewards import REWARD_FUNCTIONS  # noqa: E402
from grpoflow.tasks.reasoning_gym_tasks import default_val_spec, parse_spec  # noqa: E402

SPEC = "reasoning_gym:chain_sum?size=6&seed=1&min_terms=2&max_terms=2"


def columns(row):
    return {k: v for k, v in row.items() if k != "prompt"}


def test_the_spec_gives_size_seed_and_task_options_typed():
    assert parse_spec("reasoning_gym:chain_sum") == ("chain_sum", {"size": 500, "seed": 0})
    assert parse_spec(SPEC) == ("chain_sum", {"size": 6, "seed": 1, "min_terms": 2, "max_terms": 2})
    assert parse_spec("reasoning_gym:x?ratio=0.5&on=true") == ("x", {"size": 500, "seed": 0, "ratio": 0.5, "on": True})


def test_rows_are_the_task_entries_as_chat_prompts():
    rows = read_rows([SPEC])
    expected = reasoning_gym.create_dataset("chain_sum", size=6, seed=1, min_terms=2, max_terms=2)
    assert len(rows) == 6
    for i, row in enumerate(rows):
        assert row["prompt"] == [{"role": "user", "content": expected[i]["question"]}]
        assert row["answer"] == expected[i]["answer"]
        assert row["data_source"] == "reasoning_gym/chain_sum"
        assert len(expected[i]["metadata"]["expression"].split()) == 3  # two terms: max_terms reached the task


def test_the_reward_is_the_tasks_own_verifier():
    reward = REWARD_FUNCTIONS.get("reasoning_gym")
    row = read_rows([SPEC])[0]
    answer = row["answer"]
    assert reward("p", answer, **columns(row)) == 1.0
    assert reward("p", f"I think <answer>0</answer> no: <answer> {answer} </answer>", **columns(row)) == 1.0
    assert reward("p", f"<answer>{int(answer) + 1}</answer>", **columns(row)) == 0.0
    # countdown's verifier gives partial credit to a well-formed wrong equation: the task's own rule, not exact match
    count = read_rows(["reasoning_gym:countdown?size=2&seed=3"])[0]
    dataset = reasoning_gym.create_dataset("countdown", size=2, seed=3)
    partial = dataset.score_answer("1+1", dataset[0])
    assert 0.0 < partial < 1.0
    assert reward("p", "1+1", **columns(count)) == partial


def test_a_row_without_its_entry_is_a_clear_error():
    with pytest.raises(ValueError, match="data.train_files=\\[reasoning_gym:TASK"):
        REWARD_FUNCTIONS.get("reasoning_gym")("p", "1", answer="1")


def test_validation_defaults_to_the_same_task_past_the_training_seeds():
    cfg = load_config(None, [f"data.train_files={SPEC}"])
    assert val_files(cfg) == [default_val_spec(SPEC)]
    assert parse_spec(default_val_spec(SPEC)) == ("chain_sum", {"size": 6, "seed": 7, "min_terms": 2, "max_terms": 2})
    train, val = read_rows([SPEC]), read_rows(val_files(cfg))
    # reasoning-gym's entry i comes from Random(seed + i): with seed + 1 five of the six questions were training ones
    assert not {r["prompt"][0]["content"] for r in val} & {r["prompt"][0]["content"] for r in train}


@pytest.mark.parametrize("spec, message", [
    ("reasoning_gym:chainsum", "did you mean \\['chain_sum'"),
    ("reasoning_gym:chain_sum?bogus=1", "unexpected keyword argument 'bogus'"),
    ("reasoning_gym:chain_sum?size", "not key=value pairs"),
    ("reasoning_gym:", "names no task")])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ConfigError, match=message):
        read_rows([spec])


def test_the_environment_lets_the_model_retry_after_wrong():
    row = read_rows([SPEC])[1]
    env = GuardedEnvironment(load_env("reasoning_gym"))

    async def play():
        await env.start()
        assert await env.reset(row, seed=0) is None  # the dataset prompt opens the conversation
        wrong = str(int(row["answer"]) + 1)
        stepped = await env.step(f"<answer>{wrong}</answer>")
        assert (stepped.messages, stepped.done) == ([{"role": "user", "content": "That is not right. Try again."}],
                                                    False)
        assert await env.reward() == {"env": 0.0}
        stepped = await env.step(f"<answer>{row['answer']}</answer>")
        assert (stepped.messages, stepped.done, await env.reward()) == ([], True, {"env": 1.0})

    asyncio.run(play())


def test_the_environment_needs_reasoning_gym_rows():
    env = load_env("reasoning_gym")()
    with pytest.raises(ValueError, match="reasoning_gym column"):
        env.reset(**reset_kwargs(env.reset, {"prompt": "2+2", "answer": "4"}, seed=0))
