"""The teacher role (on-policy distillation): a frozen model that scores the student's sampled tokens.

Built and placed like the reference role (`workers/reference.py`): it lives on the training pool,
sharded like the actor when there are several ranks, and never trains. Its verb `score` returns
the batch it was given with `teacher_log_probs` (and, with `topk` > 0, `teacher_topk_ids` and
`teacher_topk_log_probs`) filled. The prompts it reads are the batch's: the controller swaps in
privileged prompts first when `distill.teacher.prompt_template` is set (`controller/distill.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.data.batch import Batch
from grpoflow.models import attention
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.topk import teacher_topk
from grpoflow.training.collectives import to_device
from grpoflow.training.engine import place_model
from grpoflow.training.forward import batch_log_probs
from grpoflow.training.microbatch import split_by_tokens


class TeacherWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, temperature: float, max_tokens: int,
                 chunk_size: int, compute_dtype: str | None = "float32", topk: int = 0) -> None:
        model = attention.use_for_bf16_on_cpu(load_causal_lm(model_path), compute_dtype).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.model = place_model(model, compute_dtype)  # sharded: the actor's mixed-precision policy
        self.temperature, self.max_tokens, self.chunk_size = temperature, max_tokens, chunk_size
        self.compute_dtype, self.topk = compute_dtype, topk

    def score(self, batch: Batch) -> Batch:
        """`batch` with the teacher's log-probs of its response tokens [B, R] (0 on padding), and with `topk` its k
        likeliest tokens per position [B, R, k] and their log-probs."""
        if self.topk <= 0:
            log_probs, _ = batch_log_probs(self.model, batch, temperature=self.temperature, max_tokens=self.max_tokens,
                                           chunk_size=self.chunk_size, compute_dtype=self.compute_dtype)
            return batch.replace(teacher_log_probs=log_probs)
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
