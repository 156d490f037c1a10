"""The rollout engine protocol, and its transformers implementation (KV-cached sampling).

An engine takes prompt token ids and returns `n` samples per prompt as padded tensors with the
sampling log-probs. Engines hold their own copy of the weights (possibly in another dtype or
on another device) and receive the actor's weights one tensor at a time, with a version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch
from torch import Tensor

from grpoflow.engines.sampling import sample


@dataclass
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 16
    temperature: float = 1.0   # 0 means greedy
    top_p: float = 1.0


@dataclass
class Generation:
    """n samples per prompt, prompt-major (sample j of prompt i is row i * n + j)."""
    prompt_ids: Tensor        # [B*n, P] left-padded
    prompt_mask: Tensor       # [B*n, P]
    response_ids: Tensor      # [B*n, R] right-padded with pad_token_id after EOS
    response_mask: Tensor     # [B*n, R] 1 up to and including the first EOS
    log_probs: Tensor         # [B*n, R] float32 log-probs under the sampling distribution (0 on padding)
    truncated: Tensor         # [B*n] bool, stopped by max_new_tokens before any EOS


class RolloutEngine(Protocol):
    version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
                 ) -> Generation:
        """`seeds`: one per prompt, so that a prompt's samples do not depend on its batch (engines
        that cannot promise it say so); None: the engine draws from torch's global generator."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """[B, P] ids and mask, left-padded to the longest sequence."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def eos_response_mask(response_ids: Tensor, eos_token_id: int | list[int]) -> Tensor:
    """[B, R] 1 on tokens up to and including the first EOS of each row, 0 after."""
    eos_ids = torch.as_tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(response_ids, eos_ids).long()
    seen_before = is_eos.cumsum(-1) - is_eos
    return (seen_before == 0).long()


class HFRolloutEngine:
    """KV-cached sampling with a transformers causal LM (CPU or one GPU), see `engines.sampling`.

    The engine computes in the dtype of the model it is given: a rollout copy loaded in bfloat16
    decodes in bfloat16 and receives the trainer's float32 weights cast on copy.
    """

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int | list[int]) -> None:
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.version = 0
        self._device = next(model.parameters()).device
        self._eos = torch.as_tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
        for p in self.model.parameters():
            p.requires_grad_(False)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
                 ) -> Generation:
        """n samples per prompt; with `seeds` (one per prompt) each sample has its own random stream."""
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)
        response_ids, log_probs = sample(
            self.model, prompt_ids.to(self._device), prompt_mask.to(self._device), n=params.n,
            max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            eos_token_ids=self._eos.to(self._device), pad_token_id=self.pad_token_id,
            seeds=None if seeds is None else torch.tensor(seeds, dtype=torch.long))
        response_ids, log_probs = response_ids.cpu(), log_probs.cpu()
        response_mask = eos_response_mask(response_ids, self.eos_token_id)
        truncated = ~torch.isin(response_ids, self._eos).any(-1)  # the loop ran to max_new_tokens for these
        return Generation(prompt_ids.repeat_interleave(params.n, 0), prompt_mask.repeat_interleave(params.n, 0),
                          response_ids, response_mask, log_probs, truncated)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        params = dict(self.model.named_parameters())
        seen = set()
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight sync: the rollout model has no parameter {name!r}; "
                               "actor and rollout must load the same architecture (model.path).")
            params[name].copy_(tensor)
            seen.add(name)
        missing = set(params) - seen
        if missing:
            raise KeyError(f"weight sync: {len(missing)} rollout parameters were not sent, e.g. {sorted(missing)[:3]}.")
        self.version = version

    def sleep(self) -> None:
        """Free accelerator memory during training (no-op on CPU)."""
        if self._device.type != "cpu":
            self.model.to("cpu")

    def wake(self) -> None:
        if self._device.type != "cpu":
            self.model.to(self._device)
