"""The rollout role: turns prompts into a `Batch` of n samples each, through a rollout engine."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from grpoflow.data.batch import Batch
from grpoflow.engines.rollout import HFRolloutEngine, RolloutEngine, SamplingParams
from grpoflow.models.loading import load_causal_lm, load_tokenizer

ENGINES = {"hf": HFRolloutEngine}


class RolloutWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, engine: str = "hf") -> None:
        self.tokenizer = load_tokenizer(model_path)
        eos = self.tokenizer.eos_token_id
        self.engine: RolloutEngine = ENGINES[engine](load_causal_lm(model_path), pad_token_id=self.tokenizer.pad_token_id,
                                                     eos_token_id=eos)

    def generate(self, items: list, params: SamplingParams) -> Batch:
        """n samples for each PromptItem in `items`, prompt-major; samples of item i share group id i
        (ids are local to this call: the controller renumbers them for the whole step)."""
        gen = self.engine.generate([it.prompt_ids for it in items], params)
        n = params.n
        completions = self.tokenizer.batch_decode(
            [ids[:int(m.sum())] for ids, m in zip(gen.response_ids, gen.response_mask)], skip_special_tokens=True)
        return Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                     response_mask=gen.response_mask,
                     group_ids=torch.arange(len(items)).repeat_interleave(n),
                     rollout_log_probs=gen.log_probs, truncated=gen.truncated,
                     prompts=[it.prompt_text for it in items for _ in range(n)], completions=completions,
                     rows=[it.row for it in items for _ in range(n)])

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()
