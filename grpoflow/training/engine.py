"""The training engine: one model, its optimizer, and the verbs a worker needs.

Verbs (verl's engine vocabulary): `forward_backward(microbatches, loss_fn)` accumulates
gradients, `optimizer_step()` clips, checks and applies them, `named_weights()` yields the
parameters one tensor at a time for weight sync, `save` / `load` checkpoint model + optimizer.

On one rank the model is a plain module. When torch.distributed is initialised with more
than one rank, the model is sharded with FSDP2 (`fully_shard` per decoder layer, then the
root) and every verb is a collective that all ranks call together:

- gradients are reduce-scattered as a SUM, not a mean: each rank's loss is already its share
  of the global loss (normalised by counts summed over ranks, `global_sum`);
- the metrics `forward_backward` returns are summed over ranks the same way;
- the grad norm is the global norm, so clipping and the NaN check agree on every rank;
- checkpoints hold full (unsharded) weights and optimizer state, so a checkpoint does not
  depend on the world size it was written with;
- computing in bf16 (a `Precision` whose `how` is `sharded`: bfloat16 over float32 parameters, decided by
  training/precision.py), the shards carry FSDP2's
  `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`: each layer is all-gathered in
  bf16 and computes in bf16, its gradients are reduce-scattered in float32 into the float32 shards
  the optimizer steps (the one-rank engine's compute copy does the same on one device).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.tensor import DTensor

from grpoflow.errors import UserError
from grpoflow.training.collectives import current_device, global_max, global_sum, rank, sum_over_ranks, to_device, \
    world_size
from grpoflow.training.microbatch import PaddingBatch
from grpoflow.training.mixed_precision import ComputeCopy
from grpoflow.training.precision import Precision
from grpoflow.models.loading import load_saved_weights, saved_state
from grpoflow.models.lora import is_adapter_weight, is_lora, merged_named_weights

__all__ = ["NonFiniteLossError", "TrainEngine", "global_sum", "lr_multiplier", "place_model", "shard_model"]

OPTIMIZER_FILE = "optimizer.pt"


class NonFiniteLossError(RuntimeError):
    """Raised before a NaN/inf gradient could reach the weights."""


def lr_multiplier(step: int, *, warmup_steps: int = 0, total_steps: int = 0, schedule: str = "constant",
                  min_lr_ratio: float = 0.0) -> float:
    """Factor on the base learning rate before optimizer step `step` (0-based).

    Linear warm-up over `warmup_steps`, then `constant` (1), `cosine` or `linear` (TRL's default, with
    min_lr_ratio=0) decay from 1 to `min_lr_ratio` at `total_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    if schedule not in ("cosine", "linear"):
        raise ValueError(f"unknown lr schedule {schedule!r}; use constant, cosine or linear.")
    progress = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
    decay = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return min_lr_ratio + (1 - min_lr_ratio) * decay


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one: the children of the model's largest `nn.ModuleList` (by
    parameter count). That is `model.layers` of an HF decoder, whether it sits under a causal-LM head,
    a token-classification head (the critic) or a PEFT wrapper."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        return []
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))  # type: ignore[attr-defined]


def place_model(model: nn.Module, precision: Precision | None = None, *, from_rank0: bool = False) -> nn.Module:
    """Put `model` on this rank's device; with more than one rank, shard it with FSDP2 first (`shard_model`, with
    `precision`'s mixed-precision policy).
    `from_rank0` (sharded): rank 0's weights are the model's; the other ranks may hold it on the meta device
    (`load_causal_lm(meta=True)`) and receive their shards from rank 0 (`materialise_from_rank0`)."""
    if world_size() == 1:
        return model.to(current_device())
    full = model.state_dict() if from_rank0 and rank() == 0 else {}
    model = shard_model(model, precision=precision)
    if from_rank0:
        materialise_from_rank0(model, full)
    return model


def materialise_from_rank0(model: nn.Module, full: dict[str, Any]) -> None:
    """Every rank's shards of `full`, rank 0's unsharded state dict (the others pass {}): a rank whose model is on
    the meta device gets storage first; parameters arrive through `set_model_state_dict(broadcast_from_rank0)`, the
    buffers no state dict holds (rotary frequencies) by a broadcast. A collective: every rank calls it."""
    device = current_device()
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for buffer in model.buffers():
        if dist.get_backend() == "nccl" or buffer.device.type == "cpu":
            dist.broadcast(buffer.data, src=0)
        else:  # gloo needs CPU tensors
            cpu = buffer.data.cpu()
            dist.broadcast(cpu, src=0)
            buffer.data.copy_(cpu)


def shard_model(model: nn.Module, *, precision: Precision | None = None) -> nn.Module:
    """`fully_shard` every decoder layer, then the root, over the ranks of the default process group (any world
    size, one included: bench/gpu_check.py runs it over NCCL at world size 1), with `mixed_precision_policy`.

    Sharded gradients are summed over ranks (gradient divide factor 1, sum-only collectives),
    because each rank's loss is already normalised by global counts.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(current_device().type, (world_size(),))
    policy = mixed_precision_policy(precision)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the rest (embeddings, final norm, head); moves shards to device
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def mixed_precision_policy(precision: Precision | None) -> Any:
    """FSDP2's policy for the shards: with a `sharded` precision (a compute dtype below the parameters', bfloat16
    over float32) parameters gathered in the compute dtype and float32 reductions, else none (every collective in
    the parameters' dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision is None or precision.how != "sharded":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)


def _full(t: Tensor) -> Tensor:
    """The whole tensor behind a (possibly sharded) parameter; a collective for a DTensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t


class TrainEngine:
    """`model` holds the trained (master) weights. With a `precision` whose `how` is `copy` (training/precision.py:
    a compute dtype below the parameters', bfloat16 over float32, on one rank without LoRA), forward and backward
    run on a bf16 copy whose gradients accumulate into the masters' float32 gradients (`mixed_precision.ComputeCopy`);
    `sharded`: FSDP2's mixed-precision policy; otherwise (None: native) the model computes as it is, autocast being
    the loss function's. `forward_model()` is the module to run."""

    def __init__(self, model: nn.Module, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 betas: tuple[float, float] = (0.9, 0.999), lr_schedule: Callable[[int], float] | None = None,
                 precision: Precision | None = None, from_rank0: bool = False) -> None:
        """`from_rank0` (sharded): the other ranks' `model` may be on the meta device; rank 0's weights are sent."""
        self.sharded = world_size() > 1
        # built on the meta device: its weights (shards) come from rank 0, never read from disk here
        self.received_weights = self.sharded and from_rank0 and any(p.is_meta for p in model.parameters())
        self.model = place_model(model, precision, from_rank0=from_rank0)
        self.compute_copy = ComputeCopy(self.model, precision.compute) \
            if precision is not None and precision.how == "copy" else None
        self.device = current_device()
        self.grad_clip = grad_clip
        params = [p for p in self.model.parameters() if p.requires_grad]  # after sharding: the local shards
        # One fused kernel over all parameters (2.4x torch's CPU default, which loops over them one op at a time);
        # sharded (DTensor) parameters keep the default implementation.
        fused = not self.sharded and self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule or (lambda step: 1.0))
        self.model.train()

    def forward_backward(self, microbatches: list, loss_fn: Callable) -> dict[str, float]:
        """Run loss_fn(model, mb) -> (loss, metrics) on each micro-batch and backprop it.

        loss_fn must return each micro-batch's share of the mini-batch loss (normalised by
        global counts), so gradients simply add up. Metrics are summed the same way, over
        micro-batches and over ranks. Micro-batches are moved to the model's device first; a
        `PaddingBatch` (see `split_by_tokens`) runs forward and backward but counts zero.
        """
        totals: dict[str, float] = {}
        model = self.forward_model()
        for mb in microbatches:
            loss, metrics = loss_fn(model, to_device(mb, self.device))
            if isinstance(mb, PaddingBatch):
                loss, metrics = loss * 0.0, {k: v * 0.0 for k, v in metrics.items()}
            self._check_finite(loss, metrics)
            loss.backward()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return sum_over_ranks(totals)

    def forward_model(self) -> nn.Module:
        """The module that forward passes run on: the bf16 compute copy (cast from the masters if they changed
        since), or the model itself."""
        return self.model if self.compute_copy is None else self.compute_copy.refresh()

    def _check_finite(self, loss: Tensor, metrics: dict) -> None:
        """Raise on every rank together if the loss is NaN/inf on any (a lone raise would hang the others)."""
        finite = bool(torch.isfinite(loss))
        if global_max(0 if finite else 1) == 0:
            return
        self.optimizer.zero_grad(set_to_none=True)
        where = f"{loss.item()}" if not finite else "non-finite on another rank"
        raise NonFiniteLossError(f"the loss became {where} (metrics of the micro-batch here: "
                                 f"{ {k: round(float(v), 4) for k, v in metrics.items()} })")

    def optimizer_step(self) -> float:
        """Clip, check and apply the accumulated gradients; returns the pre-clip (global) grad norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = _full(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the gradient norm became {norm.item()}")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.compute_copy is not None:
            self.compute_copy.mark_stale()
        return float(norm)

    def set_hyperparameters(self, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                            grad_clip: float) -> None:
        """AdamW's settings from the next `optimizer_step` on (the Tinker server's optim_step sends them with
        each step). `lr` is the base rate: the step's rate is `lr` times the schedule's current multiplier (1
        with no schedule), and later steps follow the schedule from `lr`. `grad_clip` <= 0: no clipping."""
        scheduler = self.scheduler
        scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
        for group, schedule in zip(self.optimizer.param_groups, scheduler.lr_lambdas):
            group.update(lr=lr * schedule(scheduler.last_epoch), betas=betas, eps=eps, weight_decay=weight_decay)
        self.grad_clip = grad_clip

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """(name, full tensor) one at a time, detached, for pushing to a rollout engine.

        With LoRA the adapters are merged into the base weights under the base model's names.
        Sharded, each tensor is gathered from the ranks: every rank must iterate to the end.
        """
        if is_lora(self.model) and not self.sharded:
            yield from merged_named_weights(self.model)
            return
        if is_lora(self.model):
            with self._unsharded():  # the whole model on every rank while the adapters are merged in
                merged = [(name, t.detach().clone()) for name, t in merged_named_weights(self.model)]
            yield from merged
            return
        for name, p in self.model.named_parameters():
            yield name, _full(p.detach())

    def named_adapter_weights(self) -> Iterator[tuple[str, Tensor]]:
        """Only the LoRA adapter tensors, (peft name, full tensor) one at a time (rollout.lora_sync=adapter);
        sharded, each is gathered: every rank must iterate to the end."""
        if not is_lora(self.model):
            raise RuntimeError("rollout.lora_sync=adapter sends LoRA adapters, but the policy has none; set "
                               "model.lora.rank > 0 or rollout.lora_sync=merged.")
        for name, p in self.model.named_parameters():
            if is_adapter_weight(name):
                yield name, _full(p.detach())

    @contextmanager
    def _unsharded(self) -> Iterator[None]:
        """Every FSDP group gathered, so the module's parameters are plain full tensors until the block
        ends (then freed: clone what must outlive it)."""
        from torch.distributed.fsdp import FSDPModule

        groups = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for m in groups:
            m.unshard()
        try:
            yield
        finally:
            for m in groups:
                m.reshard()

    def save(self, folder: str | Path) -> None:
        """Weights as an HF folder (safetensors) and optimizer + LR schedule as optimizer.pt.

        Sharded, every rank must call it: the full state is gathered to rank 0 (on the CPU), which writes.
        """
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=options) if self.sharded else None
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if rank() != 0:
            return
        self.model.save_pretrained(folder, safe_serialization=True,  # type: ignore[operator]
                                   **({"state_dict": weights} if self.sharded else {}))
        torch.save({"optimizer": optim, "scheduler": self.scheduler.state_dict(), "world_size": world_size()},
                   Path(folder) / OPTIMIZER_FILE)

    def load(self, folder: str | Path) -> None:
        """Restore what `save` wrote (with any world size), in place: the optimizer keeps its parameters.

        Sharded, every rank must call it; rank 0 reads the folder and sends each tensor to the ranks.
        """
        if self.compute_copy is not None:
            self.compute_copy.mark_stale()
        if not self.sharded:
            load_saved_weights(self.model, folder)
            saved = load_tensor_file(Path(folder) / OPTIMIZER_FILE)
            set_optimizer_state_dict(self.model, self.optimizer, saved["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
            self.scheduler.load_state_dict(saved["scheduler"])
            return
        weights, saved, error = {}, {}, None
        if rank() == 0:
            try:
                weights = saved_state(self.model, folder)
                saved = load_tensor_file(Path(folder) / OPTIMIZER_FILE)
            except Exception as e:  # sent to every rank, which all raise it: a lone raise would hang the others
                error = f"{type(e).__name__}: {e}"
        message = [(error, saved.get("scheduler"))]
        dist.broadcast_object_list(message, src=0)
        error, scheduler_state = message[0]
        if error is not None:
            raise RuntimeError(f"could not load the checkpoint in {folder} (read on rank 0): {error}")
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        set_model_state_dict(self.model, weights, options=options)  # type: ignore[arg-type]
        set_optimizer_state_dict(self.model, self.optimizer, saved.get("optimizer", {}), options=options)
        self.scheduler.load_state_dict(scheduler_state)


def load_tensor_file(path: Path) -> Any:
    """`torch.load(path, weights_only=True)`: tensors and plain containers only, never arbitrary objects.

    A file it refuses (crafted, damaged, or written by something else) is a ValueError naming the file; torch's
    own advice to retry with weights_only=False is dropped, since that would run whatever code the file holds.
    """
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # UnpicklingError for a refused object, RuntimeError for zip damage, ...
        first = str(e).split("\n")[0].split(". ")[0]
        if "weights_only" in first:
            first = "it holds objects other than tensors and plain values"
        raise UserError(f"{path} cannot be loaded as a grpoflow checkpoint file ({type(e).__name__}: {first}); it "
                        f"is damaged or was not written by grpoflow. Resume from another checkpoint "
                        f"(trainer.resume=<folder>); do not load this file with weights_only=False, which would "
                        f"run any code it holds.") from None

