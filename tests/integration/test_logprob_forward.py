"""The trainer's log-prob forward: shared prompts, packing, the fused head and bf16 autocast against the plain
float32 forward."""

import pytest
import torch

from grpoflow.models import attention, logprobs
from grpoflow.models.loading import load_causal_lm
from grpoflow.engines.protocol import left_pad


def _batch(lengths=(5, 3, 1, 4)):
    """3 distinct left-padded prompts x 4 right-padded responses each (12 rows) of `lengths` tokens."""
    g = torch.Generator().manual_seed(0)
    prompts = [[10, 11, 12, 13, 14, 15, 16], [20, 21, 22], [30, 31, 32, 33, 34]]
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(4)], pad_token_id=0)
    response_ids = torch.randint(6, 100, (12, 5), generator=g)
    lengths = torch.tensor(list(lengths) * 3)
    response_mask = (torch.arange(5)[None] < lengths[:, None]).long()
    return prompt_ids, prompt_mask, response_ids.masked_fill(response_mask == 0, 0), response_mask


def _log_probs_and_grads(model, batch, *, share: bool, compute_dtype=None, monkeypatch, fused: bool = True,
                         entropy_coeff: float = 0.0, packed: bool = True):
    monkeypatch.setattr(logprobs, "MIN_SHARED_SAVING", 0.0 if share else 2.0)  # 2.0: never share
    monkeypatch.setattr(logprobs, "FUSED_HEAD_MODEL_TYPES", ("llama",) if fused else ())
    model.zero_grad()
    lp, ent = logprobs.response_log_probs(model, *batch, temperature=0.7, with_entropy=True,
                                          entropy_grad=entropy_coeff > 0, compute_dtype=compute_dtype,
                                          packed=packed)
    mask = batch[3]
    ((lp * mask).sum() / mask.sum() + entropy_coeff * (ent * mask).sum()).backward()
    return (lp * mask).detach(), (ent * mask).detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_shared_prompts_give_the_full_forward_log_probs_and_gradients(tiny_model_path, monkeypatch):
    model = load_causal_lm(tiny_model_path)
    full = _log_probs_and_grads(model, _batch(), share=False, monkeypatch=monkeypatch)
    shared = _log_probs_and_grads(model, _batch(), share=True, monkeypatch=monkeypatch)
    torch.testing.assert_close(shared[0], full[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], full[1], atol=1e-5, rtol=1e-5)
    for name, grad in full[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.3])
