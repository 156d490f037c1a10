"""The transformers engine with LoRA adapters served unmerged (rollout.lora_sync=adapter, rollout.engine=hf).

The engine holds the base model wrapped with the policy's adapter layout (same rank, alpha and target
modules, `models.lora.add_lora`); each weight sync copies only the adapter tensors, under peft's names,
into it. The base weights never move after start: the actor's are frozen and equal to the model folder's.
Sampling (stepping, pausing), sleep and wake are the plain HF engine's (composition, not a subclass).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from grpoflow.models.lora import add_lora, is_adapter_weight
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.protocol import Completion, Request


class HFAdapterEngine:
    """HF sampling on base model + LoRA adapters; `update_weights` receives adapter tensors only."""

    abilities = HFRolloutEngine.abilities  # the plain engine's: it steps, pauses and sleeps (frees its KV cache)

    def __init__(self, model: torch.nn.Module, *, lora: dict, pad_token_id: int, eos_token_id: int | list[int],
                 kv_reuse_mb: int = 1024, kv_budget_columns: int | None = None, exact: bool = False) -> None:
        adapted = add_lora(model, rank=lora["rank"], alpha=lora["alpha"], target_modules=lora["target_modules"])
        self.inner = HFRolloutEngine(adapted, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                                     kv_reuse_mb=kv_reuse_mb, kv_budget_columns=kv_budget_columns, exact=exact)
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.adapters = {n: p for n, p in adapted.named_parameters() if is_adapter_weight(n)}
        self.last_sync_bytes = 0

    @property
    def version(self) -> int:
        return self.inner.version

    @version.setter
    def version(self, value: int) -> None:
        self.inner.version = value

    # the request batcher's StepEngine: the plain engine's continuous batching
    @property
    def busy(self) -> bool:
        return self.inner.busy

    def admit(self, requests: list[tuple[int, Request]]) -> None:
        self.inner.admit(requests)

    def tick(self, version: int) -> list[tuple[int, Completion]]:
        return self.inner.tick(version)

    def pause(self) -> list[tuple[int, Completion]]:
        return self.inner.pause()

    def end_rollout(self) -> None:
        self.inner.end_rollout()

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Copy every adapter tensor (peft names); anything else, or a missing adapter tensor, is an error."""
        seen, size = set(), 0
        for name, tensor in named_tensors:
            if name not in self.adapters:
                raise KeyError(f"adapter sync: {name!r} is not a LoRA adapter tensor of the rollout model; with "
                               "rollout.lora_sync=adapter the actor sends adapters only, of the same layout "
                               "(model.lora.*).")
            self.adapters[name].copy_(tensor)
            seen.add(name)
            size += tensor.numel() * tensor.element_size()
        missing = set(self.adapters) - seen
        if missing:
            raise KeyError(f"adapter sync: {len(missing)} adapter tensors were not sent, e.g. {sorted(missing)[:2]}.")
        self.inner.version, self.last_sync_bytes = version, size

    def sleep(self) -> None:
        self.inner.sleep()

    def wake(self) -> None:
        self.inner.wake()
