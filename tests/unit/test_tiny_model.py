"""Tiny char tokenizer and Llama models: round trips through save/load, shapes, sizes."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoTokenizer

from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.tiny import (
    TINY_SIZES,
    build_char_tokenizer,
    build_tiny_model,
    save_tiny_model,
)

TEXT = "37+48=85\n  two  spaces,\ttab? and\nnew lines!~"
MESSAGES = [
    {"role": "system", "content": "Add the numbers."},
    {"role": "user", "content": "37 + 48 =\n?"},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "m", size="0.5m", seed=0)


def test_one_token_per_char_and_no_bos():
    tok = build_char_tokenizer()
    ids = tok("37+48=")["input_ids"]
    assert len(ids) == 6  # no BOS added, one id per character
    assert tok.convert_ids_to_tokens(ids) == list("37+48=")
    assert tok.pad_token == "<|pad|>" and tok.bos_token == "<|bos|>"
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4


def test_tokenizer_round_trip_after_save_and_reload(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = TEXT.replace("\t", " ")  # tab is not in the vocabulary (it becomes <|unk|>)
    ids = reloaded(text)["input_ids"]
    assert ids == tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert reloaded.decode(ids) == text  # spaces and newlines survive
    assert reloaded.eos_token_id == tok.eos_token_id and reloaded.pad_token_id == tok.pad_token_id
    # Chat template survives and its special tokens are single tokens.
    chat = reloaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert chat == (
        "<|im_start|>system\nAdd the numbers.<|im_end|>\n"
        "<|im_start|>user\n37 + 48 =\n?<|im_end|>\n<|im_start|>assistant\n"
    )
    chat_ids = reloaded(chat, add_special_tokens=False)["input_ids"]
    assert chat_ids.count(reloaded.convert_tokens_to_ids("<|im_start|>")) == 3
    assert reloaded.decode(chat_ids) == chat


def test_unknown_char_maps_to_unk():
    tok = build_char_tokenizer()
    assert tok("a\tb")["input_ids"][1] == tok.unk_token_id


def test_model_forward_shape_and_determinism():
    tok = build_char_tokenizer()
    m1 = build_tiny_model(tok, size="0.5m", seed=3)
    m2 = build_tiny_model(tok, size="0.5m", seed=3)
    m3 = build_tiny_model(tok, size="0.5m", seed=4)
    ids = torch.tensor([tok("12+34=")["input_ids"]] * 2)
    logits = m1(input_ids=ids).logits
    assert logits.shape == (2, 6, len(tok)) and logits.dtype == torch.float32
    assert torch.equal(m1.model.embed_tokens.weight, m2.model.embed_tokens.weight)
    assert not torch.equal(m1.model.embed_tokens.weight, m3.model.embed_tokens.weight)
    assert m1.config.eos_token_id == tok.eos_token_id
    assert m1.config.pad_token_id == tok.pad_token_id


@pytest.mark.parametrize("size,expected", [("0.5m", 0.5e6), ("4m", 4.0e6)])
def test_param_counts(size, expected):
    n = sum(p.numel() for p in build_tiny_model(build_char_tokenizer(), size=size).parameters())
    assert abs(n - expected) / expected < 0.1


def test_unknown_size_is_rejected():
    with pytest.raises(ValueError, match="0.5m"):
        build_tiny_model(build_char_tokenizer(), size="7b")


def test_save_then_load_through_grpoflow_loading(tiny_dir):
    assert os.path.exists(os.path.join(tiny_dir, "model.safetensors"))
    tok = load_tokenizer(tiny_dir)
    model = load_causal_lm(tiny_dir)
    assert model.config.model_type == "llama"
    assert model.config.hidden_size == TINY_SIZES["0.5m"][0]
    fresh = build_tiny_model(build_char_tokenizer(), size="0.5m", seed=0)
    ids = torch.tensor([tok("9+9=")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, fresh(input_ids=ids).logits)
    assert load_causal_lm(tiny_dir, dtype=torch.bfloat16).dtype == torch.bfloat16
