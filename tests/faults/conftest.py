"""The uninterrupted run every fault run is compared with (once per session)."""

import pytest

from fault_runs import ARGS, Reference, comparable, final_weights
from grpoflow.config import load_config
from grpoflow.commands.run import train


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> Reference:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(load_config(None, [f"trainer.output_dir={out}", *ARGS]))
    return Reference(out, comparable(out), final_weights(out))
