"""A verl-format parquet (prepared by `grpoflow data`) and a TRL-format jsonl train end to end, unconverted."""

import json
from pathlib import Path

import pyarrow.parquet as pq

from grpoflow.cli import main
from grpoflow.controller.metrics import read_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ARGS = ["data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=6", "trainer.total_steps=2",
        "trainer.val_every=2", "data.max_prompt_length=512", "trainer.save_every=0"]


def test_grpoflow_data_then_train_on_verl_parquet(tmp_path, tiny_model_path):
    assert main(["data", "gsm8k", "--source", str(FIXTURES / "gsm8k_sample.jsonl"), "--test-size", "2",
                 "--out", str(tmp_path / "gsm8k")]) == 0
    row = pq.read_table(tmp_path / "gsm8k" / "train.parquet").to_pylist()[0]
    assert isinstance(row["prompt"], list) and row["reward_model"]["ground_truth"]
    code = main(["train", "builtin", f"model.path={tiny_model_path}",
                 f"data.train_files={tmp_path / 'gsm8k' / 'train.parquet'}",
                 f"data.val_files={tmp_path / 'gsm8k' / 'test.parquet'}", "reward.function=gsm8k",
                 f"trainer.output_dir={tmp_path / 'run'}", *ARGS])
    assert code == 0
    rows = read_metrics(tmp_path / "run")
    assert "val/openai/gsm8k/mean@1" in rows[0] and rows[-1]["reward/errors"] == 0
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("<|im_start|>")        # the chat template was applied


def test_mixed_sources_route_rewards_and_log_each(tmp_path, tiny_model_path):
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "data_source": "addition"} for i in range(4)]
    rows += [{"prompt": f"say {i}", "data_source": "chat"} for i in range(4)]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["train", "builtin", f"model.path={tiny_model_path}", f"data.train_files={data}",
                 f"data.val_files={data}", "reward.function=exact_match", "reward.routes={chat: length}",
                 "reward.workers=2", "reward.timeout_s=5", f"trainer.output_dir={tmp_path / 'run'}", *ARGS])
    assert code == 0
    last = read_metrics(tmp_path / "run")[-1]
    assert "val/addition/mean@1" in last and "val/chat/mean@1" in last
    assert last["reward/timeouts"] == 0
