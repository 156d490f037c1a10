"""Grouped-query attention as two batched matmuls, against hand-computed values and transformers' eager attention."""

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from grpoflow.training.precision import role_precision
from grpoflow.models.attention import GROUPED_ATTENTION, grouped_attention, register, use_grouped_attention
from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model


class _Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups


def test_hand_computed_two_query_heads_share_one_key_value_head():
    # one key/value head, keys [0], [1], values [10], [20]; query heads 0 and 1 hold q = ln 3 and 0, scaling 1:
    # head 0 scores [0, ln 3] -> softmax [1/4, 3/4] -> 10/4 + 60/4 = 17.5; head 1 scores [0, 0] -> 15
    query = torch.tensor([math.log(3.0), 0.0]).view(1, 2, 1, 1)
    key = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    value = torch.tensor([10.0, 20.0]).view(1, 1, 2, 1)
    out, weights = grouped_attention(_Module(2), query, key, value, None, scaling=1.0)
    assert weights is None and out.shape == (1, 1, 2, 1)  # [B, q, H, d]
    torch.testing.assert_close(out.flatten(), torch.tensor([17.5, 15.0]))
    # a mask hiding key 1 (the dtype's minimum, as transformers writes it) leaves value 10 for both heads
    mask = torch.tensor([0.0, torch.finfo(torch.float32).min]).view(1, 1, 1, 2)
    out, _ = grouped_attention(_Module(2), query, key, value, mask, scaling=1.0)
    torch.testing.assert_close(out.flatten(), torch.tensor([10.0, 10.0]))


@pytest.mark.parametrize("q_len", [1, 5])
def test_equals_transformers_eager_attention_values_and_gradients(q_len):
    g = torch.Generator().manual_seed(0)
    b, h, hk, k, d = 3, 6, 2, 7, 4
    query = torch.randn(b, h, q_len, d, generator=g, requires_grad=True)
    key = torch.randn(b, hk, k, d, generator=g, requires_grad=True)
    value = torch.randn(b, hk, k, d, generator=g, requires_grad=True)
    visible = torch.rand(b, 1, q_len, k, generator=g) > 0.3
    visible[..., 0] = True
    mask = torch.zeros(b, 1, q_len, k).masked_fill(~visible, torch.finfo(torch.float32).min)
    upstream = torch.randn(b, q_len, h, d, generator=g)
    results = []
    for fn in (grouped_attention, eager_attention_forward):
        out, _ = fn(_Module(h // hk), query, key, value, mask, scaling=d ** -0.5)
        (out * upstream).sum().backward()
        results.append((out.detach(), query.grad.clone(), key.grad.clone(), value.grad.clone()))
        query.grad = key.grad = value.grad = None
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_a_tiny_llama_gives_the_same_logits_with_grouped_attention():
    model = build_tiny_model(build_char_tokenizer(), "0.5m", seed=0)
    ids = torch.randint(5, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    before = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    model.set_attn_implementation(register())
    after = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(after[mask.bool()], before[mask.bool()], atol=1e-5, rtol=1e-5)


def test_switched_on_for_the_trained_and_frozen_roles_on_a_cpu():
    # the decision is training/precision.py's; the switch is use_grouped_attention's
    assert role_precision("policy", compute_dtype="float32").grouped_attention   # packs in float32 too
    assert role_precision("frozen", compute_dtype="float32").grouped_attention
    assert not role_precision("frozen", compute_dtype="bfloat16", cuda=True).grouped_attention
    assert not role_precision("policy", compute_dtype="float32", cuda=True).grouped_attention
    assert role_precision("policy", compute_dtype="bfloat16").grouped_attention
    assert role_precision("frozen", compute_dtype="bfloat16").grouped_attention
    assert role_precision("rollout", compute_dtype="float32").grouped_attention   # decoding in float32 on a CPU
    assert not role_precision("rollout", compute_dtype="bfloat16").grouped_attention   # in bf16 with sdpa
    assert not role_precision("rollout", compute_dtype="float32", cuda=True).grouped_attention
    model = build_tiny_model(build_char_tokenizer(), "0.5m", seed=0)
    assert use_grouped_attention(model).config._attn_implementation == GROUPED_ATTENTION


def test_the_default_float32_policy_on_a_cpu_attends_packed(tiny_model_path):
    # model.compute_dtype None resolves to float32 on a CPU: the actor's passes run packed (models/packed.py)
    from grpoflow.config.schema import ModelConfig
    from grpoflow.models.attention import attends_packed
    from grpoflow.workers.actor import build_policy

    policy = build_policy(tiny_model_path, ModelConfig(), role_precision("policy"))
    assert attends_packed(policy)
