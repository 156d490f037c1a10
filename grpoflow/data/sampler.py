"""Epoch-based index sampler whose position can be saved and restored exactly.

The controller asks for ``k`` prompt indices per step; a batch may straddle an epoch
boundary. Each epoch's order is a permutation drawn from ``torch.Generator`` seeded with
``seed + epoch``, so the order depends only on (seed, epoch) and a checkpoint needs to store
just ``{"epoch", "position"}`` to resume with the same indices.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from grpoflow.errors import UserError


class PromptSampler(Protocol):
    """What the rollout queue draws prompts from: this epoch sampler, or the curriculum (data/curriculum.py)."""

    def next_indices(self, k: int) -> list[int]: ...

    def observe(self, indices: Sequence[int], pass_rates: Sequence[float]) -> None:
        """Feedback after scoring: each drawn prompt's pass rate (the curriculum uses it)."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class EpochSampler:
    """Yield dataset indices epoch after epoch, in a new seeded order each epoch (``shuffle=False``: in the
    items' order, every epoch)."""

    def __init__(self, num_items: int, seed: int, shuffle: bool = True):
        if num_items <= 0:
            raise ValueError(
                f"EpochSampler needs at least one item, got num_items={num_items}; check that "
                f"the dataset kept some prompts."
            )
        self.num_items = num_items
        self.seed, self.shuffle = seed, shuffle
        self._epoch = 0
        self._position = 0  # next index to hand out within the current epoch's order
        self._order = self._order_for(0)

    @property
    def epoch(self) -> int:
        """The epoch the next index comes from (0-based)."""
        return self._epoch

    def _order_for(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_items))
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_items, generator=gen).tolist()

    def next_indices(self, k: int) -> list[int]:
        """Return the next ``k`` indices, moving into the next epoch(s) when one runs out."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), self.num_items - self._position)
            out.extend(self._order[self._position : self._position + take])
            self._position += take
            if self._position == self.num_items:  # move on now, so `epoch` names the next index's
                self._epoch += 1
                self._position = 0
                self._order = self._order_for(self._epoch)
        return out

    def observe(self, indices: Sequence[int], pass_rates: Sequence[float]) -> None:
        """Epochs ignore how prompts fared."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        """``{"epoch", "position"}``: enough to rebuild the exact position (order comes from seed)."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state`` as returned by ``state_dict`` (same num_items and seed)."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position < self.num_items:
            raise UserError(f"the checkpoint's prompt sampler stands at prompt {position} of an epoch, but the "
                            f"training data now has {self.num_items} prompts: data.train_files changed size since the "
                            "checkpoint was written; resume with the data it was written with, or start over "
                            "(trainer.resume=never).")
        self._epoch, self._position = epoch, position
        self._order = self._order_for(epoch)
