"""rollout.lora_sync=adapter on the HF engine (CPU, or CUDA where there is one): only adapter tensors move, the engine
then samples the same policy as the merged path, and a whole run's engine keeps up with the trained adapters.

Both tests assert float32 figures (log-probs equal to 1e-4, a mismatch under 1e-6), so both pin float32: on a GPU
the default compute dtype is bfloat16 (training/bf16_units.py)."""

import pytest
import torch

pytest.importorskip("peft")

from grpoflow.config import ActorConfig, LoRAConfig, ModelConfig, load_config  # noqa: E402
from grpoflow.controller.metrics import read_metrics  # noqa: E402
from grpoflow.commands.run import train  # noqa: E402
from grpoflow.models.loading import load_tokenizer  # noqa: E402
from grpoflow.engines.factory import build_engine  # noqa: E402
from grpoflow.engines.protocol import SamplingParams  # noqa: E402
from grpoflow.workers.actor import ActorWorker  # noqa: E402
from grpoflow.engines.whole_batch import generate_batch  # noqa: E402

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}
PROMPTS = [[40, 41, 42], [50, 51], [60, 61, 62, 63, 64]]


def nbytes(stream) -> int:
    return sum(t.numel() * t.element_size() for _, t in stream)


def test_adapter_sync_moves_adapters_only_and_samples_the_merged_policy(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    fp32_lora = ModelConfig(compute_dtype="float32",
                            lora=LoRAConfig(rank=4, alpha=8.0, target_modules=LORA["target_modules"]))
    merged_actor = ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=1.0, horizon=8, seed=0,
                               model_cfg=fp32_lora)
    adapter_actor = ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=1.0, horizon=8,
                                seed=0, model_cfg=fp32_lora, lora_sync="adapter")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the same non-zero adapters in both (as after training)
        for (name, a), (_, b) in zip(merged_actor.engine.model.named_parameters(),
                                     adapter_actor.engine.model.named_parameters()):
            if "lora_B" in name:
                a.copy_(0.3 * torch.randn(a.shape, generator=g))
                b.copy_(a)
    adapter_names = [n for n, _ in adapter_actor.named_weights()]
    assert adapter_names and all(".lora_A." in n or ".lora_B." in n for n in adapter_names)
    merged_bytes, adapter_bytes = nbytes(merged_actor.named_weights()), nbytes(adapter_actor.named_weights())
    # rank-4 A [4, in] and B [out, 4] on q, v, up of each layer: far fewer bytes than the whole model
    lora_params = sum(p.numel() for n, p in adapter_actor.engine.model.named_parameters() if "lora_" in n)
    assert adapter_bytes == 4 * lora_params and adapter_bytes < merged_bytes / 5

    merged = build_engine("hf", tiny_model_path, tokenizer, dtype="float32")
    adapter = build_engine("hf", tiny_model_path, tokenizer, dtype="float32", lora=LORA)
    merged.update_weights(merged_actor.named_weights(), version=1)
    adapter.update_weights(adapter_actor.named_weights(), version=1)
    assert adapter.version == 1 and adapter.last_sync_bytes == adapter_bytes
    params = SamplingParams(n=2, max_new_tokens=8, temperature=1.0)
    a = generate_batch(merged, PROMPTS, params, seeds=[1, 2, 3])
    b = generate_batch(adapter, PROMPTS, params, seeds=[1, 2, 3])
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-4, rtol=0)
    base = generate_batch(build_engine("hf", tiny_model_path, tokenizer, dtype="float32"), PROMPTS, params,
                          seeds=[1, 2, 3])
    assert not torch.allclose(base.log_probs, b.log_probs, atol=1e-3)  # the adapters changed the policy
    with pytest.raises(KeyError, match="not a LoRA adapter tensor"):
        adapter.update_weights(merged_actor.named_weights(), version=2)


def test_a_run_with_adapter_sync_samples_the_trained_policy(tmp_path):
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", "model.path=builtin:tiny-0.5m", "sft.steps=20",
                             "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5",
                             "trainer.total_steps=4", "trainer.val_every=0", "trainer.log_every=1",
                             "model.lora.rank=4", "actor.lr=5e-2", "actor.minibatches=2", "actor.rollout_is=token",
                             "rollout.lora_sync=adapter", "reward.function=length", "model.compute_dtype=float32"])
    train(cfg)
    rows = read_metrics(tmp_path)
    # the engine samples with the adapters of the last update: its log-probs equal the trainer's (before this
    # step's first optimizer step), whereas the adapters moved (LoRA B is no longer 0 after step 1)
    assert all(r["mismatch/k3_kl"] < 1e-6 for r in rows), [r["mismatch/k3_kl"] for r in rows]
    assert rows[-1]["actor/grad_norm"] > 0
