"""Multi-turn on SmolLM2-135M-Instruct: its real ChatML template passes the prefix-preserving check with the
separator restored, and its multi-turn log-probs are the teacher-forced ones. The two agentic recipes
(`smollm2_calculator`, `smollm2_guess_number`) run whole, as the README's commands, in test_smollm2_headlines.py."""

import pytest
import torch
from transformers import AutoTokenizer

from grpoflow.models.loading import load_causal_lm
from grpoflow.models.logprobs import response_log_probs
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import GuessNumber
from grpoflow.trajectories.loop import EnvLoop, RolloutItem
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.engines.protocol import SamplingParams
from grpoflow.workers.rollout import RolloutWorker

pytestmark = pytest.mark.real_model

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
    diff = (forced[on] - batch.rollout_log_probs[on]).abs()
    print(f"\nmulti-turn sampled vs teacher-forced log-probs: max |diff| {diff.max():.2e} over {int(on.sum())} tokens")
    assert diff.max() <= 1e-3, (diff.max(), int((diff > 1e-3).sum()), int(on.sum()))

