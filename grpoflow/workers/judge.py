"""The local judge role (reward.judge.path): a causal LM run by grpoflow's own engine that replies to judge prompts.

One batched, greedy whole-batch generation per step over every judged sample (`whole_batch.generate_batch`: the
engine's one sampling path, the HF engine's continuous sampler or any `rollout.engine`). A prompt is sent as one
user message through the judge tokenizer's chat template when it has one, else as plain text. The role is placed
on the training pool; the texts reach every rank
whole (`broadcast`) and rank 0's replies are kept, so it needs no collective.
"""

from __future__ import annotations

import torch

from grpoflow.models.loading import load_tokenizer
from grpoflow.engines.factory import build_engine
from grpoflow.engines.protocol import SamplingParams
from grpoflow.engines.whole_batch import generate_batch
from grpoflow.training.precision import role_precision


class JudgeWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, max_new_tokens: int, engine: str = "hf",
                 max_prompt_tokens: int = 4096) -> None:
        self.tokenizer = load_tokenizer(model_path)
        precision = role_precision("judge", cuda=torch.cuda.is_available())  # float32; grouped attention on a CPU
        self.engine = build_engine(engine, model_path, self.tokenizer, dtype=precision.weights_dtype,
                                   grouped_attention=precision.grouped_attention)
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens

    def prompt_ids(self, text: str) -> list[int]:
        """The judge prompt's token ids (chat template when the tokenizer has one); the end is kept when too long."""
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     tokenize=True)
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_tokens:]

    def complete(self, texts: list[str]) -> list[str]:
        """The judge's greedy reply to each text, in order."""
        if not texts:
            return []
        gen = generate_batch(self.engine, [self.prompt_ids(t) for t in texts],
                             SamplingParams(n=1, max_new_tokens=self.max_new_tokens, temperature=0.0))
        return self.tokenizer.batch_decode([ids[:int(m.sum())] for ids, m in zip(gen.response_ids, gen.response_mask)],
                                           skip_special_tokens=True)
