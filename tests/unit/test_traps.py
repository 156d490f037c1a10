"""Warnings for settings that run but cannot learn on the model given (grpoflow.commands.traps)."""

import pytest

from grpoflow.config import load_config
from grpoflow.commands.traps import RunFacts, config_traps

REAL = ["model.path=/models/instruct", "data.train_files=[my.jsonl]"]
CHAT = RunFacts(chat_template=True, prompts_total=100, prompts_overlong=0)


def test_a_real_model_with_the_defaults_has_no_trap():
    assert config_traps(load_config(None, REAL), CHAT) == []


def test_the_builtin_job_has_no_trap():
    # 2e-4 and 8 new tokens are right for a model trained from scratch with a character tokenizer
    assert config_traps(load_config(), RunFacts(chat_template=True, prompts_total=5000, prompts_overlong=0)) == []


@pytest.mark.parametrize("override, fragment", [
    ("actor.lr=2e-4", "actor.lr=0.0002 is far above"),
    ("sft.steps=100", None),                              # the default sft.lr (1e-5) is fine
    ("rollout.max_new_tokens=8", "rollout.max_new_tokens=8 is tiny for a chat model"),
    ("rollout.max_new_tokens=16", None),
    ("actor.lr=1e-4", None),                              # the threshold itself is allowed
])
def test_each_trap_fires_on_its_key_only(override, fragment):
    found = config_traps(load_config(None, [*REAL, override]), CHAT)
    assert found == [] if fragment is None else (len(found) == 1 and fragment in found[0]), found


def test_warm_start_learning_rate_of_a_from_scratch_model():
    found = config_traps(load_config(None, [*REAL, "sft.steps=10", "sft.lr=1e-3"]), CHAT)
    assert len(found) == 1 and "sft.lr=0.001" in found[0]


def test_builtin_data_with_a_real_model():
    found = config_traps(load_config(None, ["model.path=/models/instruct"]), CHAT)
    assert len(found) == 1 and "data.train_files" in found[0]


def test_tiny_budget_only_warns_for_a_chat_model():
    cfg = load_config(None, [*REAL, "rollout.max_new_tokens=8"])
    assert config_traps(cfg, RunFacts(chat_template=False, prompts_total=10, prompts_overlong=0)) == []


def test_many_overlong_prompts():
    cfg = load_config(None, REAL)
    assert config_traps(cfg, RunFacts(chat_template=True, prompts_total=100, prompts_overlong=10)) == []  # 10 %
    found = config_traps(cfg, RunFacts(chat_template=True, prompts_total=100, prompts_overlong=11))
    assert len(found) == 1 and "11 of 100" in found[0] and "data.max_prompt_length=512" in found[0]
