"""The critic role (PPO with GAE): a copy of the LM with a scalar value head.

Values are aligned with response tokens like log-probs: the value of the state before
response token t is read at input position P - 1 + t. The critic trains on the returns the
advantage estimator produced, with PPO's clipped value loss, in the same mini-batch x
token-budget micro-batch schedule as the actor (and the same global-count normalisation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms import aggregate_loss, clipped_value_loss
from grpoflow.config import CriticConfig
from grpoflow.data.batch import Batch
from grpoflow.models.loading import load_value_model
from grpoflow.models.logprobs import compute_autocast
from grpoflow.training.engine import TrainEngine
from grpoflow.training.forward import Counts, UpdateSchedule, per_token_forward, train_on_batch
from grpoflow.training.precision import role_precision


def response_values(model: torch.nn.Module, mb: Batch, compute_dtype: str | None = None) -> Tensor:
    """[b, R] value of the state before each response token (float32; the forward under `compute_autocast`)."""
    p, r = mb.prompt_ids.shape[1], mb.response_ids.shape[1]
    attention_mask = mb.attention_mask
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with compute_autocast(compute_dtype, mb.input_ids.device):
        out = model(input_ids=mb.input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out.logits[:, p - 1:p - 1 + r, 0].float()


class CriticWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, cfg: CriticConfig, schedule: UpdateSchedule,
                 seed: int, compute_dtype: str | None = "float32") -> None:
        """`schedule`: the actor's mini-batches, epochs and micro-batch budget (the critic trains on the same
        batches as the actor)."""
        torch.manual_seed(seed)
        precision = role_precision("critic", compute_dtype=compute_dtype)  # float32 weights, autocast
        self.rank, self.cfg, self.compute_dtype, self.schedule = rank, cfg, precision.compute_dtype, schedule
        self.engine = TrainEngine(load_value_model(cfg.model_path or model_path, dtype=precision.weights), lr=cfg.lr,
                                  grad_clip=cfg.grad_clip, precision=precision)

    def save_checkpoint(self, folder: str) -> None:
        """Every rank calls it (gathering sharded weights is a collective); rank 0 writes."""
        self.engine.save(folder)

    def load_checkpoint(self, folder: str) -> None:
        self.engine.load(folder)

    def compute_values(self, batch: Batch) -> Tensor:
        """[B, R] values before each response token (0 on padding). A collective when sharded, like every forward."""
        return per_token_forward(self.engine.model, batch,
                                 lambda model, mb: (response_values(model, mb, self.compute_dtype),),
                                 max_tokens=self.schedule.max_tokens_per_microbatch)[0]

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Regress values on `returns` with the clipped value loss; mean metrics over optimizer steps
        (each summed over ranks by the engine, so every rank returns the global value)."""
        return train_on_batch(self.engine, batch, self.schedule, self._loss, prefix="critic")

    def _loss(self, model: torch.nn.Module, mb: Batch, counts: Counts) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb.response_mask.float()
        values = response_values(model, mb, self.compute_dtype)
        assert mb.values is not None and mb.returns is not None, "the critic update needs values and returns"
        loss_mat, per_token = clipped_value_loss(values=values, old_values=mb.values, returns=mb.returns,
                                                 response_mask=mask, cliprange_value=self.cfg.cliprange_value)
        loss = aggregate_loss(loss_mat, mask, "token-mean", num_tokens=counts.tokens)
        metrics = {"critic/vf_loss": loss.detach(),
                   "critic/vpred_mean": aggregate_loss(values.detach(), mask, "token-mean", num_tokens=counts.tokens)}
        for name, m in per_token.items():
            metrics[f"critic/{name}"] = aggregate_loss(m, mask, "token-mean", num_tokens=counts.tokens)
        return loss, metrics
