"""Shared fixtures: tiny models saved once per test session (no model hub)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    """A saved 0.5M-parameter Llama + character tokenizer folder."""
    from grpoflow.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="0.5m", seed=0)
