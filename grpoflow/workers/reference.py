"""The reference role: a frozen copy of the initial policy, for the KL term.

With several ranks it is sharded like the actor (FSDP2, see `training.engine.place_model`): it
costs 1/world of the model's memory per rank, and its forward is a collective.
"""

from __future__ import annotations

from torch import Tensor

from grpoflow.data.batch import Batch
from grpoflow.training.engine import place_model
from grpoflow.training.mixed_precision import wants_compute_copy
from grpoflow.models import attention
from grpoflow.models.loading import load_causal_lm
from grpoflow.training.forward import batch_log_probs


class ReferenceWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, temperature: float, max_tokens: int,
                 chunk_size: int, compute_dtype: str | None = "float32") -> None:
        model = attention.use_for_bf16_on_cpu(load_causal_lm(model_path), compute_dtype).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        copy_dtype = wants_compute_copy(model, compute_dtype, sharded=world_size > 1)
        if copy_dtype is not None:  # the actor computes on a bf16 copy: so does the reference (frozen: cast once)
            model = model.to(copy_dtype)
        self.model = place_model(model, compute_dtype)  # sharded: the actor's mixed-precision policy
        self.temperature, self.max_tokens, self.chunk_size = temperature, max_tokens, chunk_size
        self.compute_dtype = compute_dtype  # the actor's bf16 copy or autocast, so that KL is 0 while both are equal

    def compute_ref_log_prob(self, batch: Batch) -> Tensor:
        """[B, R] the reference policy's log-probs of the responses (0 on padding)."""
        log_probs, _ = batch_log_probs(self.model, batch, temperature=self.temperature, max_tokens=self.max_tokens,
                                       chunk_size=self.chunk_size, compute_dtype=self.compute_dtype)
        return log_probs
