"""The sampling loop's preallocated KV cache: the same keys and values as transformers' DynamicLayer, and the
same samples as the loop with a DynamicCache."""

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model
from grpoflow.rollout import sampling
from grpoflow.rollout.kv_cache import PreallocatedLayer, sampling_cache


def test_preallocated_layer_holds_what_a_dynamic_layer_holds():
    torch.manual_seed(0)
    ours, theirs = PreallocatedLayer(capacity=9), DynamicLayer()
    steps = [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)]  # prefill of 4 positions, [rows, heads, q, dim]
    for layer in (ours, theirs):
        layer.update(*steps)
    for layer in (ours, theirs):
        layer.batch_repeat_interleave(3)  # rows 0, 0, 0, 1, 1, 1
    for q in range(3):  # three decode steps of one position; between them rows leave
        k, v = torch.randn(6 - q, 3, 1, 5), torch.randn(6 - q, 3, 1, 5)
        got, want = ours.update(k, v), theirs.update(k, v)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert ours.get_seq_length() == theirs.get_seq_length() == 5 + q
        keep = torch.tensor([i for i in range(6 - q) if i != 1])  # drop row 1
        ours.batch_select_indices(keep)
        theirs.batch_select_indices(keep)
    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    assert ours.keys.shape == (3, 3, 7, 5)


def test_writing_past_the_capacity_is_an_error():
    layer = PreallocatedLayer(capacity=4)
    layer.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    layer.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(RuntimeError, match="capacity of 4"):
        layer.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_sampling_cache_replaces_only_full_attention_layers():
    tokenizer = build_char_tokenizer()
    config = build_tiny_model(tokenizer, size="0.5m").config
    cache = sampling_cache(config, capacity=12)
    assert len(cache.layers) == config.num_hidden_layers
    assert all(type(layer) is PreallocatedLayer and layer.capacity == 12 for layer in cache.layers)


@pytest.mark.parametrize("drop_fraction", [1, 4, 10**6])  # drop at every finish, at a quarter, never
def test_sampling_with_the_preallocated_cache_equals_the_dynamic_cache(monkeypatch, drop_fraction):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, size="0.5m").eval()
    prompts = [tokenizer(t)["input_ids"] for t in ("12+7=", "3+4=", "100+23=")]
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    # eos = two frequent characters, so rows finish at different steps and leave the decode batch
    eos = torch.tensor([tokenizer.convert_tokens_to_ids("1"), tokenizer.convert_tokens_to_ids("2")])
    kwargs = dict(n=4, max_new_tokens=12, temperature=1.0, top_p=1.0, eos_token_ids=eos,
                  pad_token_id=tokenizer.pad_token_id, seeds=torch.tensor([5, 6, 7]))
    monkeypatch.setattr(sampling, "DROP_FRACTION", drop_fraction)
    ids_pre, lp_pre = sampling.sample(model, ids, mask, **kwargs)
    monkeypatch.setattr(sampling, "sampling_cache", lambda config, capacity: DynamicCache(config=config))
    ids_dyn, lp_dyn = sampling.sample(model, ids, mask, **kwargs)
    assert torch.equal(ids_pre, ids_dyn)
    torch.testing.assert_close(lp_pre, lp_dyn, rtol=0, atol=1e-5)
    finished_at = [(row == eos[0]) | (row == eos[1]) for row in ids_pre]
    assert len({int(f.float().argmax()) for f in finished_at if f.any()}) > 1  # rows did finish at different steps
