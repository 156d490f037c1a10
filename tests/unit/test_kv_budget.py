"""The HF engine's KV cache inside a budget (engines/kv_budget.py, continuous.py): a budget too small for the batch
samples exactly what one batch does, a few rows at a time; a request that can never fit is a clear error before
anything runs; the cache is kept in the engine's dtype; the budget from memory counts bytes per token as a model's
config says."""

import pytest
import torch
from transformers import LlamaConfig

from grpoflow.errors import UserError
from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model
from grpoflow.engines.factory import build_engine
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.kv_budget import bytes_per_column, kv_budget_columns
from grpoflow.engines.protocol import Request, SamplingParams
from grpoflow.engines.whole_batch import generate_batch

TOK = build_char_tokenizer()
MODEL = build_tiny_model(TOK, size="0.5m").eval()
PROMPTS = [list(TOK.encode(p, add_special_tokens=False)) for p in ("12+7=", "3+4=", "100+23=", "5+55+555=", "9+9=")]
PARAMS = SamplingParams(n=4, max_new_tokens=12, temperature=1.0)  # 20 rows of up to 9 + 12 tokens


def engine(budget=None, model=MODEL):
    return HFRolloutEngine(model, pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id,
                           kv_budget_columns=budget)


def most_rows_at_once(eng):
    """Generate PARAMS over PROMPTS step by step (as `generate` does), counting the live rows at each step."""
    s, streams, most = eng.sampler, [11, 22, 33, 44, 55], 0
    generate_batch(eng, PROMPTS, PARAMS, seeds=streams)  # the samples
    s.admit([(r, Request(tuple(PROMPTS[r // 4]), 12, stream=r)) for r in range(20)])
    while s.busy:
        most = max(most, sum(r is not None for r in s.rows))
        s.tick(0)
    return most


def test_a_budget_too_small_for_the_batch_samples_what_one_batch_does():
    whole, small = engine(), engine(budget=5 * 64)  # the cache starts 64 columns wide: 5 rows at a time
    one_batch = generate_batch(whole, PROMPTS, PARAMS, seeds=[11, 22, 33, 44, 55])
    in_turns = generate_batch(small, PROMPTS, PARAMS, seeds=[11, 22, 33, 44, 55])
    assert torch.equal(one_batch.response_ids, in_turns.response_ids)
    torch.testing.assert_close(one_batch.log_probs, in_turns.log_probs, atol=1e-5, rtol=1e-5)
    assert small.sampler.peak_columns <= 5 * 64 < whole.sampler.peak_columns
    assert most_rows_at_once(small) == 5 and most_rows_at_once(whole) == 20
    assert len({int(m.sum()) for m in one_batch.response_mask}) > 1  # rows finished at different steps


def test_a_request_that_can_never_fit_is_an_error_at_start(tiny_model_path):
    tok = build_char_tokenizer()
    per_column = bytes_per_column(MODEL.config, torch.float32)  # 2 x 2 layers x 2 kv heads x 32 x 4 bytes
    assert per_column == 1024
    with pytest.raises(UserError, match=r"KV cache budget holds 1024 tokens \(1 MB at 1024 bytes per token\), fewer "
                                        r"than one request of up to 2000 tokens .* raise rollout.kv_cache_mb"):
        build_engine("hf", tiny_model_path, tok, kv_cache_mb=1, longest_request=2000)
    build_engine("hf", tiny_model_path, tok, kv_cache_mb=1, longest_request=1000)  # fits
    with pytest.raises(UserError, match="needs 24 KV columns and the HF engine's KV budget holds 20"):
        engine(budget=20).sampler.admit([(0, Request(tuple(PROMPTS[0]), 17, stream=0))])


def test_the_kv_cache_is_kept_in_the_engines_dtype_and_freed_by_sleep():
    bf16 = engine(model=build_tiny_model(TOK, size="0.5m").to(torch.bfloat16).eval())
    generate_batch(bf16, PROMPTS, PARAMS, seeds=[1, 2, 3, 4, 5])
    assert {k.dtype for k in bf16.sampler.cache.keys} == {torch.bfloat16} and bf16.kv_cache_bytes() > 0
    bf16.sleep()
    assert bf16.kv_cache_bytes() == 0 and bf16.sampler.cache.keys == [None, None]
    bf16.wake()
    again = generate_batch(bf16, PROMPTS, PARAMS, seeds=[1, 2, 3, 4, 5])  # rebuilt on use
    assert again.response_ids.shape[0] == 20 and bf16.kv_cache_bytes() > 0


def test_the_budget_from_memory_counts_kv_bytes_per_token():
    qwen3_06b = LlamaConfig(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                            head_dim=128)
    assert bytes_per_column(qwen3_06b, torch.bfloat16) == 2 * 28 * 8 * 128 * 2 == 114_688
    # an H200 (141 GB): half of it less 24 bytes x 0.6B parameters of training state, in 112 KiB columns
    columns = kv_budget_columns(qwen3_06b, torch.bfloat16, kv_cache_mb=0, memory_bytes=141 * 10**9,
                                params=600_000_000)
    assert columns == int((0.5 * 141e9 - 24 * 600e6) // 114_688) == 489_153
    assert kv_budget_columns(qwen3_06b, torch.bfloat16, kv_cache_mb=112, memory_bytes=0, params=0) == 1024
