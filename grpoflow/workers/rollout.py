"""The rollout role: turns prompts into a `Batch` of n samples each, through a rollout engine."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import Tensor

from grpoflow.config import RolloutConfig
from grpoflow.data.batch import Batch
from grpoflow.engines.random_streams import prompt_seeds
from grpoflow.engines.rollout import HFRolloutEngine, RolloutEngine, SamplingParams
from grpoflow.models.loading import load_causal_lm, load_tokenizer


def _hf_engine(model_path: str, *, pad_token_id: int, eos_token_id: int | list[int], dtype: str, seed: int,
               **gpu_options) -> RolloutEngine:
    """The transformers engine on the loaded model; the vllm/sglang options do not apply."""
    return HFRolloutEngine(load_causal_lm(model_path, dtype=getattr(torch, dtype)), pad_token_id=pad_token_id,
                           eos_token_id=eos_token_id)


def _vllm_engine(model_path: str, **options) -> RolloutEngine:
    from grpoflow.engines.vllm import VLLMRolloutEngine  # imports vllm: only when chosen

    return VLLMRolloutEngine(model_path, **options)


def _sglang_engine(model_path: str, **options) -> RolloutEngine:
    from grpoflow.engines.sglang import SGLangRolloutEngine  # imports sglang: only when chosen

    return SGLangRolloutEngine(model_path, **options)


# rollout.engine -> a builder taking (model_path, pad_token_id, eos_token_id, dtype, seed, engine options)
ENGINE_BUILDERS: dict[str, Callable[..., RolloutEngine]] = {"hf": _hf_engine, "vllm": _vllm_engine,
                                                           "sglang": _sglang_engine}


def build_engine(name: str, model_path: str, tokenizer, *, dtype: str = "float32", seed: int = 0,
                 gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1, enforce_eager: bool = True,
                 free_cache_engine: bool = True, sync_timeout_s: float = 120.0) -> RolloutEngine:
    """The rollout engine `name` (hf | vllm | sglang) for the model saved in `model_path`.

    dtype: the engine's weights and compute, float32 or bfloat16 — that of the trainer, so that the
    sampling log-probs match the trainer's (vLLM's own `auto` would pick bf16 for an fp32 checkpoint).
    The remaining options are `rollout.*` config fields (see RolloutConfig); hf ignores them.
    """
    if name not in ENGINE_BUILDERS:
        raise ValueError(f"rollout.engine={name!r} is not a rollout engine; use one of {sorted(ENGINE_BUILDERS)}.")
    return ENGINE_BUILDERS[name](
        model_path, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, dtype=dtype, seed=seed,
        gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
        enforce_eager=enforce_eager, free_cache_engine=free_cache_engine, sync_timeout_s=sync_timeout_s)


class RolloutWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, engine: str = "hf",
                 cfg: Optional[RolloutConfig] = None, dtype: Optional[str] = None, seed: int = 0) -> None:
        """`engine` names the engine, `dtype` its precision (None: float32); `cfg` (default:
        RolloutConfig()) supplies the vllm/sglang options."""
        cfg = cfg or RolloutConfig()
        self.tokenizer = load_tokenizer(model_path)
        self.engine: RolloutEngine = build_engine(
            engine, model_path, self.tokenizer, dtype=dtype or "float32", seed=seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization, tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=cfg.enforce_eager, free_cache_engine=cfg.free_cache_engine,
            sync_timeout_s=cfg.sync_timeout_s)

    def generate(self, items: list, params: SamplingParams, seed: int | None = None) -> Batch:
        """n samples for each PromptItem in `items`, prompt-major; samples of item i share group id i
        (ids are local to this call: the controller renumbers them for the whole step). `seed` seeds the
        sampling in this process (the controller passes one per step), and every sample records the
        engine's weight version."""
        seeds = None
        if seed is not None:  # one random stream per (seed, prompt): samples do not depend on batching or placement
            torch.manual_seed(seed)
            seeds = prompt_seeds(seed, torch.tensor([it.index for it in items], dtype=torch.long)).tolist()
        gen = self.engine.generate([it.prompt_ids for it in items], params, seeds=seeds)
        n = params.n
        completions = self.tokenizer.batch_decode(
            [ids[:int(m.sum())] for ids, m in zip(gen.response_ids, gen.response_mask)], skip_special_tokens=True)
        return Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                     response_mask=gen.response_mask,
                     group_ids=torch.arange(len(items)).repeat_interleave(n),
                     rollout_log_probs=gen.log_probs, truncated=gen.truncated,
                     policy_version=torch.full((len(gen.response_ids),), self.engine.version, dtype=torch.long),
                     prompts=[it.prompt_text for it in items for _ in range(n)], completions=completions,
                     rows=[it.row for it in items for _ in range(n)])

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()
