"""The rollout role: turns prompts into a `Batch` of n samples each, through a rollout engine."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import Tensor

from grpoflow.config import RolloutConfig
from grpoflow.data.batch import Batch
from grpoflow.rollout.random_streams import prompt_seeds
from grpoflow.rollout.factory import build_engine
from grpoflow.rollout.protocol import RolloutEngine, SamplingParams
from grpoflow.models.loading import load_tokenizer


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
