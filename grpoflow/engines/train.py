"""The training engine: one model, its optimizer, and the verbs a worker needs.

Verbs (verl's engine vocabulary): `forward_backward(microbatches, loss_fn)` accumulates
gradients, `optimizer_step()` clips, checks and applies them, `named_weights()` yields the
parameters one tensor at a time for weight sync. On one rank the model is a plain module;
when torch.distributed is initialised the gradient-normalising counts are global sums.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from grpoflow.models.loading import load_saved_weights


class NonFiniteLossError(RuntimeError):
    """Raised before a NaN/inf gradient could reach the weights."""


def global_sum(value: float | Tensor) -> Tensor:
    """Sum of `value` over all ranks of the default process group (itself on one rank)."""
    t = torch.as_tensor(value, dtype=torch.float64).clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def lr_multiplier(step: int, *, warmup_steps: int = 0, total_steps: int = 0, schedule: str = "constant",
                  min_lr_ratio: float = 0.0) -> float:
    """Factor on the base learning rate before optimizer step `step` (0-based).

    Linear warm-up over `warmup_steps`, then `constant` (1) or `cosine` decay from 1 to
    `min_lr_ratio` at `total_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown lr schedule {schedule!r}; use constant or cosine.")
    progress = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class TrainEngine:
    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 betas: tuple[float, float] = (0.9, 0.999), lr_schedule: Callable[[int], float] | None = None
                 ) -> None:
        self.model = model
        self.grad_clip = grad_clip
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule or (lambda step: 1.0))
        self.model.train()

    def forward_backward(self, microbatches: list, loss_fn: Callable) -> dict[str, float]:
        """Run loss_fn(model, mb) -> (loss, metrics) on each micro-batch and backprop it.

        loss_fn must return each micro-batch's share of the mini-batch loss (normalised by
        global counts), so gradients simply add up. Metrics are summed the same way.
        """
        totals: dict[str, float] = {}
        for mb in microbatches:
            loss, metrics = loss_fn(self.model, mb)
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(f"the loss became {loss.item()} (metrics of the micro-batch: "
                                         f"{ {k: round(float(v), 4) for k, v in metrics.items()} })")
            loss.backward()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return totals

    def optimizer_step(self) -> float:
        """Clip, check and apply the accumulated gradients; returns the pre-clip grad norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the gradient norm became {norm.item()}")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) one at a time, detached, for pushing to a rollout engine."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    def save(self, folder: str | Path) -> None:
        """Weights as an HF folder (safetensors) and optimizer + LR schedule as optimizer.pt."""
        self.model.save_pretrained(folder, safe_serialization=True)
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                   Path(folder) / OPTIMIZER_FILE)

    def load(self, folder: str | Path) -> None:
        """Restore what `save` wrote, in place (the optimizer keeps pointing at these parameters)."""
        load_saved_weights(self.model, folder)
        opt = torch.load(Path(folder) / OPTIMIZER_FILE, weights_only=True)
        self.optimizer.load_state_dict(opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])


OPTIMIZER_FILE = "optimizer.pt"
