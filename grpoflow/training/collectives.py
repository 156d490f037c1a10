"""Where this rank's tensors live, and the few collectives the workers need.

A worker group's ranks form the default torch.distributed process group (gloo on CPU, nccl on
CUDA), set up by the backend before any worker is built. With no process group (the `local`
backend) there is one rank and every collective here is the identity.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

T = TypeVar("T")


def world_size() -> int:
    """Ranks in the default process group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def current_device() -> torch.device:
    """`cuda:LOCAL_RANK` when CUDA is available (made the current CUDA device), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _comm_device() -> torch.device:
    """Device of the tensors a collective runs on: nccl needs CUDA tensors, gloo takes CPU ones."""
    return current_device() if dist.get_backend() == "nccl" else torch.device("cpu")


def global_sum(value: float | Tensor) -> Tensor:
    """Sum of `value` over all ranks of the default process group (itself on one rank); a CPU float64."""
    t = torch.as_tensor(value, dtype=torch.float64).detach().cpu().clone()
    if world_size() > 1:
        t = t.to(_comm_device())
        dist.all_reduce(t)
    return t.cpu()


def global_max(value: int) -> int:
    """Largest int `value` over all ranks (itself on one rank)."""
    return int(_max_over_ranks(value, torch.int64))


def max_over_ranks(value: float) -> float:
    """Largest float `value` over all ranks (itself on one rank)."""
    return float(_max_over_ranks(value, torch.float64))


def _max_over_ranks(value: int | float, dtype: torch.dtype) -> int | float:
    if world_size() == 1:
        return value
    t = torch.tensor(value, dtype=dtype, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def sum_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric summed over ranks (every rank must hold the same keys); itself on one rank."""
    if world_size() == 1:
        return metrics
    keys = sorted(metrics)
    total = global_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
    return dict(zip(keys, total.tolist()))


def to_device(obj: T, device: torch.device) -> T:
    """`obj` with its tensors on `device`: a tensor, or a dataclass (e.g. a `Batch`) or dict holding tensors
    (one level deep). Anything else, and tensors already there, are returned as they are."""
    if isinstance(obj, Tensor):
        return obj.to(device)  # type: ignore[return-value]  # T is Tensor here
    if isinstance(obj, dict):
        return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in obj.items()}  # type: ignore[return-value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: v.to(device) for f in dataclasses.fields(obj)
                   if isinstance(v := getattr(obj, f.name), Tensor) and v.device != device}
        return dataclasses.replace(obj, **changes) if changes else obj
    return obj
