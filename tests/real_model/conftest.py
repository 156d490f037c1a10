"""SmolLM2-135M-Instruct, a real pretrained chat model, for tests/real_model (`.ci/real_model_stage`).

The model comes from the environment, never from a hub: GRPOFLOW_SMOLLM2 names the HF folder that
`.ci/real_model_stage` dequantized from the PyPI wheel's GGUF file (cached per machine), and
GRPOFLOW_SMOLLM2_GGUF the GGUF file itself. Without them every test here is skipped, so `make test`
skips the whole folder in well under a second.
"""

import os
from pathlib import Path

import pytest

MODEL_ENV, GGUF_ENV = "GRPOFLOW_SMOLLM2", "GRPOFLOW_SMOLLM2_GGUF"


def _absent(message: str) -> None:
    """Skip, or fail where the CI stage promised the model (GRPOFLOW_REQUIRE_REAL_MODEL=1)."""
    if os.environ.get("GRPOFLOW_REQUIRE_REAL_MODEL") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    path = os.environ.get(MODEL_ENV)
    if not path or not (Path(path) / "config.json").exists():
        _absent(f"{MODEL_ENV} does not name a model folder (.ci/real_model_stage sets it)")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    path = os.environ.get(GGUF_ENV)
    if not path or not Path(path).is_file():
        _absent(f"{GGUF_ENV} does not name a .gguf file (.ci/real_model_stage sets it)")
    return path


@pytest.fixture(scope="session")
def tinker_cookbook():
    """The tinker-cookbook package, whose recipes run unchanged against `grpoflow serve tinker` (docs/tinker.md)."""
    try:
        import tinker_cookbook
    except ImportError as e:
        _absent(f"tinker_cookbook is not importable ({e}): .ci/real_model_stage installs tinker-cookbook==0.6.1 "
                "with --no-deps and the packages its recipes import")
    return tinker_cookbook


@pytest.fixture(scope="session")
def cookbook_server(tmp_path_factory, smollm2_path, tinker_cookbook):
    """One `grpoflow serve tinker` on SmolLM2 and its working folder, shared by the cookbook recipe tests."""
    from cookbook_recipes import CookbookServer

    server = CookbookServer(tmp_path_factory.mktemp("cookbook"), smollm2_path)
    yield server
    server.close()


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    """(model, tokenizer), loaded once per session, in eval mode, float32."""
    import torch

    from grpoflow.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(smollm2_path, dtype=torch.float32).eval(), load_tokenizer(smollm2_path)
