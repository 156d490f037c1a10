"""Shared fixtures: tiny models saved once per test session (no model hub)."""

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    """A saved 0.5M-parameter Llama + character tokenizer folder."""
    from grpoflow.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="0.5m", seed=0)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One local Ray instance for the whole test session (4 logical CPUs on any machine)."""
    ray = pytest.importorskip("ray")
    tmp = os.environ.setdefault("RAY_TMPDIR", str(tmp_path_factory.mktemp("ray")))
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=tmp,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def headlines():
    """bench/headlines.py (the recipes' headline figures and their check), imported by path: bench/ is no package."""
    spec = importlib.util.spec_from_file_location("headlines", Path(__file__).resolve().parents[1] / "bench" /
                                                  "headlines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
