"""The transformers rollout engine: continuous batching over an HF causal LM (`engines.continuous`).

It declares stepping, pausing and sleeping (`EngineAbilities`): the request batcher drives it (`admit` / `tick`:
requests join and leave the running decode batch, a trajectory's next turn reuses its KV cache), and whole-batch
generation (`whole_batch.generate_batch`: the judge, the Tinker sampler) steps the same sampler to the end.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
from torch import Tensor

from grpoflow.engines.continuous import COMPACT_FRACTION, ContinuousSampler
from grpoflow.engines.protocol import Completion, EngineAbilities, Request, SamplingParams, stop_ids


class HFRolloutEngine:
    """KV-cached sampling with a transformers causal LM (CPU or one GPU), see `engines.sampling`.

    The engine computes in the dtype of the model it is given, and keeps its KV cache in it: a rollout copy
    loaded in bfloat16 decodes in bfloat16 and receives the trainer's float32 weights cast on copy.

    Colocated with the actor it sleeps while the actor trains (`abilities.sleeping`): `sleep` frees the KV cache,
    which the next rollout rebuilds. The weights stay where they are: a bf16 copy is 2 bytes per parameter next to
    the actor's 16 or more, and moving it off the device and back each step would cost more than it frees.
    """

    abilities = EngineAbilities(stepping=True, pausing=True, sleeping=True)

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int | list[int],
                 kv_reuse_mb: int = 1024, compact_fraction: int = COMPACT_FRACTION,
                 kv_budget_columns: int | None = None, exact: bool = False) -> None:
        """`compact_fraction`: finished rows' slots are compacted away once they are 1 / compact_fraction of
        the decode batch (engines/continuous.py). `kv_budget_columns`: the most token columns the KV cache of the
        running requests may hold (engines/kv_budget.py); more requests wait for room. None: no limit. `exact`:
        the model's forwards run with batch-invariant products (models/exact.py; the model attends with
        `exact_attention` already)."""
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.version = 0
        self._device = next(model.parameters()).device
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.sampler = ContinuousSampler(self.model, pad_token_id=pad_token_id, kv_reuse_bytes=kv_reuse_mb << 20,
                                         compact_fraction=compact_fraction, kv_budget_columns=kv_budget_columns,
                                         exact=exact)

    # ------------------------------------------------------------ the batcher's StepEngine

    @property
    def busy(self) -> bool:
        return self.sampler.busy

    def admit(self, requests: list[tuple[int, Request]]) -> None:
        """Requests join the decode batch (the tokenizer's EOS ends each, besides its own stop ids)."""
        eos = stop_ids(self.eos_token_id, SamplingParams())
        self.sampler.admit([(rid, dataclasses.replace(q, stop_token_ids=tuple(eos + [t for t in q.stop_token_ids
                                                                                      if t not in eos])))
                            for rid, q in requests])

    def tick(self, version: int) -> list[tuple[int, Completion]]:
        return self.sampler.tick(version)

    def pause(self) -> list[tuple[int, Completion]]:
        """Every running request stopped where it is (finish "paused"; rollout.partial)."""
        return self.sampler.pause()

    def end_rollout(self) -> None:
        """Forget the KV caches parked for trajectories' next turns."""
        self.sampler.clear()

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

    def kv_cache_bytes(self) -> int:
        """Bytes the KV caches hold now: the running requests' slots and the caches parked for next turns."""
        return self.sampler.cache.bytes() + self.sampler.parked.used

    def sleep(self) -> None:
        """Free the KV cache (and the parked ones) while the actor trains; the next rollout rebuilds it."""
        self.sampler.clear()
        self.sampler.release()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Nothing to load: the cache is allocated as the next requests arrive."""
