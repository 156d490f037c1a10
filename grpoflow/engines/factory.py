"""Rollout engines by name (`rollout.engine`): a registry of builders, and `build_engine`.

A builder takes the model folder, the tokenizer's pad/eos ids, the dtype and seed, and the
engine options (plain values from `RolloutConfig`; builders ignore the ones that do not apply).
vllm and sglang are imported only when chosen. A user engine registers itself with
`@register_rollout_engine("name")` or is named by its file, `rollout.engine=my_engine.py:build`.
Whatever a builder returns is checked here, once (`checked_engine`): it declares its abilities
(`EngineAbilities`) and has the verbs they promise, so no caller ever probes an engine.
"""

from __future__ import annotations

import json
from pathlib import Path

from typing import Any, Callable

import torch

from grpoflow.errors import UserError
from grpoflow.models.loading import load_causal_lm
from grpoflow.plugins import Registry
from grpoflow.engines.protocol import BatchEngine, EngineAbilities, RolloutEngine, SteppingEngine

ROLLOUT_ENGINES = Registry("rollout engine")


def register_rollout_engine(name: str, *, override: bool = False, nucleus_floors: bool = False, pausing: bool = False,
                            exact_resume: bool = False, batch_invariant: bool = False
                            ) -> Callable[[Callable], Callable]:
    """Make a builder `(model_path, *, pad_token_id, eos_token_id, dtype, seed, **options) -> RolloutEngine`
    selectable as `rollout.engine=name`, with what its engines can do, declared here so that the start-up check reads
    it before any engine is built (plan/checks.py):

    nucleus_floors: its completions record each token's top-p floor (`Completion.floors`, models/nucleus.py), so
        importance sampling works with rollout.top_p < 1.
    pausing: its engines stop every running request at a token boundary (`EngineAbilities.pausing`: rollout.partial).
    exact_resume: a paused request, continued as a new one, samples the tokens the unpaused request would have (a
        kind that replays a paused trajectory on resume, a conversation on a fresh environment, needs it).
    batch_invariant: it takes `exact=True` (rollout.exact) and then samples with the trainer's batch-invariant
        kernels (models/exact.py)."""
    return ROLLOUT_ENGINES.register(name, override=override, nucleus_floors=nucleus_floors, pausing=pausing,
                                    exact_resume=exact_resume, batch_invariant=batch_invariant)


@register_rollout_engine("hf", nucleus_floors=True, pausing=True, exact_resume=True, batch_invariant=True)
def hf_engine(model_path: str, *, pad_token_id: int, eos_token_id: int | list[int], dtype: str, seed: int,
              kv_reuse_mb: int = 1024, lora: dict | None = None, kv_cache_mb: int = 0, longest_request: int = 0,
              grouped_attention: bool = False, exact: bool = False, **gpu_options: Any) -> RolloutEngine:
    """The transformers engine on the loaded model, on this process's CUDA device when there is one (Ray gives
    each rank one), attending with models/attention.py's kernel when `grouped_attention` (else sdpa); the
    vllm/sglang options do not apply. `lora` (rollout.lora_sync=adapter): the model gets
    the policy's adapter layout and receives adapter tensors only (engines/hf_adapter.py). Its KV cache holds at
    most `kv_cache_mb` (0: from the device's memory, engines/kv_budget.py); a request of `longest_request` tokens
    (prompt + new; 0: not checked) that could never fit is an error here, before anything runs. `exact`
    (rollout.exact): batch-invariant products and attention (models/exact.py), as the trainer's."""
    from grpoflow.engines.hf import HFRolloutEngine
    from grpoflow.engines.kv_budget import bytes_per_column, check_fits, device_memory_bytes, kv_budget_columns
    from grpoflow.models.attention import use_grouped_attention
    from grpoflow.models.exact import use_exact_attention

    model = load_causal_lm(model_path, dtype=getattr(torch, dtype))
    if torch.cuda.is_available():
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    if exact:
        use_exact_attention(model)
    elif grouped_attention:
        use_grouped_attention(model)
    config, device, kv_dtype = model.config, next(model.parameters()).device, getattr(torch, dtype)
    params = sum(p.numel() for p in model.parameters())
    budget = kv_budget_columns(config, kv_dtype, kv_cache_mb=kv_cache_mb, memory_bytes=device_memory_bytes(device),
                               params=params)
    if longest_request:
        check_fits(budget, longest_request, per_column=bytes_per_column(config, kv_dtype))
    if lora is not None:
        from grpoflow.engines.hf_adapter import HFAdapterEngine
        return HFAdapterEngine(model, lora=lora, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                               kv_reuse_mb=kv_reuse_mb, kv_budget_columns=budget, exact=exact)
    return HFRolloutEngine(model, pad_token_id=pad_token_id, eos_token_id=eos_token_id, kv_reuse_mb=kv_reuse_mb,
                           kv_budget_columns=budget, exact=exact)


@register_rollout_engine("auto")
def auto_engine_builder(model_path: str, **options: Any) -> RolloutEngine:
    """`rollout.engine=auto` (the default): vllm on CUDA when it imports at the tested release, else hf
    (engines/choice.py, decided by this process's machine). `grpoflow train` resolves it once at start and names
    the choice; this builder serves a config built in code."""
    from grpoflow.engines.choice import auto_engine, probe_machine

    facts = probe_machine()
    name, _ = auto_engine(cuda_available=facts.cuda_available, vllm_version=facts.vllm_version,
                          vllm_import_error=facts.vllm_import_error)
    builder: Callable[..., RolloutEngine] = ROLLOUT_ENGINES.resolve(name)
    return builder(model_path, **options)


