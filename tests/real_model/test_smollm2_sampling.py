"""The own sampling loop on a real BPE chat model: greedy equals HF `generate`, sampling log-probs equal
teacher-forced ones, generation stops at <|im_end|> and the masks end there."""

import pytest
import torch

from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.protocol import SamplingParams
from grpoflow.engines.whole_batch import generate_batch
from grpoflow.models.logprobs import response_log_probs
from real_model_helpers import chat_ids

pytestmark = pytest.mark.real_model


QUESTIONS = ["What is 7 + 5? Answer with just the number.",
             "Name a colour.",
             "Write one short sentence about the sea, then stop."]   # three prompt lengths: left padding matters


@pytest.fixture(scope="module")
def engine_and_prompts(smollm2):
    model, tokenizer = smollm2
    engine = HFRolloutEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return engine, [chat_ids(tokenizer, q) for q in QUESTIONS]


def test_eos_and_pad_are_im_end(smollm2):
    _, tokenizer = smollm2
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"


def test_greedy_equals_hf_generate(smollm2, engine_and_prompts):
    model, tokenizer = smollm2
    engine, prompts = engine_and_prompts
    gen = generate_batch(engine, prompts, SamplingParams(n=1, max_new_tokens=24, temperature=0.0))
    for i, prompt in enumerate(prompts):
        with torch.no_grad():   # one prompt at a time, no padding at all: the reference
            ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=24, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)[0, len(prompt):].tolist()
        ours = gen.response_ids[i][gen.response_mask[i].bool()].tolist()
        ref = ref[:ref.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in ref else ref
        assert ours == ref, (tokenizer.decode(ours), tokenizer.decode(ref))


def test_sampling_log_probs_equal_teacher_forced(smollm2, engine_and_prompts):
    model, _ = smollm2
    engine, prompts = engine_and_prompts
    torch.manual_seed(0)
    gen = generate_batch(engine, prompts, SamplingParams(n=2, max_new_tokens=16, temperature=0.8, top_p=1.0),
                         seeds=[11, 12, 13])
    with torch.no_grad():
        forced, _ = response_log_probs(model, gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask,
                                       temperature=0.8)
    mask = gen.response_mask.bool()
    diff = (forced - gen.log_probs)[mask].abs().max().item()
    print(f"\nsmollm2 sampling vs teacher-forced log-probs: max |diff| = {diff:.2e} over {int(mask.sum())} tokens")
    assert diff < 2e-3
    assert gen.log_probs[mask].min() < -0.5   # really sampled, not a near-greedy path


def test_generation_stops_at_im_end_and_masks_end_there(smollm2, engine_and_prompts):
    _, tokenizer = smollm2
    engine, prompts = engine_and_prompts
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    gen = generate_batch(engine, prompts, SamplingParams(n=4, max_new_tokens=40, temperature=0.7), seeds=[1, 2, 3])
    ended = 0
    for ids, mask, truncated in zip(gen.response_ids.tolist(), gen.response_mask.tolist(), gen.truncated.tolist()):
        if eos in ids:
            first = ids.index(eos)
            ended += 1
            assert mask == [1] * (first + 1) + [0] * (len(ids) - first - 1)   # the mask ends on <|im_end|>
            assert all(t == pad for t in ids[first + 1:]) and not truncated
        else:
            assert truncated and all(mask)
    assert ended >= 3, "expected several of 12 samples to end within 40 tokens"
