"""The frozen model role: a model that never trains and scores the policy's sampled tokens. It serves as the
reference (a frozen copy of the initial policy, for the KL term: verb `log_probs`) and as on-policy distillation's
teacher (verb `score`).

It is built and computes as the policy does (training/precision.py, the `frozen` row is the `policy` row): the same
weights dtype, and where the actor trains on a bf16 copy of float32 masters the frozen model is cast to bf16 once;
sharded like the actor when there are several ranks (FSDP2 with the actor's mixed-precision policy: 1/world of the
model's memory per rank, and its forward is a collective). So a reference, or a teacher, equal to the policy gives
exactly the policy's log-probs, and the KL between them starts at exactly 0.

`score` returns the batch it was given with `teacher_log_probs` (and, with `topk` > 0, `teacher_topk_ids` and
`teacher_topk_log_probs`) filled. The prompts it reads are the batch's: the controller swaps in privileged prompts
first when `distill.teacher.prompt_template` is set (`controller/distill.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from grpoflow.data.batch import Batch
from grpoflow.models import attention
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.topk import teacher_topk
from grpoflow.training.collectives import to_device
from grpoflow.training.engine import place_model
from grpoflow.training.forward import batch_log_probs
from grpoflow.training.microbatch import split_by_tokens
from grpoflow.training.mixed_precision import cast_parameters
from grpoflow.training.precision import Precision, role_precision


def frozen_model(model_path: str, precision: Precision) -> nn.Module:
    """The model in `model_path` for the frozen role: loaded in `precision.weights`, no gradients, cast to the
    compute dtype where the policy computes on a copy, placed (sharded with the policy's policy) on this rank."""
    model = load_causal_lm(model_path, dtype=precision.weights).eval()
    if precision.grouped_attention:
        attention.use_grouped_attention(model)
    model.requires_grad_(False)
    if precision.how == "copy":  # the actor computes on a bf16 copy of its masters: frozen, the model is the copy
        model = cast_parameters(model, precision.compute)  # buffers (RoPE's) as the actor's copy keeps them
    return place_model(model, precision)


class FrozenWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, temperature: float, max_tokens: int,
                 chunk_size: int, dtype: str = "float32", compute_dtype: str | None = None, lora: bool = False,
                 topk: int = 0) -> None:
        """`dtype`, `compute_dtype`: the run's model.dtype and resolved model.compute_dtype; `lora`: the policy has
        adapters (so computes under autocast); `topk` (teacher): the k likeliest tokens `score` adds (0: none)."""
        self.precision = role_precision("frozen", dtype=dtype, compute_dtype=compute_dtype, sharded=world_size > 1,
                                        lora=lora, cuda=torch.cuda.is_available())
        self.model = frozen_model(model_path, self.precision)
        self.temperature, self.max_tokens, self.chunk_size, self.topk = temperature, max_tokens, chunk_size, topk
        self.compute_dtype = self.precision.compute_dtype  # autocast where the policy's forward has it

    def log_probs(self, batch: Batch) -> Tensor:
        """[B, R] the frozen model's log-probs of the responses (0 on padding): the reference's."""
        log_probs, _ = batch_log_probs(self.model, batch, temperature=self.temperature, max_tokens=self.max_tokens,
                                       chunk_size=self.chunk_size, compute_dtype=self.compute_dtype)
        return log_probs

    def score(self, batch: Batch) -> Batch:
        """`batch` with the teacher's log-probs of its response tokens [B, R] (0 on padding), and with `topk` its k
        likeliest tokens per position [B, R, k] and their log-probs."""
        if self.topk <= 0:
            return batch.replace(teacher_log_probs=self.log_probs(batch))
        log_probs, ids, top = self._topk(batch)
        return batch.replace(teacher_log_probs=log_probs, teacher_topk_ids=ids, teacher_topk_log_probs=top)

    def _topk(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """Micro-batched `teacher_topk` over the whole batch, rows in its order (a collective when sharded)."""
        b, r = batch.response_ids.shape
        log_probs, ids = torch.zeros(b, r), torch.zeros(b, r, self.topk, dtype=torch.long)
        top = torch.zeros(b, r, self.topk)
        device = next(self.model.parameters()).device
        microbatches, plans = split_by_tokens(batch, self.max_tokens)
        for mb, idx in zip(microbatches, plans):
            mb = to_device(mb, device)
            lp, mb_ids, mb_top = teacher_topk(self.model, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                                              mb.response_attention_mask, k=self.topk, temperature=self.temperature,
                                              compute_dtype=self.compute_dtype)
            if not idx:  # a padding micro-batch, only here to join the collective forward
                continue
            rows, width, mask = torch.as_tensor(idx), lp.shape[1], mb.response_mask.cpu()
            log_probs[rows, :width] = lp.cpu() * mask
            ids[rows, :width] = mb_ids.cpu() * mask[..., None].long()
            top[rows, :width] = mb_top.cpu() * mask[..., None]
        return log_probs, ids, top
