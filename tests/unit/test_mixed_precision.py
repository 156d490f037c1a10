"""The bf16 compute copy with float32 master weights (training/mixed_precision.py, the engine's use of it)
against hand values, against autocast and the float32 computation, and through save / load."""

import torch

from grpoflow.models import logprobs
from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model as _build
from grpoflow.training.engine import TrainEngine
from grpoflow.training.mixed_precision import ComputeCopy
from grpoflow.training.precision import role_precision


def build_tiny_model(size: str, seed: int):
    return _build(build_char_tokenizer(), size=size, seed=seed)


def test_gradients_accumulate_into_float32_masters_by_hand():
    master = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        master.weight.copy_(torch.tensor([[1.0, 2.0]]))
    copy = ComputeCopy(master, torch.bfloat16)
    assert copy.compute.weight.dtype == torch.bfloat16 and master.weight.dtype == torch.float32
    # loss = w . x: d loss / dw = x. Two backward passes (two micro-batches): x1 + x2 = [3, 0.5] + [1, 0.25]
    for x in ([3.0, 0.5], [1.0, 0.25]):
        copy.refresh()(torch.tensor([x], dtype=torch.bfloat16)).sum().backward()
    assert master.weight.grad.dtype == torch.float32
    assert master.weight.grad.tolist() == [[4.0, 0.75]]
    assert copy.compute.weight.grad is None  # freed once added into the master


def test_refresh_casts_the_masters_only_after_they_changed():
    master = torch.nn.Linear(2, 1, bias=False)
    copy = ComputeCopy(master, torch.bfloat16)
    with torch.no_grad():
        master.weight.copy_(torch.tensor([[1.0 + 2 ** -12, -3.0]]))  # 1 + 2^-12 rounds to 1 in bf16 (8 bits)
    assert copy.refresh().weight.tolist() != [[1.0, -3.0]]  # not marked stale: the copy is not refreshed
    copy.mark_stale()
    assert copy.refresh().weight.tolist() == [[1.0, -3.0]]
    assert master.weight[0, 0].item() == 1.0 + 2 ** -12  # the master keeps its float32 bits


def test_tied_weights_stay_tied_in_the_copy():
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=True))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    compute = ComputeCopy(model, torch.bfloat16).compute
    assert compute.get_output_embeddings().weight is compute.get_input_embeddings().weight


def test_buffers_keep_their_dtype_as_in_a_model_loaded_in_bf16():
    # RoPE's inv_freq stays float32, as transformers keeps it loading a bf16 model (the rollout engine's); a bf16
    # copy of it moved the trainer's log-probs ~5e-2 from the engine's
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32))
    compute = ComputeCopy(model, torch.bfloat16).compute
    assert all(p.dtype == torch.bfloat16 for p in compute.parameters())
    assert compute.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(compute.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)


BF16 = role_precision("policy", compute_dtype="bfloat16")  # one rank, float32 masters: a bf16 compute copy


def _batch():
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(6, 60, (6, 5), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    response_ids = torch.randint(6, 60, (6, 4), generator=g)
    response_mask = (torch.arange(4)[None] < torch.tensor([4, 2, 3, 1, 4, 4])[:, None]).long()
    return prompt_ids, prompt_mask, response_ids * response_mask, response_mask


def _loss(model, batch, compute_dtype):
    lp, _ = logprobs.response_log_probs(model, *batch, temperature=0.7, with_entropy=True, compute_dtype=compute_dtype)
    return (lp * batch[3]).sum() / batch[3].sum()


def _grads(engine: TrainEngine, compute_dtype) -> torch.Tensor:
    engine.optimizer.zero_grad(set_to_none=True)
    engine.forward_backward([_batch()], lambda model, b: (_loss(model, b, compute_dtype), {}))
    return torch.cat([p.grad.flatten() for p in engine.model.parameters()])


def test_copy_gradients_match_autocast_and_float32():
    torch.manual_seed(0)
    fp32 = TrainEngine(build_tiny_model("0.5m", seed=0), lr=1e-3)
    autocast = TrainEngine(build_tiny_model("0.5m", seed=0), lr=1e-3)  # float32 model under autocast
    copied = TrainEngine(build_tiny_model("0.5m", seed=0), lr=1e-3, precision=BF16)
    assert autocast.compute_copy is None and copied.compute_copy is not None
    g32, g_auto, g_copy = _grads(fp32, None), _grads(autocast, "bfloat16"), _grads(copied, "bfloat16")
    assert all(p.grad.dtype == torch.float32 for p in copied.model.parameters())
    assert not torch.equal(g_copy, g_auto)  # the copy did compute in bf16 throughout

    def rel(a, b):
        return float((a - b).norm() / b.norm())
    # measured (0.5M tiny model): autocast 0.63 %, copy 0.76 % from float32; 0.79 % from each other
    assert rel(g_copy, g32) < 0.03 and rel(g_copy, g_auto) < 0.03 and rel(g_auto, g32) < 0.03
    assert torch.nn.functional.cosine_similarity(g_copy, g32, dim=0) > 0.999


def test_optimizer_steps_on_float32_masters_and_the_copy_follows():
    engine = TrainEngine(build_tiny_model("0.5m", seed=0), lr=1e-2, precision=BF16)
    before = [p.detach().clone() for p in engine.model.parameters()]
    _grads(engine, "bfloat16")
    engine.optimizer_step()
    masters = list(engine.model.parameters())
    assert all(p.dtype == torch.float32 for p in masters)
    assert all(s["exp_avg"].dtype == torch.float32 for s in engine.optimizer.state.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, masters))
    for master_p, compute_p in zip(masters, engine.forward_model().parameters()):
        assert torch.equal(compute_p, master_p.detach().to(torch.bfloat16))


def test_resume_from_a_checkpoint_is_exact(tmp_path):
    """Two steps, save, a fresh engine loads and both take a third step: the same float32 masters, bit for bit
    (the loaded engine's compute copy is cast from the loaded masters, not left at the initial weights)."""
    def engine():
        return TrainEngine(build_tiny_model("0.5m", seed=0), lr=1e-2, precision=BF16)

    first = engine()
    for _ in range(2):
        _grads(first, "bfloat16")
        first.optimizer_step()
    first.save(tmp_path / "ckpt")
    resumed = engine()
    resumed.forward_model()  # the copy of the initial weights exists before the load
    resumed.load(tmp_path / "ckpt")
    for e in (first, resumed):
        _grads(e, "bfloat16")
        e.optimizer_step()
    for a, b in zip(first.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)


def test_the_reference_computes_like_the_actor(tiny_model_path):
    """The reference casts itself to bf16 when the actor trains on a bf16 copy: their log-probs are equal while
    the weights are, so the KL starts at exactly 0."""
    from grpoflow.config import ActorConfig, ModelConfig
    from grpoflow.data.batch import Batch
    from grpoflow.workers.actor import ActorWorker
    from grpoflow.workers.frozen import FrozenWorker

    p, pm, r, rm = _batch()
    batch = Batch(prompt_ids=p, prompt_mask=pm, response_ids=r, response_mask=rm, group_ids=torch.arange(6) // 3)
    actor = ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=0.7, horizon=4, seed=0,
                        model_cfg=ModelConfig(compute_dtype="bfloat16"))
    ref = FrozenWorker(0, 1, model_path=tiny_model_path, temperature=0.7, max_tokens=4096, chunk_size=128,
                       compute_dtype="bfloat16")
    assert next(ref.model.parameters()).dtype == torch.bfloat16
    assert torch.equal(actor.compute_log_prob(batch), ref.log_probs(batch))
