"""The reward-model role: an HF sequence-classification model that scores (prompt, completion) text.

The model's own tokenizer reads `prompt + completion` (the policy's tokenizer may differ), right-
padded, truncated to `max_length` tokens from the left so the completion is always seen; the
score is the model's single logit at the last real token (what `...ForSequenceClassification`
returns when the config knows its pad token).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.models.loading import load_reward_model, load_tokenizer
from grpoflow.training.precision import role_precision


class RewardModelWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, max_length: int = 1024,
                 batch_size: int = 32) -> None:
        self.tokenizer = load_tokenizer(model_path)
        self.tokenizer.truncation_side = "left"
        self.model = load_reward_model(model_path, dtype=role_precision("reward_model").weights).eval()
        self.max_length, self.batch_size = max_length, batch_size

    @torch.no_grad()
    def compute_rm_score(self, texts: list[str]) -> Tensor:
        """[B] the score of each text (prompt + completion)."""
        scores = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length, add_special_tokens=False)
            scores.append(self.model(**enc).logits[:, 0].float())
        return torch.cat(scores) if scores else torch.zeros(0)
