"""verl chat prompts and TRL conversational rows reach the model exactly as the tokenizer's own
`apply_chat_template` renders them (SmolLM2's template adds a default system prompt)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpoflow.plan.run_plan import read_rows
from grpoflow.data.dataset import prepare_prompts

pytestmark = pytest.mark.real_model

MESSAGES = [[{"role": "user", "content": "What is 7 + 5? Answer with just the number."}],
            [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]]


def rendered(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]


def test_verl_parquet_rows_use_the_chat_template(tmp_path, smollm2):
    _, tokenizer = smollm2
    rows = [{"data_source": "toy", "prompt": m, "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "12"}, "extra_info": {"index": i}}
            for i, m in enumerate(MESSAGES)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    items, stats = prepare_prompts(read_rows([str(tmp_path / "train.parquet")]), tokenizer, max_prompt_length=512)
    assert stats.kept == 2
    for item, messages in zip(items, MESSAGES):
        assert item.prompt_ids == rendered(tokenizer, messages)
        assert item.prompt_text.endswith("<|im_start|>assistant\n")
    assert "You are a helpful AI assistant named SmolLM" in items[0].prompt_text   # the template's default
    assert "You are terse." in items[1].prompt_text and "SmolLM" not in items[1].prompt_text


def test_trl_conversational_and_string_rows_use_the_chat_template(tmp_path, smollm2):
    _, tokenizer = smollm2
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": m, "answer": "12"}) + "\n" for m in MESSAGES))
    items, _ = prepare_prompts(read_rows([str(path)]), tokenizer, max_prompt_length=512)
    assert [it.prompt_ids for it in items] == [rendered(tokenizer, m) for m in MESSAGES]
    assert items[0].row["answer"] == "12"   # other columns reach the reward function
    # a plain-string TRL prompt with apply_chat_template=true and a system prompt
    items, _ = prepare_prompts([{"prompt": "Name a colour."}], tokenizer, apply_chat_template=True,
                               system_prompt="You are terse.", max_prompt_length=512)
    assert items[0].prompt_ids == rendered(tokenizer, MESSAGES[1])


def test_prompts_over_the_limit_are_counted(smollm2):
    _, tokenizer = smollm2
    n = len(rendered(tokenizer, MESSAGES[0]))   # the template's default system prompt counts too
    items, stats = prepare_prompts([{"prompt": m} for m in MESSAGES], tokenizer, max_prompt_length=n - 1)
    assert [it.row["prompt"] for it in items] == [MESSAGES[1]] and stats.overlong == 1
    assert len(rendered(tokenizer, MESSAGES[1])) < n
