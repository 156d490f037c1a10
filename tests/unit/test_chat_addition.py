"""The built-in chat task (grpoflow.tasks.chat_addition): disjoint seeded splits of chat-message rows."""

import pytest

from grpoflow.plan.run_plan import read_rows
from grpoflow.rewards import build_reward
from grpoflow.tasks.chat_addition import chat_addition_splits


def test_splits_are_disjoint_complete_and_seeded():
    train, val = chat_addition_splits()
    assert len(train) == 21 * 21 - 100 and len(val) == 100
    questions = [r["prompt"][0]["content"] for r in train + val]
    assert len(set(questions)) == 441
    assert chat_addition_splits() == (train, val) and chat_addition_splits(seed=1) != (train, val)


def test_rows_are_chat_messages_with_the_sum():
    row = chat_addition_splits()[1][0]
    message = row["prompt"][0]["content"]   # "What is a + b? Answer with just the number."
    a, b = (int(x) for x in message.removeprefix("What is ").split("?")[0].split(" + "))
    assert row["prompt"][0]["role"] == "user" and row["answer"] == str(a + b)
    assert row["data_source"] == "chat_addition"


def test_builtin_names_read_the_splits():
    assert read_rows(["builtin:chat_addition/val"]) == chat_addition_splits()[1]


def test_the_recipe_reward_scores_the_last_number():
    reward = build_reward("gsm8k_flexible", None, None)
    row = {"answer": "12"}
    assert reward("q", "7 + 5 = 12", **row) == 1.0
    assert reward("q", "The answer is 12. Then 3", **row) == 0.0   # the last number counts


def test_bad_split_size():
    with pytest.raises(ValueError, match="n_val=441"):
        chat_addition_splits(n_val=441)
