"""A sequence-classification reward model as a worker role: alone, combined with rules, and its errors."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from grpoflow.cli import main
from grpoflow.controller.metrics import read_metrics
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.workers.reward_model import RewardModelWorker

ARGS = ["data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4", "trainer.total_steps=2",
        "trainer.val_every=2", "data.val_max_prompts=4", "trainer.save_every=0",
        "data.train_files=builtin:addition/train"]


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=128, num_labels=1, pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("rm") / "rm"
    LlamaForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_batched_scores_equal_one_text_at_a_time(reward_model_path):
    worker = RewardModelWorker(0, 1, model_path=reward_model_path, batch_size=3)
    prompts, completions = ["1+1=", "12+30=", "7+8="], ["2", "42<junk>", "15"]
    texts = [p + c for p, c in zip(prompts, completions)]
    together = worker.compute_rm_score(texts)
    alone = torch.cat([worker.compute_rm_score([t]) for t in texts])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    assert together.std() > 0


def test_reward_model_alone_and_combined(tmp_path, tiny_model_path, reward_model_path):
    assert main(["train", "builtin", f"model.path={tiny_model_path}", "reward.function=null",
                 f"reward.model.path={reward_model_path}", f"trainer.output_dir={tmp_path / 'alone'}", *ARGS]) == 0
    for row in read_metrics(tmp_path / "alone")[1:]:
        assert row["critic/score/mean"] == pytest.approx(row["reward/model/mean"], abs=1e-6)
    # combined: score = the rule reward + reward.model.weight x the reward model's score, for every sample
    assert main(["train", "builtin", f"model.path={tiny_model_path}", "reward.function=length",
                 f"reward.model.path={reward_model_path}", "reward.model.weight=0.5",
                 f"trainer.output_dir={tmp_path / 'both'}", *ARGS]) == 0
    rm = RewardModelWorker(0, 1, model_path=reward_model_path, batch_size=1)
    samples = [(g["prompt"], s) for line in (tmp_path / "both" / "train_samples.jsonl").read_text().splitlines()
               for g in [json.loads(line)] for s in g["samples"]]
    assert len(samples) == 2 * 2 * 2   # steps x prompts x n
    for prompt, s in samples:
        model_score = float(rm.compute_rm_score([prompt + s["completion"]])[0])
        assert s["reward_parts"]["model"] == pytest.approx(model_score, abs=1e-5)
        assert s["score"] == pytest.approx(len(s["completion"]) + 0.5 * model_score, abs=1e-5)
    assert len({s["reward_parts"]["model"] for _, s in samples}) > 1   # the reward model tells samples apart
    row = read_metrics(tmp_path / "both")[-1]
    step = [s for _, s in samples[-4:]]
    assert row["reward/model/mean"] == pytest.approx(sum(s["reward_parts"]["model"] for s in step) / 4, abs=1e-5)
    assert row["critic/score/mean"] == pytest.approx(sum(s["score"] for s in step) / 4, abs=1e-5)
    assert "val/addition/mean@1" in row


def test_reward_errors(tmp_path, tiny_model_path, capsys):
    assert main(["train", "reward.function=null", f"trainer.output_dir={tmp_path}", *ARGS]) == 2
    assert "No reward" in capsys.readouterr().err
    assert main(["train", "builtin", f"model.path={tiny_model_path}", f"reward.model.path={tiny_model_path}",
                 f"trainer.output_dir={tmp_path}", *ARGS]) == 2
    err = capsys.readouterr().err
    assert "labels" in err
    assert f"reward.model.path={tiny_model_path} has" in err   # the key that exists (it said reward.model_path)