@register_rollout_engine("vllm", pausing=True)  # a continuation draws from a new generator
def vllm_engine(model_path: str, *, kv_reuse_mb: int = 0, kv_cache_mb: int = 0, longest_request: int = 0,
                grouped_attention: bool = False, exact: bool = False, **options: Any) -> RolloutEngine:
    from grpoflow.engines.vllm import VLLMRolloutEngine  # imports vllm: only when chosen

    return VLLMRolloutEngine(model_path, **options)


@register_rollout_engine("sglang")
def sglang_engine(model_path: str, lora: dict | None = None, *, kv_reuse_mb: int = 0, kv_cache_mb: int = 0,
                  longest_request: int = 0, grouped_attention: bool = False, exact: bool = False,
                  **options: Any) -> RolloutEngine:
    from grpoflow.engines.sglang import SGLangRolloutEngine  # imports sglang: only when chosen

    if lora is not None:
        raise NotImplementedError("rollout.lora_sync=adapter is implemented for rollout.engine=hf and vllm; use "
                                  "rollout.lora_sync=merged with sglang.")
    return SGLangRolloutEngine(model_path, **options)


def end_ids(model_path: str, tokenizer: Any) -> int | list[int]:
    """The ids that end a sample: the tokenizer's EOS, and every id of the model's `generation_config.json`
    `eos_token_id` (Llama-3-Instruct and Qwen2.5 list several; TRL and `model.generate` stop at each)."""
    eos = tokenizer.eos_token_id
    path = Path(model_path) / "generation_config.json"
    try:
        listed = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    except (OSError, ValueError):  # an unreadable generation config: the tokenizer's EOS alone
        listed = None
    extra = [listed] if isinstance(listed, int) else [i for i in listed or [] if isinstance(i, int)]
    ids = ([eos] if eos is not None else []) + [i for i in extra if i != eos]
    return ids[0] if len(ids) == 1 else ids


def build_engine(name: str, model_path: str, tokenizer: Any, *, dtype: str = "float32", seed: int = 0,
                 gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1, enforce_eager: bool = True,
                 free_cache_engine: bool = True, sync_timeout_s: float = 120.0, kv_reuse_mb: int = 1024,
                 lora: dict | None = None, lora_versions: int = 2, kv_cache_mb: int = 0,
                 longest_request: int = 0, grouped_attention: bool = False, exact: bool = False,
                 builder: Callable | None = None) -> RolloutEngine:
    """The rollout engine `name` (auto | hf | vllm | sglang | a registered or `file.py:fn` builder) for the model
    saved in `model_path`.

    dtype: the engine's weights and compute, float32 or bfloat16 — that of the trainer, so that the
    sampling log-probs match the trainer's (vLLM's own `auto` would pick bf16 for an fp32 checkpoint).
    The remaining options are `rollout.*` config fields (see RolloutConfig); hf ignores them. `lora` (rank, alpha,
    target_modules; rollout.lora_sync=adapter): the engine serves the base model with unmerged adapters and
    receives adapter tensors only; vllm keeps the last `lora_versions` of them loaded. `kv_cache_mb` (hf): the KV
    budget (0: from memory); `longest_request` (hf): prompt + new tokens of the longest request, checked against it;
    `grouped_attention` (hf): decode with models/attention.py's kernel (the rollout worker passes
    training/precision.py's decision: float32 on a CPU); `exact` (hf, rollout.exact): batch-invariant kernels
    (models/exact.py), so the trainer's log-probs equal the engine's bit for bit. `builder`: `name` resolved
    already (a run's start-up check resolves it once, plan/checks.py); None: resolved here.
    """
    if builder is None:
        builder = ROLLOUT_ENGINES.resolve_key("rollout.engine", name)
    adapters = {"lora": lora, "lora_versions": lora_versions} if lora is not None else {}
    engine = builder(model_path, pad_token_id=tokenizer.pad_token_id, eos_token_id=end_ids(model_path, tokenizer),
                     dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                     tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
                     free_cache_engine=free_cache_engine, sync_timeout_s=sync_timeout_s, kv_reuse_mb=kv_reuse_mb,
                     kv_cache_mb=kv_cache_mb, longest_request=longest_request, grouped_attention=grouped_attention,
                     **({"exact": True} if exact else {}), **adapters)
    return checked_engine(name, engine)


def checked_engine(name: str, engine: object) -> RolloutEngine:
    """`engine` if it declares its abilities (`abilities`, an `EngineAbilities`) and has the verbs every engine has
    and those its declaration promises (engines/protocol.py), else a UserError naming what to add. The one check of
    an engine's shape: callers read `engine.abilities` and never probe."""
    what = f"rollout.engine={name!r} built a {type(engine).__name__}"
    if not isinstance(engine, RolloutEngine) or not isinstance(engine.abilities, EngineAbilities):
        raise UserError(f"{what}, which is not a rollout engine: give it `abilities = EngineAbilities(stepping=..., "
                        "pausing=..., sleeping=...)` (grpoflow.engines.protocol), `version`, `pad_token_id`, "
                        "`eos_token_id`, `update_weights`, `sleep`, `wake` and `end_rollout`.")
    if engine.abilities.stepping and not isinstance(engine, SteppingEngine):
        raise UserError(f"{what}, which declares stepping but lacks a verb of it: give it `busy`, `admit`, `tick` and "
                        "`pause` (engines.protocol.StepEngine), or declare stepping=False and give it `generate`.")
    if not engine.abilities.stepping and not isinstance(engine, BatchEngine):
        raise UserError(f"{what}, which declares no stepping but has no `generate(prompts, params, seeds)` "
                        "(engines.protocol.BatchEngine).")
    return engine
