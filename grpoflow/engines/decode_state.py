"""What the continuous sampler's decode step needs of each slot, kept on the model's device.

A decode step (engines/continuous.py) draws a token for every slot, ends the rows that drew a stop id or reached
their length, and feeds the others their token in one forward. Built from the host's per-row lists, each step
would copy the slots' streams, positions, columns and tokens to the device and every drawn id and log-prob back:
on a GPU each such copy waits for the device (a pageable host-to-device copy synchronises the stream), so the GPU
sits idle between steps. Here those per-slot values live on the device and are advanced there:

    stream, position   the row's random stream and the position of its next draw (random_streams.uniforms)
    token              the id the row drew last (fed to the next decode forward)
    column             the KV column the row's next fed token goes to (its tokens fed so far)
    left               tokens the row may still draw (max_new_tokens less those drawn)
    stop               [S, K] the row's stop ids, padded with -1 (never an id)
    live               whether a request holds the slot
    kind               which (temperature, top_p) the row samples with (rows of several kinds are drawn per kind)

The host writes a slot's values only when a request takes it (`set`, with the admission's prefill), and the
state follows the slot cache when it grows or is compacted (`grow`, `keep`); a decode step needs no tensor built
on the host. The host learns what each row drew from one copy per step (`ContinuousSampler._draw`) and keeps
its own lists (ids, log-probs, finish) by the same rule `advance` applies here, so both agree on which rows end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from grpoflow.engines.protocol import Request


@dataclass
class SlotState:
    """Per-slot decode values on the device ([S] each, `stop` [S, K]); the module docstring says what each is."""
    stream: Tensor
    position: Tensor
    token: Tensor
    column: Tensor
    left: Tensor
    stop: Tensor
    live: Tensor
    kind: Tensor

    @staticmethod
    def empty(slots: int, device: torch.device) -> SlotState:
        long = torch.zeros(slots, dtype=torch.long, device=device)
        return SlotState(stream=long, position=long.clone(), token=long.clone(), column=long.clone(),
                         left=long.clone(), stop=torch.full((slots, 1), -1, dtype=torch.long, device=device),
                         live=torch.zeros(slots, dtype=torch.bool, device=device), kind=long.clone())

    @property
    def slots(self) -> int:
        return self.live.shape[0]

    def grow(self, slots: int) -> None:
        """At least `slots` slots; the new ones are free."""
        if slots <= self.slots:
            return
        more = SlotState.empty(slots - self.slots, self.live.device)
        self._widen(self.stop.shape[1])
        more._widen(self.stop.shape[1])
        for f in fields(self):
            setattr(self, f.name, torch.cat([getattr(self, f.name), getattr(more, f.name)]))

    def keep(self, index: Tensor) -> None:
        """Keep only the slots `index` [S'] (in that order), as `SlotCache.keep` does."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name)[index])

    def set(self, slots: list[int], requests: list[Request], fed: list[int], kinds: list[int]) -> None:
        """Slot slots[i] now holds requests[i], whose KV holds fed[i] tokens, which samples as kind kinds[i] and
        has drawn nothing yet: one copy to the device (an admission prefills anyway, so no step of its own)."""
        self._widen(max(len(q.stop_token_ids) for q in requests))
        k = self.stop.shape[1]
        host = torch.tensor([[s, q.stream, q.position, q.max_new_tokens, n, kind]
                             + list(q.stop_token_ids) + [-1] * (k - len(q.stop_token_ids))
                             for s, q, n, kind in zip(slots, requests, fed, kinds)], dtype=torch.long)
        values = host.to(self.live.device)
        index = values[:, 0]
        self.stream[index], self.position[index], self.left[index] = values[:, 1], values[:, 2], values[:, 3]
        self.column[index], self.kind[index], self.stop[index] = values[:, 4], values[:, 5], values[:, 6:]
        self.live[index] = True

    def advance(self, token: Tensor) -> None:
        """Every slot drew `token` [S]: the next draw is one position on; a live row that drew a stop id or its
        last token frees its slot (the host ends the same rows, `ContinuousSampler.tick`)."""
        self.token = token
        self.position += 1
        self.left -= 1
        ended = (token[:, None] == self.stop).any(-1) | (self.left <= 0)
        self.live &= ~ended

    def fed(self) -> None:
        """The live rows' tokens were fed (a decode forward wrote them at `column`)."""
        self.column += self.live.long()

    def _widen(self, k: int) -> None:
        if k > self.stop.shape[1]:
            pad = torch.full((self.slots, k - self.stop.shape[1]), -1, dtype=torch.long, device=self.stop.device)
            self.stop = torch.cat([self.stop, pad], 1)
