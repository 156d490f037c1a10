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
from grpoflow.config import ActorConfig, CriticConfig
from grpoflow.data.batch import Batch
from grpoflow.training.collectives import to_device
from grpoflow.training.microbatch import split_by_tokens
from grpoflow.training.engine import TrainEngine, global_sum
from grpoflow.models.loading import load_value_model
from grpoflow.models.logprobs import compute_autocast


def response_values(model: torch.nn.Module, mb: Batch, compute_dtype: str | None = None) -> Tensor:
    """[b, R] value of the state before each response token (float32; the forward under `compute_autocast`)."""
    p, r = mb.prompt_ids.shape[1], mb.response_ids.shape[1]
    attention_mask = mb.attention_mask
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with compute_autocast(compute_dtype, mb.input_ids.device):
        out = model(input_ids=mb.input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out.logits[:, p - 1:p - 1 + r, 0].float()


class CriticWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, cfg: CriticConfig, schedule: ActorConfig,
                 seed: int, compute_dtype: str = "float32") -> None:
        torch.manual_seed(seed)
        self.rank, self.cfg, self.compute_dtype = rank, cfg, compute_dtype
        self.minibatches, self.epochs = schedule.minibatches, schedule.epochs
        self.max_tokens = schedule.max_tokens_per_microbatch
        self.engine = TrainEngine(load_value_model(cfg.model_path or model_path), lr=cfg.lr, grad_clip=cfg.grad_clip)

    def save_checkpoint(self, folder: str) -> None:
        """Every rank calls it (gathering sharded weights is a collective); rank 0 writes."""
        self.engine.save(folder)

    def load_checkpoint(self, folder: str) -> None:
        self.engine.load(folder)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """Fill `values` [B, R] (0 on padding). A collective when sharded, like every forward."""
        values = torch.zeros(batch.response_ids.shape)
        microbatches, plans = split_by_tokens(batch, self.max_tokens)
        for mb, idx in zip(microbatches, plans):
            mb = to_device(mb, self.engine.device)
            v = response_values(self.engine.model, mb, self.compute_dtype)
            if idx:  # else a padding micro-batch, only here to join the collective forward
                values[torch.as_tensor(idx), :v.shape[1]] = (v * mb.response_mask).cpu()
        return batch.replace(values=values)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Regress values on `returns` with the clipped value loss; mean metrics over optimizer steps
        (each summed over ranks by the engine, so every rank returns the global value)."""
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(self.epochs):
            for minibatch in batch.split(self.minibatches):
                num_tokens = global_sum(minibatch.response_mask.sum()).item()
                microbatches, _ = split_by_tokens(minibatch, self.max_tokens)
                metrics = self.engine.forward_backward(
                    microbatches, lambda model, mb: self._loss(model, mb, num_tokens))
                metrics["critic/grad_norm"] = self.engine.optimizer_step()
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        return {k: v / steps for k, v in totals.items()}

    def _loss(self, model: torch.nn.Module, mb: Batch, num_tokens: float) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb.response_mask.float()
        values = response_values(model, mb, self.compute_dtype)
        loss_mat, per_token = clipped_value_loss(values=values, old_values=mb.values, returns=mb.returns,
                                                 response_mask=mask, cliprange_value=self.cfg.cliprange_value)
        loss = aggregate_loss(loss_mat, mask, "token-mean", num_tokens=num_tokens)
        metrics = {"critic/vf_loss": loss.detach(),
                   "critic/vpred_mean": aggregate_loss(values.detach(), mask, "token-mean", num_tokens=num_tokens)}
        for name, m in per_token.items():
            metrics[f"critic/{name}"] = aggregate_loss(m, mask, "token-mean", num_tokens=num_tokens)
        return loss, metrics
