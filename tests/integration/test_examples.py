"""The examples run as documented."""

import importlib.util
from pathlib import Path

from grpoflow.controller.metrics import read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_length_advantage_example_learns_longer_answers(tmp_path):
    spec = importlib.util.spec_from_file_location("length_advantage", EXAMPLES / "length_advantage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([f"trainer.output_dir={tmp_path}", "trainer.total_steps=12", "rollout.max_new_tokens=16"])
    lengths = [r["response_length/mean"] for r in read_metrics(tmp_path)]
    assert len(lengths) == 12
    assert sum(lengths[-4:]) / 4 > sum(lengths[:4]) / 4     # score = length, so length rises
