"""The typed batch that moves between the controller and the workers.

Layout (verl's): prompts are LEFT-padded to a common length P, responses RIGHT-padded to R, so
`torch.cat([prompt_ids, response_ids], 1)` is the model input and the logits that predict
response token t sit at column P - 1 + t. All per-token tensors are response-aligned `[B, R]`.

Fields start as None and are filled stage by stage (rollout -> reward -> log-probs ->
advantages). The container is generic over its fields: `select`, `split` and `concat` index
every tensor along dim 0 and every list element-wise, so adding a field never touches them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor


@dataclass
class Batch:
    prompt_ids: Tensor                      # [B, P] int64, left-padded with pad_token_id
    prompt_mask: Tensor                     # [B, P] 1 on real prompt tokens
    response_ids: Tensor                    # [B, R] int64, right-padded
    response_mask: Tensor                   # [B, R] 1 on generated tokens (up to and incl. EOS): the loss mask
    group_ids: Tensor                       # [B] int64, samples of one prompt share an id
    rollout_log_probs: Optional[Tensor] = None  # [B, R] log-probs under the sampling policy
    # [B, R] float32 each sampled token's nucleus floor (models/nucleus.py): log-probs are taken over the tokens
    # at or above it, renormalised (-inf: nothing cut); None: sampled at top_p = 1 (or by an engine without floors)
    sampling_floors: Optional[Tensor] = None
    old_log_probs: Optional[Tensor] = None  # [B, R] actor log-probs before the update
    ref_log_probs: Optional[Tensor] = None  # [B, R] reference-policy log-probs
    scores: Optional[Tensor] = None         # [B] float32, the reward of each sample
    baselines: Optional[Tensor] = None      # [B] reward of a greedy response to the same prompt (ReMax)
    token_level_rewards: Optional[Tensor] = None  # [B, R] score at the last token, minus any KL penalty
    advantages: Optional[Tensor] = None     # [B, R] float32
    values: Optional[Tensor] = None         # [B, R] critic values before the update
    returns: Optional[Tensor] = None        # [B, R] critic regression targets
    truncated: Optional[Tensor] = None      # [B] bool, hit the length limit before EOS
    policy_version: Optional[Tensor] = None  # [B] int64, version of the weights that sampled it (its oldest token)
    token_versions: Optional[Tensor] = None  # [B, R] int64, version of the weights that sampled each token (0 on
                                             # padding and environment tokens; rollout.partial spans several)
    # [B, R] 1 on every real response token, the model's and (multi-turn) the environment's, which the
    # model reads but is not trained on; None: the response is all the model's, so response_mask.
    response_attention: Optional[Tensor] = None
    env_rewards: Optional[Tensor] = None    # [B] float32, multi-turn: the environment's reward (added to scores)
    teacher_log_probs: Optional[Tensor] = None  # [B, R] distillation: the teacher's log-probs of the sampled tokens
    teacher_topk_ids: Optional[Tensor] = None   # [B, R, k] int64 distillation: the teacher's k likeliest tokens
    teacher_topk_log_probs: Optional[Tensor] = None  # [B, R, k] the teacher's log-probs of those tokens
    prompts: list = field(default_factory=list)      # [B] prompt text
    completions: list = field(default_factory=list)  # [B] decoded response text
    rows: list = field(default_factory=list)         # [B] dataset row (dict) of the prompt
    conversations: list = field(default_factory=list)  # [B] multi-turn: the whole conversation (chat messages)
    infos: list = field(default_factory=list)  # [B] trajectories.turns.SampleInfo: what is logged (turns, tool calls,
                                               # reward parts, the end state)
    carried: list = field(default_factory=list)  # [B] trajectories.turns.Carried: what the controller carries (the
                                                 # episode, the final sample, a partial rollout's progress)
    reward_parts: list = field(default_factory=list)   # [B] dict: the parts of each sample's score (rewarding.py)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def input_ids(self) -> Tensor:
        """[B, P + R] the model input."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def response_attention_mask(self) -> Tensor:
        """[B, R] 1 on every real response token (model and environment); the model input's response part."""
        return self.response_mask if self.response_attention is None else self.response_attention

    @property
    def attention_mask(self) -> Tensor:
        """[B, P + R]."""
        return torch.cat([self.prompt_mask, self.response_attention_mask], dim=1)

    @property
    def response_lengths(self) -> Tensor:
        """[B] number of response tokens the model generated (environment tokens not counted)."""
        return self.response_mask.sum(-1)

    def replace(self, **changes: Any) -> "Batch":
        return dataclasses.replace(self, **changes)

    def tensors(self) -> "Batch":
        """The same batch without its texts and dataset rows: what a model worker needs, and all that a
        WorkerGroup sends to one (it strips every Batch argument itself)."""
        return dataclasses.replace(self, prompts=[], completions=[], rows=[], conversations=[], reward_parts=[],
                                   infos=[], carried=[])

    def select(self, index: Tensor | list[int]) -> "Batch":
        """Rows `index` (in that order) of every field."""
        idx = torch.as_tensor(index, dtype=torch.long)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                values[f.name] = v.index_select(0, idx)
            elif isinstance(v, list) and v:
                values[f.name] = [v[i] for i in idx.tolist()]
            else:
                values[f.name] = v
        return Batch(**values)

    def split(self, chunks: int) -> list["Batch"]:
        """`chunks` contiguous, equal parts (sizes differ by at most one, earlier parts larger)."""
        bounds = split_bounds(len(self), chunks)
        return [self.select(list(range(bounds[i], bounds[i + 1]))) for i in range(chunks)]

    def trimmed(self) -> "Batch":
        """The same rows with all-padding columns removed (left of prompts, right of responses)."""
        p = int(self.prompt_mask.sum(-1).max().item()) if len(self) else 0
        r = max(int(self.response_attention_mask.sum(-1).max().item()) if len(self) else 0, 1)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("prompt_") and isinstance(v, Tensor):
                v = v[:, v.shape[1] - p:]
            elif isinstance(v, Tensor) and v.dim() >= 2:  # [B, R] and [B, R, k] per-token fields
                v = v[:, :r]
            values[f.name] = v
        return Batch(**values)

    @staticmethod
    def concat(parts: list["Batch"], pad_token_id: int = 0) -> "Batch":
        """Stack batches row-wise, re-padding prompts (left) and per-token fields (right)."""
        parts = [p for p in parts if len(p)] or parts[:1]
        values: dict[str, Any] = {}
        for f in dataclasses.fields(Batch):
            vs = [getattr(p, f.name) for p in parts]
            if all(v is None for v in vs):
                values[f.name] = None
            elif any(v is None for v in vs):
                raise ValueError(f"Batch.concat: field {f.name} is set in some parts and not in others.")
            elif isinstance(vs[0], Tensor) and vs[0].dim() >= 2:
                fill = pad_token_id if f.name in ("prompt_ids", "response_ids") else 0
                values[f.name] = _pad_cat(vs, left=f.name.startswith("prompt_"), fill=fill)
            elif isinstance(vs[0], Tensor):
                values[f.name] = torch.cat(vs)
            else:
                values[f.name] = [x for v in vs for x in v]
        return Batch(**values)


def split_bounds(n: int, parts: int) -> list[int]:
    """Boundaries of `parts` contiguous slices of `n` items; earlier slices get the remainder."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def _pad_cat(tensors: list[Tensor], left: bool, fill: float) -> Tensor:
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        pad = width - t.shape[1]
        if pad:
            filler = torch.full((t.shape[0], pad, *t.shape[2:]), fill, dtype=t.dtype)
            t = torch.cat([filler, t] if left else [t, filler], dim=1)
        out.append(t)
    return torch.cat(out)
