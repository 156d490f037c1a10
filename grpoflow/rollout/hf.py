"""The transformers rollout engine: KV-cached sampling with an HF causal LM (see `rollout.sampling`)."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from grpoflow.rollout.protocol import Generation, SamplingParams, eos_response_mask, left_pad, stop_ids
from grpoflow.rollout.sampling import sample


class HFRolloutEngine:
    """KV-cached sampling with a transformers causal LM (CPU or one GPU), see `rollout.sampling`.

    The engine computes in the dtype of the model it is given: a rollout copy loaded in bfloat16
    decodes in bfloat16 and receives the trainer's float32 weights cast on copy.
    """

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int | list[int]) -> None:
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.version = 0
        self._device = next(model.parameters()).device
        for p in self.model.parameters():
            p.requires_grad_(False)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
                 ) -> Generation:
        """n samples per prompt; with `seeds` (one per prompt) each sample has its own random stream."""
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)
        stops = stop_ids(self.eos_token_id, params)
        eos = torch.as_tensor(stops)
        response_ids, log_probs = sample(
            self.model, prompt_ids.to(self._device), prompt_mask.to(self._device), n=params.n,
            max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            eos_token_ids=eos.to(self._device), pad_token_id=self.pad_token_id,
            seeds=None if seeds is None else torch.tensor(seeds, dtype=torch.long))
        response_ids, log_probs = response_ids.cpu(), log_probs.cpu()
        response_mask = eos_response_mask(response_ids, stops)
        truncated = ~torch.isin(response_ids, eos).any(-1)  # the loop ran to max_new_tokens for these
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