def test_fused_head_gives_the_logits_path_log_probs_entropy_and_gradients(tiny_model_path, share, entropy_coeff,
                                                                          monkeypatch):
    model = load_causal_lm(tiny_model_path)
    plain = _log_probs_and_grads(model, _batch(), share=share, fused=False, entropy_coeff=entropy_coeff,
                                 monkeypatch=monkeypatch)
    fused = _log_probs_and_grads(model, _batch(), share=share, entropy_coeff=entropy_coeff, monkeypatch=monkeypatch)
    torch.testing.assert_close(fused[0], plain[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused[1], plain[1], atol=1e-5, rtol=1e-5)
    for name, grad in plain[2].items():
        torch.testing.assert_close(fused[2][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.3])
@pytest.mark.parametrize("lengths", [(5, 3, 1, 4), (2, 0, 5, 1)])
def test_packed_batch_gives_the_padded_log_probs_entropy_and_gradients(tiny_model_path, entropy_coeff, lengths,
                                                                       monkeypatch):
    model = load_causal_lm(tiny_model_path)
    model.set_attn_implementation(attention.register())
    assert attention.attends_packed(model)
    calls = []
    decoder = model.get_decoder()
    original = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **k: calls.append(k["input_ids"].shape) or original(*a, **k))
    batch = _batch(lengths)
    padded = _log_probs_and_grads(model, batch, share=True, entropy_coeff=entropy_coeff, packed=False,
                                  monkeypatch=monkeypatch)
    assert calls == [(3, 7), (12, 5)]  # the shared prompts, then every response padded to 5
    calls.clear()
    packed = _log_probs_and_grads(model, batch, share=True, entropy_coeff=entropy_coeff, monkeypatch=monkeypatch)
    # one sequence: the 3 prompts' 7 + 3 + 5 tokens, and each response's tokens but its last
    assert calls == [(1, 15 + 3 * sum(max(n - 1, 0) for n in lengths))]
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=1e-5)
    for name, grad in padded[2].items():
        torch.testing.assert_close(packed[2][name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_packing_only_with_the_attention_that_reads_the_layout(tiny_model_path, monkeypatch):
    model = load_causal_lm(tiny_model_path)
    assert not attention.attends_packed(model)  # sdpa would attend across the packed sequence
    calls = []
    decoder = model.get_decoder()
    original = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **k: calls.append(k["input_ids"].shape) or original(*a, **k))
    logprobs.response_log_probs(model, *_batch())
    assert calls == [(3, 7), (12, 5)]


def test_fused_head_only_for_plain_linear_heads_on_one_rank(tiny_model_path):
    model = load_causal_lm(tiny_model_path)
    assert logprobs.fused_head(model) is model.lm_head
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
    assert logprobs.fused_head(model) is None  # the head's bias would be left out


@pytest.mark.parametrize("fused", [False, True])
def test_shared_forward_is_used_only_when_it_saves_tokens(tiny_model_path, fused, monkeypatch):
    monkeypatch.setattr(logprobs, "FUSED_HEAD_MODEL_TYPES", ("llama",) if fused else ())
    model = load_causal_lm(tiny_model_path)
    calls = []
    module = model.get_decoder() if fused else model  # the fused head runs the decoder, then its own head
    original = module.forward
    monkeypatch.setattr(module, "forward", lambda *a, **k: calls.append(k["input_ids"].shape) or original(*a, **k))
    batch = _batch()
    logprobs.response_log_probs(model, *batch)
    # 3 distinct prompts of 7 columns + 12 x 5 response tokens = 81 < 0.8 x 12 x 12 = 115
    assert calls == [(3, 7), (12, 5)]
    calls.clear()
    logprobs.response_log_probs(model, *(t[::4] for t in batch))  # one row per prompt: nothing to share
    assert calls == [(3, 12)]


@pytest.mark.parametrize("share", [False, True])
def test_bf16_autocast_keeps_fp32_weights_and_gradients_close_log_probs(tiny_model_path, share, monkeypatch):
    model = load_causal_lm(tiny_model_path)
    lp32, _, grads32 = _log_probs_and_grads(model, _batch(), share=share, monkeypatch=monkeypatch)
    lp16, _, grads16 = _log_probs_and_grads(model, _batch(), share=share, compute_dtype="bfloat16",
                                            monkeypatch=monkeypatch)
    assert lp16.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads16.values())
    assert not torch.equal(lp16, lp32)  # the matmuls did run in bf16
    assert (lp16 - lp32).abs().max() < 0.05
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in grads16.values()]),
                                                torch.cat([g.flatten() for g in grads32.values()]), dim=0)
    assert cos > 0.99


@pytest.mark.parametrize("packed", [False, True])
def test_a_prompt_shared_by_many_rows_gives_the_same_gradient_bits_every_time(tiny_model_path, packed, monkeypatch):
    """1,024 rows of one prompt on two threads: every row reads the prompt's last hidden state, whose gradient sums
    theirs. The backward of advanced indexing (`x[index]`) on a CPU adds float32 rows with parallel atomics, in an
    order that changes from run to run (two `make train` runs differed from step 1); index_select's backward adds
    them in order, so repeated backward passes agree bit for bit (resume = uninterrupted depends on it)."""
    model = load_causal_lm(tiny_model_path)
    if packed:
        model.set_attn_implementation(attention.register())
    rows = 1024  # rows x hidden size above torch's grain (32,768 elements), so its index backward runs parallel
    prompt_ids, prompt_mask = torch.tensor([[10, 11, 12, 13]] * rows), torch.ones(rows, 4, dtype=torch.long)
    response_ids = torch.randint(6, 100, (rows, 2), generator=torch.Generator().manual_seed(0))
    batch = (prompt_ids, prompt_mask, response_ids, torch.ones(rows, 2, dtype=torch.long))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = [_log_probs_and_grads(model, batch, share=True, packed=packed, monkeypatch=monkeypatch)[2]
                 for _ in range(6)]
    finally:
        torch.set_num_threads(threads)
    for other in grads[1:]:
        assert all(torch.equal(other[name], grad) for name, grad in grads[0].items())
