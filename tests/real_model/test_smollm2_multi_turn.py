"""Multi-turn on SmolLM2-135M-Instruct: its real ChatML template passes the prefix-preserving check with the
separator restored, and GRPO runs end to end on the calculator tool task (the model's tool calls parsed and
run, the conversation trained token-exactly)."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.controller.run import train
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.logprobs import response_log_probs
from grpoflow.multiturn.chat import ChatRenderer
from grpoflow.multiturn.env import GuessNumber
from grpoflow.multiturn.loop import EnvLoop, RolloutItem
from grpoflow.multiturn.rollout import run_rollout
from grpoflow.rollout.protocol import SamplingParams
from grpoflow.workers.rollout import RolloutWorker

pytestmark = pytest.mark.real_model

SYSTEM = ('You can use a calculator. To use it, write <tool_call>{"name": "calculator", "arguments": '
          '{"expression": "3*4"}}</tool_call> and you will get the result. Then answer with just the number.')


def test_the_real_template_renders_token_exactly(smollm2_path):
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    r = ChatRenderer(tok)
    assert (r.turn.end_text, r.turn.separator, r.turn.end_token_id) == ("<|im_end|>", "\n", tok.eos_token_id)
    history = [{"role": "user", "content": "What is 3*4?"}, {"role": "assistant", "content": "12"}]
    got = r.continuation_ids(history, [{"role": "tool", "content": "12"}])
    assert tok.decode(got) == "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"


def test_sampled_log_probs_are_the_teacher_forced_ones_over_whole_conversations(smollm2_path):
    worker = RolloutWorker(0, 1, model_path=smollm2_path)
    loop = EnvLoop(ChatRenderer(worker.tokenizer), env_cls=GuessNumber, tools=None, max_turns=3,
                   opening=lambda row: [{"role": "user", "content": "Guess 1-8"}])
    items = [RolloutItem([], 0, 0, {"secret": 5})]
    # later turns reuse their trajectory's KV cache: the log-probs must still be the teacher-forced ones
    batch = run_rollout(loop, worker.engine, items, SamplingParams(n=4, max_new_tokens=64, temperature=1.0), 0,
                        decode=worker.tokenizer.decode)
    model = load_causal_lm(smollm2_path)
    with torch.no_grad():
        forced, _ = response_log_probs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                       batch.response_attention)
    on = batch.response_mask.bool()
    assert torch.allclose(forced[on], batch.rollout_log_probs[on], atol=1e-3)


def test_grpo_with_the_calculator_tool_runs_end_to_end(tmp_path, smollm2_path):
    cfg = load_config("calculator_tool", [
        f"model.path={smollm2_path}", "sft.steps=0", f"trainer.output_dir={tmp_path}",
        "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=96", "trainer.total_steps=2",
        "trainer.val_every=2", "data.val_max_prompts=8", "trainer.log_every=1", "trainer.log_samples=4",
        "actor.lr=1e-6", "data.apply_chat_template=true"])
    cfg.data.system_prompt = SYSTEM
    train(cfg)
    records = [r for r in read_metrics(tmp_path) if "timing_s/step" in r]
    assert len(records) == 2 and all("tools/calls" in r and "multi_turn/turns/mean" in r for r in records)
    samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert samples and samples[0]["conversation"][0] == {"role": "system", "content": SYSTEM}
