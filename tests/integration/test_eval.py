"""`grpoflow eval` on a run folder and a model folder; validation with k samples; samples.jsonl; eval of a judged
run gives its last validation's figures."""

import json

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from grpoflow.cli import main
from grpoflow.commands.evaluate import evaluate
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from grpoflow.models.tiny import build_char_tokenizer, save_tiny_model

ARGS = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=2", "trainer.save_every=2", "trainer.val_every=2",
        "data.val_max_prompts=6", "rollout.val_n=3", "rollout.val_temperature=1.0", "trainer.log_samples=4"]


def test_validation_with_k_samples_and_samples_file(tmp_path):
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS]))
    row = read_metrics(tmp_path)[-1]
    for name in ["mean@3", "std@3", "pass@1", "pass@3", "maj@3"]:
        assert f"val/addition/{name}" in row and f"val/{name}" in row
    assert row["val/addition/pass@1"] <= row["val/addition/pass@3"]
    assert main(["plot", str(tmp_path)]) == 0                      # curves from this real run
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert "val_accuracy.png" in pngs and (tmp_path / "plots" / "report.md").exists()
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0] * 4 + [2] * 4
    assert {"prompt", "completion", "score", "data_source"} <= set(samples[0])


def test_eval_prints_a_table_per_source(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config(None, [f"trainer.output_dir={run}", *ARGS, "trainer.val_every=0", "trainer.save_every=1"]))
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    capsys.readouterr()
    # a run folder evaluates the policy of its latest checkpoint; a model folder is evaluated as it is
    for model, policy in ((run, run / "checkpoints" / "step_000002" / "actor"), (run / "sft_model", run / "sft_model")):
        assert main(["eval", "builtin", f"model.path={model}", "data.val_max_prompts=5", "rollout.val_n=2",
                     "rollout.val_temperature=1.0"]) == 0
        out = capsys.readouterr().out
        assert f"model: {policy}\n" in out, out
        header, *rows = out[out.index("data_source"):].splitlines()
        assert "pass@2" in header.split() and rows[-1] == "(5 prompts)"
        assert [r.split()[0] for r in rows[:-1]] == ["addition", "all"]
        assert all(0.0 <= float(v) <= 1.0 for r in rows[:-1] for v in r.split()[1:])


def test_eval_errors(tmp_path, capsys):
    assert main(["eval", f"model.path={tmp_path}"]) == 2
    assert "neither a model folder" in capsys.readouterr().err


def test_eval_of_a_judged_run_with_a_reward_model_gives_its_last_validation(tmp_path):
    """Rule reward + a local judge + a reward model, a system prompt through the chat template: `grpoflow eval` of the
    run folder with the run's config scores the held-out prompts as the run's last validation did, to the bit (sampled,
    so the validation seed of the checkpoint's step counts too)."""
    judge = save_tiny_model(tmp_path / "judge", size="0.5m", seed=3)
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, num_labels=1, pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    parser = tmp_path / "parse.py"  # every reply of the tiny judge parses: a score from its length
    parser.write_text("def length(text):\n    return float(len(text) % 5)\n")
    run = tmp_path / "run"
    train(load_config(None, [f"trainer.output_dir={run}", *ARGS, "trainer.val_every=2", "rollout.val_n=2",
                             "rollout.val_temperature=1.0", "data.val_max_prompts=4", "trainer.log_samples=0",
                             "reward.functions=[exact_match, judge]", "reward.weights=[1.0, 0.5]",
                             f"reward.judge.path={judge}", "reward.judge.max_tokens=4", "reward.judge.max_score=null",
                             f"reward.judge.parser={parser}:length", "reward.error_score=-3",
                             f"reward.model.path={tmp_path / 'rm'}", "reward.model.weight=0.25",
                             "data.apply_chat_template=true", "data.system_prompt='Add the numbers.'"]))
    last = [row for row in read_metrics(run) if "val/mean@2" in row][-1]
    assert last["step"] == 2 and last["reward/judge/calls"] > 0
    metrics = evaluate(load_config(str(run / "config.yaml"), [f"model.path={run}"]))
    assert metrics == {k: v for k, v in last.items() if k.startswith("val/")}
    assert metrics["val/mean@2"] > -3 * 0.5  # judged: not reward.error_score (-3) on every sample
