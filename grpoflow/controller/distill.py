"""The controller's side of on-policy distillation (`distill.*`, docs/algorithms/opd.md).

- `resolve_teacher`: `distill.teacher.path` as a local model folder (models/spec.py: a `.gguf` dequantized and a
  `builtin:` model built into `<run folder>/teacher_model`, as `model.path` is), checked to share the student's
  tokenizer: the teacher scores the student's token ids, so the two must mean the same thing by each.
- `Distiller`: after sampling, the teacher (its own worker group, or with `path=self` the actor
  itself) scores the sampled tokens, on privileged prompts when `prompt_template` is set; after the
  task advantage, `distill_advantages` mixes in the per-token reverse KL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from grpoflow.algorithms import distill_advantages
from grpoflow.config import ConfigError, DistillConfig
from grpoflow.data.batch import Batch
from grpoflow.distributed.worker_group import WorkerGroup
from grpoflow.models.loading import load_tokenizer
from grpoflow.models.spec import model_folder
from grpoflow.engines.protocol import left_pad
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.frozen import FrozenWorker

SELF = "self"  # distill.teacher.path of self-distillation: the actor, with its current weights


class TeacherError(ConfigError):
    """The teacher cannot score the student's tokens; the message says why and what to change."""


def resolve_teacher(path: str, run_dir: Path, student: Any) -> str:
    """A local folder for `distill.teacher.path` (or `self`), after checking it shares the `student` tokenizer."""
    if path == SELF:
        return SELF
    folder = model_folder(path, setting="distill.teacher.path", into=run_dir.resolve() / "teacher_model",
                          also=", or self")
    check_same_tokenizer(student, load_tokenizer(folder), name=path)
    return folder


def check_same_tokenizer(student: Any, teacher: Any, *, name: str) -> None:
    """Raise TeacherError unless both tokenizers map every token to the same id."""
    s, t = student.get_vocab(), teacher.get_vocab()
    if s == t:
        return
    differ = sum(1 for tok, i in s.items() if t.get(tok) != i) + sum(1 for tok in t if tok not in s)
    raise TeacherError(
        f"distill.teacher.path={name} has another tokenizer than the student ({len(t)} vs {len(s)} tokens, "
        f"{differ} differ): the teacher scores the student's token ids, so both must share one vocabulary. Use a "
        "teacher of the student's family (same tokenizer), or distil offline through text (grpoflow sft).")


def teacher_prompts(prompts: list[str], rows: list[dict], template: str, tokenizer: Any) -> tuple[Tensor, Tensor]:
    """[B, P'] left-padded ids and mask of the privileged prompts: `template` formatted with `prompt` (the student's
    prompt text) and each row's columns, tokenized as the student's prompts are (no special tokens added)."""
    texts = []
    for prompt, row in zip(prompts, rows):
        try:
            texts.append(template.format(**{**row, "prompt": prompt}))
        except (KeyError, IndexError, AttributeError) as e:
            raise TeacherError(f"distill.teacher.prompt_template={template!r} names {e}, which the row lacks (its "
                               f"columns: {sorted(row)}); use `{{prompt}}` and those columns.") from None
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return left_pad(ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)


class Distiller:
    """Teacher scores on a sampled batch, and the distillation advantage."""

    def __init__(self, cfg: DistillConfig, *, teacher: WorkerGroup[FrozenWorker] | None,
                 actor: WorkerGroup[ActorWorker], tokenizer: Any) -> None:
        self.cfg, self.teacher, self.actor, self.tokenizer = cfg, teacher, actor, tokenizer

    def score(self, batch: Batch) -> Batch:
        """`batch` with `teacher_log_probs` (and top-k fields) from the teacher, which reads the privileged prompts
        when `distill.teacher.prompt_template` is set."""
        scored = batch
        template = self.cfg.teacher.prompt_template
        if template:
            ids, mask = teacher_prompts(batch.prompts, batch.rows, template, self.tokenizer)
            scored = scored.replace(prompt_ids=ids, prompt_mask=mask)
        if self.teacher is None:  # self-distillation: the student itself, with the privileged context
            teacher = self.actor.call(ActorWorker.compute_log_prob, scored, nucleus=False)  # the full distribution
            return batch.replace(teacher_log_probs=teacher)
        out = self.teacher.call(FrozenWorker.score, scored)
        return batch.replace(teacher_log_probs=out.teacher_log_probs, teacher_topk_ids=out.teacher_topk_ids,
                             teacher_topk_log_probs=out.teacher_topk_log_probs)

    def advantages(self, batch: Batch, task_advantages: Tensor) -> tuple[Tensor, dict[str, float]]:
        """The mixed advantages [B, R] and the distillation metrics. The student's log-probs are the trainer's
        (old_log_probs) when this step computed them, else the rollout engine's sampling log-probs."""
        student = batch.old_log_probs if batch.old_log_probs is not None else batch.rollout_log_probs
        if student is None or batch.teacher_log_probs is None:
            raise RuntimeError("distillation needs the student's and the teacher's log-probs of the sampled tokens; "
                               "the rollout engine returned no sampling log-probs.")
        advantages, metrics = distill_advantages(task_advantages, student, batch.teacher_log_probs,
                                                 batch.response_mask, kl_coef=self.cfg.kl_coef,
                                                 task_weight=self.cfg.task_weight)
        return advantages, {k: float(v) for k, v in metrics.items()}
