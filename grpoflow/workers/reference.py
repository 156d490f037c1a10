"""The reference role: a frozen copy of the initial policy, for the KL term."""

from __future__ import annotations

import torch

from grpoflow.data.batch import Batch
from grpoflow.models.loading import load_causal_lm
from grpoflow.workers.forward import batch_log_probs


class ReferenceWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, temperature: float, max_tokens: int,
                 chunk_size: int) -> None:
        self.model = load_causal_lm(model_path).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.temperature, self.max_tokens, self.chunk_size = temperature, max_tokens, chunk_size

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Fill `ref_log_probs` [B, R]."""
        log_probs, _ = batch_log_probs(self.model, batch, temperature=self.temperature, max_tokens=self.max_tokens,
                                       chunk_size=self.chunk_size)
        return batch.replace(ref_log_probs=log_probs)
