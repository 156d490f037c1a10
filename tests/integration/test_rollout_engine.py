"""The HF rollout engine: padding, EOS masks, sampling log-probs that match the trainer, weight sync."""

import pytest
import torch

from grpoflow.data.batch import Batch
from grpoflow.engines.rollout import HFRolloutEngine, SamplingParams, eos_response_mask, left_pad
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.workers.forward import batch_log_probs


def test_left_pad_and_eos_mask():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    # EOS (2) is kept in the mask, everything after it is not; a row with no EOS is all ones
    resp = torch.tensor([[9, 2, 9, 2], [9, 9, 9, 9], [2, 0, 0, 0]])
    assert eos_response_mask(resp, 2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    return HFRolloutEngine(load_causal_lm(tiny_model_path), pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id), tok


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_log_probs_match_the_trainer(engine, tiny_model_path, temperature):
    eng, tok = engine
    prompts = [tok.encode(p, add_special_tokens=False) for p in ["1+2=", "10+20=", "7+55="]]
    torch.manual_seed(0)
    gen = eng.generate(prompts, SamplingParams(n=4, max_new_tokens=6, temperature=temperature))
    assert gen.response_ids.shape[0] == 12 and gen.prompt_ids.shape == (12, 6)
    assert (gen.prompt_ids[0] == gen.prompt_ids[3]).all() and not (gen.prompt_ids[0] == gen.prompt_ids[4]).all()
    batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                  response_mask=gen.response_mask, group_ids=torch.arange(12) // 4)
    trainer_lp, _ = batch_log_probs(load_causal_lm(tiny_model_path), batch, temperature=temperature,
                                    max_tokens=4096, chunk_size=7)
    m = gen.response_mask.bool()
    torch.testing.assert_close(trainer_lp[m], gen.log_probs[m], atol=1e-4, rtol=1e-4)
    assert (gen.log_probs[~m] == 0).all() and (gen.response_ids[~m] == tok.pad_token_id).all()


def test_greedy_is_deterministic_and_weight_sync_changes_it(engine, tiny_model_path):
    eng, tok = engine
    prompts = [tok.encode("3+4=", add_special_tokens=False)]
    greedy = SamplingParams(n=2, max_new_tokens=5, temperature=0.0)
    a, b = eng.generate(prompts, greedy), eng.generate(prompts, greedy)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_ids[0], a.response_ids[1])
    other = load_causal_lm(tiny_model_path)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.0)
    eng.update_weights(other.named_parameters(), version=7)
    assert eng.version == 7
    assert not torch.equal(eng.generate(prompts, greedy).log_probs, a.log_probs)
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        eng.update_weights([("nope", torch.zeros(1))], version=8)
