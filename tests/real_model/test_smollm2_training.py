"""GRPO, LoRA, export and eval on SmolLM2-135M-Instruct through the same entry points a user runs."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.cli import main
from grpoflow.config import load_config
from grpoflow.commands.export import export
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from grpoflow.models.logprobs import response_log_probs
from real_model_helpers import chat_ids

pytestmark = pytest.mark.real_model


REWARD = f"{Path(__file__).parent / 'rewards.py'}:starts_with_digit"
SMALL = ["data.train_files=[builtin:chat_addition/train]", "data.prompts_per_step=4", "rollout.n=8",
         "rollout.max_new_tokens=8", f"reward.function={REWARD}", "trainer.val_every=0", "trainer.log_every=1"]


def fixed_sequences(tokenizer):
    """Two chat prompts with fixed responses, left-padded: what the policy's log-probs are compared on."""
    pairs = [("What is 7 + 5? Answer with just the number.", "12"), ("Name a colour.", "Blue, like the sky.")]
    prompts = [chat_ids(tokenizer, q) for q, _ in pairs]
    responses = [tokenizer(a, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for _, a in pairs]
    p, r = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (p - len(x)) + x for x in prompts])
    prompt_mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    response_ids = torch.tensor([x + [pad] * (r - len(x)) for x in responses])
    response_mask = torch.tensor([[1] * len(x) + [0] * (r - len(x)) for x in responses])
    return prompt_ids, prompt_mask, response_ids, response_mask


def log_probs(model, tokenizer):
    seqs = fixed_sequences(tokenizer)
    with torch.no_grad():
        lp, _ = response_log_probs(model.eval(), *seqs)
    return lp * seqs[3]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, smollm2_path):
    """Four GRPO steps (4 prompts x 8 samples, <= 8 new tokens) on full weights; a checkpoint at the end."""
    run_dir = tmp_path_factory.mktemp("grpo")
    train(load_config(None, [f"model.path={smollm2_path}", f"trainer.output_dir={run_dir}", *SMALL,
                             "actor.lr=3e-5", "trainer.total_steps=4", "trainer.save_every=4"]))
    return run_dir


def test_a_few_grpo_steps_raise_the_sampled_reward(grpo_run):
    scores = [r["critic/score/mean"] for r in read_metrics(grpo_run) if "critic/score/mean" in r]
    print(f"\nsmollm2 sampled reward (starts with a digit) per step: {[round(s, 3) for s in scores]}")
    assert len(scores) == 4   # measured here: [0.41, 0.78, 0.91, 0.97]
    assert sum(scores[-2:]) / 2 > sum(scores[:2]) / 2 + 0.15


def test_export_is_a_plain_hf_folder_with_the_trained_weights(grpo_run, tmp_path, smollm2, smollm2_path):
    base, tokenizer = smollm2
    out = export(grpo_run, tmp_path / "exported")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    reloaded_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert reloaded_tok.chat_template == tokenizer.chat_template and reloaded_tok.eos_token == "<|im_end|>"
    checkpoint = AutoModelForCausalLM.from_pretrained(grpo_run / "checkpoints" / "step_000004" / "actor",
                                                      local_files_only=True)
    trained, before = log_probs(reloaded, tokenizer), log_probs(base, tokenizer)
    assert torch.allclose(trained, log_probs(checkpoint, tokenizer), atol=1e-5)
    assert (trained - before).abs().max() > 1e-3   # the exported policy is the trained one, not the base


def test_lora_run_exports_merged_weights_with_the_same_log_probs(tmp_path, smollm2, smollm2_path):
    from peft import PeftModel

    base, tokenizer = smollm2
    run_dir = tmp_path / "lora"
    train(load_config(None, [f"model.path={smollm2_path}", f"trainer.output_dir={run_dir}", *SMALL,
                             "model.lora.rank=8", "actor.lr=1e-3", "trainer.total_steps=1", "trainer.save_every=1"]))
    actor = run_dir / "checkpoints" / "step_000001" / "actor"
    assert (actor / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(export(run_dir, tmp_path / "merged"), local_files_only=True)
    fresh_base = AutoModelForCausalLM.from_pretrained(smollm2_path, local_files_only=True)
    with_adapter = PeftModel.from_pretrained(fresh_base, actor)   # peft's own base + adapter, the reference
    lp_merged, lp_adapter = log_probs(merged, tokenizer), log_probs(with_adapter, tokenizer)
    assert (lp_merged - lp_adapter).abs().max() < 1e-4
    assert (lp_merged - log_probs(base, tokenizer)).abs().max() > 1e-3   # the adapter changed something


def test_eval_prints_its_table(grpo_run, capsys):
    code = main(["eval", f"model.path={grpo_run}", "data.val_files=[builtin:chat_addition/val]",
                 "data.val_max_prompts=6", "rollout.max_new_tokens=16", "reward.function=gsm8k_flexible"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "step_000004" in out
    header, *rows = [line for line in out.splitlines() if line.startswith(("data_source", "chat_addition", "all"))]
    assert header.split()[0] == "data_source" and "mean@1" in header
    assert [r.split()[0] for r in rows] == ["chat_addition", "all"]
    assert 0.0 <= float(rows[-1].split()[1]) <= 1.0 and "(6 prompts)" in out
