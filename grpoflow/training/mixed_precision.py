"""A bf16 compute copy of the model with float32 master weights (what FSDP's and verl's mixed precision do).

`torch.autocast` keeps the model in float32 and casts at every matrix product: each linear casts its
float32 input to bf16 and its backward casts the gradient back, and the residual stream, norms and
element-wise work stay float32. With a compute copy the cast happens once per optimizer step instead:

- `compute` is a copy of `master` (the trained float32 module) in bf16; forward and backward run on it,
  so activations, the residual stream and their gradients are bf16 (norms and softmax upcast inside, as
  in any bf16 model);
- each compute parameter's gradient is added into its master's float32 `.grad` as soon as backward
  has accumulated it (`register_post_accumulate_grad_hook`), then freed, so micro-batches accumulate in
  float32 and the bf16 gradients never exist for the whole model at once;
- the optimizer, gradient clipping, checkpoints and weight sync see only the float32 masters;
- `refresh()` casts the masters into the copy; the engine calls it before the first forward after an
  optimizer step or a checkpoint load (`mark_stale`), so the copy never lags the masters.

Tied weights stay tied (the copy is a `deepcopy`, which keeps shared tensors shared). Only parameters are cast:
buffers keep their dtype (RoPE's float32 inv_freq), as transformers keeps them when it loads a model in bf16.
Frozen parameters are copied but get no hook. Which roles get a copy is decided in training/precision.py
(`how` = `copy`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class ComputeCopy:
    """`compute`: `master` in `dtype`, whose gradients land in `master`'s float32 `.grad`."""

    def __init__(self, master: nn.Module, dtype: torch.dtype) -> None:
        self.master = master
        self.compute = cast_parameters(copy.deepcopy(master), dtype)
        self.compute.train(master.training)
        self.pairs = list(zip(master.parameters(), self.compute.parameters()))
        names = [n for n, _ in master.named_parameters()], [n for n, _ in self.compute.named_parameters()]
        if names[0] != names[1]:
            raise RuntimeError("the compute copy's parameters do not line up with the model's (deepcopy changed them)")
        for master_p, compute_p in self.pairs:
            if compute_p.requires_grad:
                compute_p.register_post_accumulate_grad_hook(_into_master(master_p))
        self.stale = False

    def mark_stale(self) -> None:
        """The masters changed (optimizer step, load): refresh before the next forward."""
        self.stale = True

    @torch.no_grad()
    def refresh(self) -> nn.Module:
        """Cast the masters into the compute copy if they changed since the last refresh; returns the copy."""
        if self.stale:  # one foreach copy (casting): a few fused launches on a GPU, not one per parameter
            torch._foreach_copy_([c for _, c in self.pairs], [m for m, _ in self.pairs])
            self.stale = False
        return self.compute


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`module` with its parameters cast to `dtype` in place, its buffers as they are: RoPE's inv_freq stays
    float32, as transformers keeps it in a model loaded in bf16 (the rollout engine's). `module.to(bf16)` would cast
    it too and move every position's angle: the trainer's log-probs ~5e-2 from the engine's. Returns `module`."""
    for p in module.parameters():
        p.data = p.data.to(dtype)
    return module


def _into_master(master_p: nn.Parameter):
    """The hook of one compute parameter: add its (bf16) gradient into the master's float32 gradient, free it."""
    def hook(compute_p: torch.Tensor) -> None:
        grad = compute_p.grad
        if grad is None:
            return
        if master_p.grad is None:
            master_p.grad = grad.to(master_p.dtype)
        else:
            master_p.grad.add_(grad)
        compute_p.grad = None
    return hook

