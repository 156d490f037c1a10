"""The rollout role: prompt token ids -> a `Batch` of n samples each, through a rollout engine; receives weights
(a stream when colocated with the actor, buckets through the controller when split)."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import Tensor

from grpoflow.config import RolloutConfig
from grpoflow.data.batch import Batch
from grpoflow.rollout.random_streams import prompt_seeds
from grpoflow.rollout.factory import build_engine
from grpoflow.rollout.protocol import PromptTokens, RolloutEngine, SamplingParams
from grpoflow.rollout.pushed_weights import PushedWeights
from grpoflow.models.loading import load_tokenizer


class RolloutWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, engine: str = "hf",
                 cfg: Optional[RolloutConfig] = None, dtype: Optional[str] = None, seed: int = 0,
                 lora: Optional[dict] = None) -> None:
        """`engine` names the engine, `dtype` its precision (None: float32); `cfg` (default:
        RolloutConfig()) supplies the vllm/sglang options; `lora` (rollout.lora_sync=adapter) the adapter layout."""
        cfg = cfg or RolloutConfig()
        self.tokenizer = load_tokenizer(model_path)
        self.engine: RolloutEngine = build_engine(
            engine, model_path, self.tokenizer, dtype=dtype or "float32", seed=seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization, tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=cfg.enforce_eager, free_cache_engine=cfg.free_cache_engine,
            sync_timeout_s=cfg.sync_timeout_s, lora=lora, lora_versions=cfg.lora_versions)
        self.sync_timeout_s = cfg.sync_timeout_s
        self._pushed: PushedWeights | None = None  # an update fed bucket by bucket (split placement)

    def generate(self, prompts: list[PromptTokens], params: SamplingParams, seed: int | None = None) -> Batch:
        """n samples for each prompt, prompt-major: the token tensors, sampling log-probs, weight version and
        decoded completions (the controller adds the prompt texts and dataset rows it already holds).
        Samples of prompt i share group id i (local to this call). `seed` seeds the sampling: with it,
        each prompt's samples have their own random stream (from the seed and the prompt's index), so they
        do not depend on batching or placement."""
        seeds = None
        if seed is not None:
            torch.manual_seed(seed)
            seeds = prompt_seeds(seed, torch.tensor([p.index for p in prompts], dtype=torch.long)).tolist()
        gen = self.engine.generate([p.ids for p in prompts], params, seeds=seeds)
        completions = self.tokenizer.batch_decode(
            [ids[:int(m.sum())] for ids, m in zip(gen.response_ids, gen.response_mask)], skip_special_tokens=True)
        return Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                     response_mask=gen.response_mask,
                     group_ids=torch.arange(len(prompts)).repeat_interleave(params.n),
                     rollout_log_probs=gen.log_probs, truncated=gen.truncated,
                     policy_version=torch.full((len(gen.response_ids),), self.engine.version, dtype=torch.long),
                     completions=completions)

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Load a stream of (name, tensor) (colocated: straight from the actor in this process)."""
        self.engine.update_weights(named_tensors, version)

    def begin_weight_update(self, version: int) -> None:
        """Start an update to `version` whose tensors arrive in buckets (`push_weights`), then `end_weight_update`."""
        if self._pushed is not None:
            raise RuntimeError("begin_weight_update while another update is open.")
        self._pushed = PushedWeights(self.engine, version, timeout_s=self.sync_timeout_s)

    def push_weights(self, bucket: list[tuple[str, Tensor]]) -> None:
        if self._pushed is None:
            raise RuntimeError("push_weights before begin_weight_update.")
        try:
            self._pushed.push(bucket)
        except BaseException:
            self._pushed = None  # the update failed and is over: its error, not "another update is open", is reported
            raise

    def end_weight_update(self) -> None:
        """Wait until the engine has loaded every bucket (raises what it raised, or on the deadline)."""
        pushed, self._pushed = self._pushed, None
        if pushed is None:
            raise RuntimeError("end_weight_update before begin_weight_update.")
        pushed.finish()

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()
