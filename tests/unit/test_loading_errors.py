"""load_tokenizer / load_causal_lm fail with one clear sentence for each wrong folder."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.tiny import build_char_tokenizer


def test_missing_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(missing)


def test_folder_without_config(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(FileNotFoundError, match="no config.json.*save_pretrained"):
        load_causal_lm(tmp_path)


def test_folder_without_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        load_tokenizer(tmp_path)


def test_config_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match="weights"):
        load_causal_lm(tmp_path)


def test_not_a_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ValueError, match="'vit'.*not a causal"):
        load_causal_lm(tmp_path)


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(ValueError, match="config.json"):
        load_causal_lm(tmp_path)


def test_missing_pad_falls_back_to_eos(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("pad_token")
    cfg_path.write_text(json.dumps(cfg))
    loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == loaded.eos_token == "<|endoftext|>"
    assert loaded.pad_token_id == tok.eos_token_id
