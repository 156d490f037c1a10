"""Each role's precision, decided in one place: the dtype its weights are held in, the dtype its matrix products run
in, and how the second is reached from the first.

Inputs: the role, `model.dtype` (the trained models' parameters), `model.compute_dtype` once resolved (float32 or
bfloat16: `plan.run_plan.with_compute_dtype`; None counts as float32), whether the policy is sharded over ranks or
has LoRA adapters, and whether a CUDA device runs it. Every role reads its row of this table (`role_precision`):

| role                        | weights               | compute       | how                                        |
|-----------------------------|-----------------------|---------------|--------------------------------------------|
| policy (the actor)          | model.dtype           | compute_dtype | native / sharded / autocast / copy (below) |
| frozen (reference, teacher) | as the policy         | as the policy | as the policy; a copy is the model cast    |
| critic, sft (warm start)    | float32               | compute_dtype | autocast (native in float32)               |
| rollout (engines)           | bfloat16 if either of model.dtype, compute_dtype is, else float32 (both) | native |
| reward_model, judge         | float32               | float32       | native                                     |

`how` for the policy: `native` when the compute dtype is not narrower than the weights' (nothing to cast; bf16
weights with compute_dtype float32 compute in bf16); else `sharded` over several ranks (FSDP2's mixed-precision
policy casts each gathered layer, training/engine.py); else `autocast` with LoRA adapters (their few trained weights
gain nothing from a copy); else `copy`, a bf16 compute copy of the float32 masters (training/mixed_precision.py).

The frozen role is the policy's row on purpose: a teacher or reference equal to the student computes exactly as the
student does, so the KL between them starts at exactly 0 (a frozen model never trains, so its "copy" is itself, cast
once). `grouped_attention`: the policy and frozen roles on a CPU-only machine use models/attention.py's kernel, in
bf16 and float32 alike, so that their log-prob passes run packed (models/packed.py; docs/performance-log.md, "Packed
in float32 too"); the transformers engine decodes with it on a CPU in float32 (less sampling time than sdpa:
docs/performance-log.md, "The float32 row against TRL fp32, on a CPU without bf16 units"; the rollout worker hands
this row's flag to
`engines.factory.build_engine`), with sdpa in bf16 and on a GPU (in bf16 grouped attention bought nothing when
decoding); the local judge's engine, float32 always, decodes with it on a CPU too (workers/judge.py). The reward
model (a sequence classifier, one forward a step) keeps sdpa.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Role = Literal["policy", "frozen", "critic", "sft", "rollout", "reward_model", "judge"]
ROLES: tuple[Role, ...] = ("policy", "frozen", "critic", "sft", "rollout", "reward_model", "judge")
How = Literal["native", "copy", "sharded", "autocast"]


@dataclass(frozen=True)
class Precision:
    """One role's precision (module docstring). `compute_dtype`: `compute` by name, as the forward functions take
    it (`models.logprobs.compute_autocast` does nothing for a model whose weights are in it already)."""
    weights: torch.dtype
    compute: torch.dtype
    how: How = "native"
    grouped_attention: bool = False

    @property
    def compute_dtype(self) -> str:
        return dtype_name(self.compute)

    @property
    def weights_dtype(self) -> str:
        return dtype_name(self.weights)


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def _dtype(name: str | None, key: str) -> torch.dtype:
    if name is None:
        return torch.float32
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"{key}={name!r} reached a role: resolve it to float32 or bfloat16 first "
                         "(plan.run_plan.with_compute_dtype).")
    return getattr(torch, name)


def role_precision(role: Role, *, dtype: str = "float32", compute_dtype: str | None = None, sharded: bool = False,
                   lora: bool = False, cuda: bool = False) -> Precision:
    """The precision of `role` (module docstring's table) for `model.dtype` = `dtype` and the resolved
    `model.compute_dtype`; `sharded`, `lora`: the policy's placement and adapters; `cuda`: a CUDA device computes."""
    weights, compute = _dtype(dtype, "model.dtype"), _dtype(compute_dtype, "model.compute_dtype")
    if role in ("policy", "frozen"):
        how: How
        if compute.itemsize >= weights.itemsize:
            how = "native"
        elif sharded:
            how = "sharded"
        elif lora:
            how = "autocast"
        else:
            how = "copy"
        return Precision(weights, compute, how, grouped_attention=not cuda)
    if role in ("critic", "sft"):
        return Precision(torch.float32, compute, "native" if compute == torch.float32 else "autocast")
    if role == "rollout":  # the engine's copy never trains, so it needs no float32 master
        engine = torch.bfloat16 if torch.bfloat16 in (weights, compute) else torch.float32
        return Precision(engine, engine, grouped_attention=not cuda and engine == torch.float32)
    if role == "judge":  # an engine as the rollout's, in float32: grouped attention on a CPU
        return Precision(torch.float32, torch.float32, grouped_attention=not cuda)
    if role == "reward_model":
        return Precision(torch.float32, torch.float32)
    raise ValueError(f"unknown role {role!r}; one of {ROLES}.")
