"""The sampler's log-probs of its sampled tokens equal the trainer's of the same tokens, with no one-signed offset
(issue 51): the Tinker server's sampler against `forward_backward`'s forward (a base model and a LoRA one), and
the rollout engine against `grpoflow train`'s recomputation.

The offset came from `torch.log_softmax`'s float32 sums on a CPU, which run low over a wide vocabulary whose logits
spread like a trained model's (models/log_softmax.py): so the model here has a 49,152-token head (SmolLM2's width)
scaled to logits of standard deviation ~4 (a 102-token head, the tiny models', shows no offset). Measured before
the fix on this model: mean(sampler - trainer) ~ +4e-6, on nearly every token; after: ~1e-7, rounding of either
sign.
"""

from __future__ import annotations

import pytest
import torch

from grpoflow.engines.protocol import SamplingParams
from grpoflow.engines.whole_batch import generate_batch

VOCAB = 49152
HIDDEN = 64
PROMPTS = [[5, 40, 41, 42, 9], [7, 60, 61]]
PARAMS = SamplingParams(n=8, max_new_tokens=16, temperature=1.0)
# The sampler's KV-cached decode and the trainer's full forward round differently: ~1e-6 per token here (logits of
# magnitude ~15 carry ~1e-6 of float32 rounding), of either sign. Measured over 256 tokens: mean(sampler - trainer)
# 4.0e-6, 3.8e-6, 4.1e-6 (base, LoRA, engine) with torch.log_softmax in the sampler; -1.4e-7, 2.3e-7, 5e-8 after.
SIGNED_BOUND = 1e-6
ABS_BOUND = 1e-5


@pytest.fixture(scope="module")
def wide_model_path(tmp_path_factory) -> str:
    """A 2-layer Llama with a 49,152-token head whose logits spread as a trained LM's, and the char tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpoflow.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        with torch.no_grad():  # the final norm gives |h| ~ sqrt(HIDDEN): logits of standard deviation ~4
            model.lm_head.weight.normal_(0, 4 / HIDDEN ** 0.5)
    folder = tmp_path_factory.mktemp("wide") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def sampled(generation) -> list[tuple[list[int], list[int], torch.Tensor]]:
    """(prompt, response tokens, their sampled log-probs) per row of a Generation."""
    rows = []
    for row in range(generation.response_ids.shape[0]):
        keep = generation.response_mask[row].bool()
        prompt = generation.prompt_ids[row][generation.prompt_mask[row].bool()].tolist()
        rows.append((prompt, generation.response_ids[row][keep].tolist(), generation.log_probs[row][keep]))
    return rows


def assert_no_offset(sampler: torch.Tensor, trainer: torch.Tensor) -> None:
    d = (sampler.double() - trainer.double())
    assert d.numel() > 30
    assert abs(d.mean().item()) < SIGNED_BOUND, f"one-signed offset: mean(sampler - trainer) = {d.mean():.3e}"
    assert d.abs().mean().item() < ABS_BOUND, f"mean |sampler - trainer| = {d.abs().mean():.3e}"


@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
def test_tinker_sampler_logprobs_equal_forward_backward_ones(wide_model_path, lora):
    """`asample`'s path (Samplers.engine_for + generate_batch) against `forward`'s (training.forward_backward), on
    the same weights: the base model, or a LoRA model with trained-looking adapters that the sampler merges."""
    pytest.importorskip("tinker")
    from tinker import types

    from grpoflow.tinker_server import training
    from grpoflow.tinker_server.futures import SeqGate
    from grpoflow.tinker_server.models import BaseModel, ModelSpec, TrainingModel
    from grpoflow.tinker_server.sampling import Samplers, Session, adapter_snapshot

    base = BaseModel(wide_model_path, wide_model_path)
    tm = TrainingModel("s:train:0", base, ModelSpec(base_model=wide_model_path, lora_rank=4 if lora else None,
                                                    seed=1), SeqGate(lambda job: None))
    samplers = Samplers(keep_in_memory=1)
    if lora:
        with torch.no_grad():  # as if trained: adapters that change every adapted weight
            for name, p in tm.engine.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
        snapshot = adapter_snapshot(tm.engine.model)
        assert snapshot is not None
        samplers.remember("mem:s:train:0:sampler:1", snapshot)
        session = Session("x", base, "mem:s:train:0:sampler:1", None)
    else:
        session = Session("x", base, f"base:{wide_model_path}", None)
    engine, _ = samplers.engine_for(session)
    rows = sampled(generate_batch(engine, PROMPTS, PARAMS, seeds=[3, 4]))
    data = [types.Datum(model_input=types.ModelInput.from_ints((p + r)[:-1]),
                        loss_fn_inputs={"target_tokens": (p + r)[1:]}) for p, r, _ in rows]
    outputs, _ = training.forward_backward(tm, data, "cross_entropy", {}, forward_only=True, microbatch_tokens=4096)
    trainer = torch.cat([torch.as_tensor(out["logprobs"][len(p) - 1:]) for out, (p, _, _) in zip(outputs, rows)])
    assert_no_offset(torch.cat([lp for _, _, lp in rows]), trainer)


def test_rollout_engine_logprobs_equal_the_trainers_recomputation(wide_model_path):
    """`grpoflow train`'s engine (HFRolloutEngine) against the actor's recomputation (response_log_probs, fused
    head and plain head alike): what `mismatch/*` measures every step."""
    from grpoflow.engines.hf import HFRolloutEngine
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    from grpoflow.models.logprobs import response_log_probs

    tokenizer = load_tokenizer(wide_model_path)
    trainer_model = load_causal_lm(wide_model_path)
    engine = HFRolloutEngine(load_causal_lm(wide_model_path), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    g = generate_batch(engine, PROMPTS, PARAMS, seeds=[5, 6])
    mask = g.response_mask.bool()
    for fused in (True, False):
        with torch.no_grad():
            trainer, _ = response_log_probs(trainer_model, g.prompt_ids, g.prompt_mask, g.response_ids,
                                            g.response_mask, fused=fused)
        assert_no_offset(g.log_probs[mask], trainer[mask])
