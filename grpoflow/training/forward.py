"""Micro-batched passes over a whole batch: the no-grad per-token forward (log-probs, values) and
the update loop (mini-batches x epochs x token-budget micro-batches, one optimizer step each).

Both are collectives when the model is sharded: every rank runs the same number of micro-batches
(`split_by_tokens` pads the short ranks with `PaddingBatch`es, which count zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from grpoflow.data.batch import Batch
from grpoflow.models.logprobs import response_log_probs
from grpoflow.training.collectives import global_sum, to_device
from grpoflow.training.engine import TrainEngine
from grpoflow.training.microbatch import split_by_tokens
from grpoflow.training.timing import StageTimer


@dataclass(frozen=True)
class UpdateSchedule:
    """How one RL step's batch becomes optimizer steps (the actor's and the critic's alike)."""
    minibatches: int = 1          # optimizer steps per pass over the batch (each holds whole groups)
    epochs: int = 1               # passes over the batch
    max_tokens_per_microbatch: int = 4096  # padded tokens per forward/backward on one rank


@dataclass(frozen=True)
class Counts:
    """A mini-batch's global sizes (summed over data-parallel ranks): the loss denominators."""
    tokens: float
    seqs: float


LossFn = Callable[[nn.Module, Batch, Counts], tuple[Tensor, dict[str, Tensor]]]


@torch.no_grad()
def per_token_forward(model: nn.Module, batch: Batch, fn: Callable[[nn.Module, Batch], tuple[Tensor, ...]], *,
                      max_tokens: int, outputs: int = 1) -> list[Tensor]:
    """`outputs` tensors [B, R] (float32, on the CPU, 0 on padding) of `fn(model, micro_batch)`, which returns
    that many [b, r] per-response-token tensors for a trimmed micro-batch; rows in `batch`'s order."""
    b, r = batch.response_ids.shape
    out = [torch.zeros(b, r) for _ in range(outputs)]
    device = next(model.parameters()).device
    microbatches, plans = split_by_tokens(batch, max_tokens)
    for mb, idx in zip(microbatches, plans):
        mb = to_device(mb, device)
        values = fn(model, mb)
        if not idx:  # a padding micro-batch: only here to join the collective forward
            continue
        rows = torch.as_tensor(idx)
        for target, v in zip(out, values):
            target[rows, :v.shape[1]] = (v * mb.response_mask).float().cpu()
    return out


def batch_log_probs(model: nn.Module, batch: Batch, *, temperature: float, max_tokens: int, chunk_size: int,
                    with_entropy: bool = False, compute_dtype: str | None = None, nucleus: bool = False,
                    exact: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, R] (and entropy [B, R]) of every response in `batch`, in its row order, on the CPU.
    `compute_dtype` (model.compute_dtype): bfloat16 runs the forward under autocast. `nucleus`: under each
    sample's top-p nucleus (`batch.sampling_floors`, when it has them), as the policy that sampled it drew.
    `exact`: batch-invariant kernels (rollout.exact, models/exact.py)."""
    def fn(m: nn.Module, mb: Batch) -> tuple[Tensor, ...]:
        lp, ent = response_log_probs(m, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_attention_mask,
                                     temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
                                     compute_dtype=compute_dtype, floors=mb.sampling_floors if nucleus else None,
                                     exact=exact)
        return (lp,) if ent is None else (lp, ent)

    out = per_token_forward(model, batch, fn, max_tokens=max_tokens, outputs=2 if with_entropy else 1)
    return out[0], (out[1] if with_entropy else None)


def accumulate_gradients(engine: TrainEngine, minibatch: Batch, loss_fn: LossFn, *, max_tokens: int
                         ) -> dict[str, float]:
    """Backprop one mini-batch's loss through its token-budget micro-batches (no optimizer step); the
    mini-batch's metrics. Each micro-batch's loss is divided by the mini-batch's GLOBAL token and sequence
    counts (`loss_fn` receives them), so the accumulated gradient is the same for any micro-batch split and
    any world size (tests/integration/test_gradient_invariance.py, test_fsdp.py)."""
    counts = Counts(tokens=global_sum(minibatch.response_mask.sum()).item(), seqs=global_sum(len(minibatch)).item())
    microbatches, _ = split_by_tokens(minibatch, max_tokens)
    return engine.forward_backward(microbatches, lambda model, mb: loss_fn(model, mb, counts))


def train_on_batch(engine: TrainEngine, batch: Batch, schedule: UpdateSchedule, loss_fn: LossFn, *,
                   prefix: str, timer: StageTimer | None = None) -> dict[str, float]:
    """`epochs` x `minibatches` optimizer steps on `batch` (`accumulate_gradients`, then the step); the mean of
    each metric over them, with `<prefix>/lr` and `<prefix>/grad_norm` (before clipping) per optimizer step.
    `timer` (if given) sums the seconds of `forward_backward` (forward, loss, backward) and `optimizer`
    (grad clip + optimizer step)."""
    timer = timer if timer is not None else StageTimer()
    totals: dict[str, float] = {}
    steps = 0
    for _ in range(schedule.epochs):
        for minibatch in batch.split(schedule.minibatches):
            with timer("forward_backward"):
                metrics = accumulate_gradients(engine, minibatch, loss_fn,
                                               max_tokens=schedule.max_tokens_per_microbatch)
            metrics[f"{prefix}/lr"] = engine.lr
            with timer("optimizer"):
                metrics[f"{prefix}/grad_norm"] = engine.optimizer_step()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in totals.items()}
