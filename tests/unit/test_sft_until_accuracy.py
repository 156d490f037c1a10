"""The warm start's stop rule (sft.until_accuracy): greedy exact match on held-back rows, and where it stops."""

from __future__ import annotations

import json

import pytest
import torch

from grpoflow.commands.sft import SFT_MARKER, hold_back, run_sft, sft_examples
from grpoflow.commands.sft_probe import greedy_accuracy
from grpoflow.config import ConfigError, load_config
from grpoflow.errors import UserError
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.tiny import build_char_tokenizer, save_tiny_model

TOK = build_char_tokenizer()
PROMPTS = ["12+7=", "3+4=", "100+23=", "9+9="]


@pytest.fixture(scope="module")
def sevens(tmp_path_factory):
    """A 0.5M model warm-started to answer "7" to every prompt (a few steps at a high learning rate)."""
    root = tmp_path_factory.mktemp("sevens")
    base = save_tiny_model(root / "base", size="0.5m")
    rows = [{"prompt": f"{i}+{i}=", "answer": "7"} for i in range(40)]
    return base, rows, load_causal_lm(run_sft(base, rows, root / "sft", steps=30, lr=1e-2, batch_size=16))


def test_greedy_accuracy_counts_exact_completions_of_left_padded_prompts(sevens):
    model = sevens[2]
    kwargs = dict(pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)
    prompts = [TOK.encode(p, add_special_tokens=False) for p in PROMPTS]   # 4 lengths: left padding
    seven, eight = TOK.encode("7", add_special_tokens=False), TOK.encode("8", add_special_tokens=False)
    assert greedy_accuracy(model, [(p, seven) for p in prompts], **kwargs) == 1.0
    half = [(p, seven if i % 2 else eight) for i, p in enumerate(prompts)]
    assert greedy_accuracy(model, half, **kwargs) == 0.5
    assert greedy_accuracy(model, half, batch_size=1, **kwargs) == 0.5
    # "7" then EOS is not "77": a completion must stop where the target does
    assert greedy_accuracy(model, [(p, seven + seven) for p in prompts], **kwargs) == 0.0


def test_hold_back_keeps_the_probe_out_of_training_and_refuses_conversations():
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    examples = sft_examples(rows, TOK, "prompt", "answer")
    train, probe = hold_back(examples, rows, "answer", 3, torch.Generator().manual_seed(0))
    assert len(train) == 7 and len(probe) == 3
    assert not {tuple(p) for p, _ in probe} & {tuple(p) for p, _, _ in train}
    for p, target in probe:  # the target without its EOS
        assert TOK.decode(target) == str(int(TOK.decode(p)[:-3]) + 1)
    with pytest.raises(UserError, match="probe_rows"):
        hold_back(examples, rows, "answer", 10, torch.Generator())
    chat = [{"prompt": "hi", "messages": [{"role": "assistant", "content": "hello"}]}]
    with pytest.raises(UserError, match="conversations"):
        hold_back(examples, chat, "messages", 1, torch.Generator())


def test_run_sft_stops_at_the_first_check_that_reaches_the_accuracy(sevens, tmp_path, capsys):
    base, rows, _ = sevens
    out = run_sft(base, rows, tmp_path / "sft", steps=200, lr=1e-2, batch_size=16, until_accuracy=0.9,
                  probe_rows=8, check_every=5)
    printed = capsys.readouterr().out
    stopped = int(printed.split("sft: stopped after ")[1].split(" steps")[0])
    assert 5 <= stopped < 200 and stopped % 5 == 0
    assert json.loads((tmp_path / "sft" / SFT_MARKER).read_text())["until_accuracy"] == 0.9
    assert out == str(tmp_path / "sft")
    # never reached: all steps run, and the run says so
    run_sft(base, rows, tmp_path / "sft2", steps=4, lr=1e-6, batch_size=4, until_accuracy=1.0, probe_rows=8,
            check_every=2)
    assert "WARNING: sft: greedy accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
def test_until_accuracy_outside_0_1_is_refused(value):
    with pytest.raises(ConfigError, match="sft.until_accuracy"):
        load_config(None, [f"sft.until_accuracy={value}"])
