"""A KV cache of fixed slots for continuous batching with a Hugging Face causal LM.

Each slot holds one sequence's keys and values LEFT-ALIGNED: the sequence's token at position p sits
in column p of every layer's buffer [slots, heads, capacity, head_dim]. A forward names which slots
it runs (`rows`), the column where each row's first new token goes (`starts`) and an explicit 4D
attention mask; each layer's `update` scatters the new keys and values at those columns and returns
the first `width` columns to attention. Because every row writes at its own column, a sequence can
join the running batch at any decode step (a prefill into a free slot), leave it, and come back later
with its saved keys and values plus only the tokens added since (KV reuse across turns): nothing is
shifted and no other row's cache is copied.

Columns a row has not written hold finite values (buffers start at zero and only real keys are
written), so a masked column contributes exactly 0 to attention. The last column is a dump: a padded
query position writes its keys there, and no mask ever lets a query read it.

Only plain full-attention decoder layers are supported (Llama, Qwen2, Mistral without sliding
window, ...): `supports(model)` says whether a model qualifies.
"""

from __future__ import annotations

import torch
from torch import Tensor


def supports(config) -> bool:
    """Whether `config`'s model has only full-attention layers (what a slot cache can serve)."""
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    return kinds <= {"full_attention"}


class SlotCache:
    """Per-layer key/value buffers of `slots` rows x `capacity` columns, written at per-row columns.

    `prepare(rows, starts, queries)` sets what the next forward writes: `rows` [A] slot indices (None: every
    slot, in order), `starts` [A] the column of each row's first new token, `queries` the forward's query
    length. Padded queries (a shorter row in a prefill) go to `pad` [A, Q] bool and write to the dump column.
    """

    def __init__(self, num_layers: int, slots: int, capacity: int) -> None:
        self.num_layers, self.slots, self.capacity = num_layers, slots, capacity
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self._rows: Tensor | None = None
        self._cols: Tensor | None = None  # [A, Q] the column each new key goes to
        self.width = 0                    # columns attention reads in the next forward

    @property
    def dump(self) -> int:
        return self.capacity - 1

    # ------------------------------------------------------------ the Cache interface the model calls

    def prepare(self, rows: Tensor | None, starts: Tensor, queries: int, pad: Tensor | None, width: int) -> None:
        if width > self.dump:
            raise RuntimeError(f"SlotCache: {width} columns do not fit a capacity of {self.capacity}; grow it first")
        cols = starts[:, None] + torch.arange(queries, device=starts.device)[None, :]
        if pad is not None:
            cols = cols.masked_fill(pad, self.dump)
        self._rows, self._cols, self.width = rows, cols, width

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[Tensor, Tensor]:
        """Write [A, heads, Q, head_dim] keys and values at the prepared columns; return [A, heads, width, dim]."""
        if self.keys[layer_idx] is None:
            self._allocate(layer_idx, key_states, value_states)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        assert keys is not None and values is not None and self._cols is not None
        rows = self._rows if self._rows is not None else torch.arange(self.slots, device=key_states.device)
        index = (rows[:, None], slice(None), self._cols)  # advanced dims first: [A, Q, heads, dim]
        keys[index] = key_states.transpose(1, 2).to(keys.dtype)
        values[index] = value_states.transpose(1, 2).to(values.dtype)
        if self._rows is None:
            return keys[:, :, :self.width], values[:, :, :self.width]
        return keys[self._rows, :, :self.width], values[self._rows, :, :self.width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width

    def _allocate(self, layer_idx: int, key_states: Tensor, value_states: Tensor) -> None:
        heads, dim = key_states.shape[1], key_states.shape[-1]
        self.keys[layer_idx] = key_states.new_zeros(self.slots, heads, self.capacity, dim)
        self.values[layer_idx] = value_states.new_zeros(self.slots, value_states.shape[1], self.capacity,
                                                        value_states.shape[-1])

    # ------------------------------------------------------------ slots: save, load, grow, compact

    def save(self, slot: int, length: int) -> list[tuple[Tensor, Tensor]]:
        """Copies of slot `slot`'s first `length` columns, per layer ([heads, length, dim] each)."""
        return [(k[slot, :, :length].clone(), v[slot, :, :length].clone())
                for k, v in zip(self.keys, self.values) if k is not None and v is not None]

    def load(self, slot: int, saved: list[tuple[Tensor, Tensor]]) -> None:
        """Write `saved` (from `save`) into slot `slot`'s first columns."""
        for layer, (k, v) in enumerate(saved):
            keys, values = self.keys[layer], self.values[layer]
            if keys is None or values is None:  # the first forward has not run: allocate like the saved tensors
                keys = self.keys[layer] = k.new_zeros(self.slots, k.shape[0], self.capacity, k.shape[-1])
                values = self.values[layer] = v.new_zeros(self.slots, v.shape[0], self.capacity, v.shape[-1])
            keys[slot, :, :k.shape[1]] = k
            values[slot, :, :v.shape[1]] = v

    def copy(self, src: Tensor, dst: Tensor, length: int) -> None:
        """Slot dst[i]'s first `length` columns become those of slot src[i] (a prompt prefilled once for its n
        samples)."""
        for store in (self.keys, self.values):
            for t in store:
                if t is not None:
                    t[dst, :, :length] = t[src, :, :length]

    def grow(self, slots: int, capacity: int) -> None:
        """At least `slots` rows and `capacity` columns (buffers reallocated and copied when they grow)."""
        slots, capacity = max(slots, self.slots), max(capacity, self.capacity)
        if (slots, capacity) == (self.slots, self.capacity):
            return
        for layer in range(self.num_layers):
            for store in (self.keys, self.values):
                old = store[layer]
                if old is not None:
                    new = old.new_zeros(slots, old.shape[1], capacity, old.shape[-1])
                    new[:self.slots, :, :self.capacity - 1] = old[:, :, :self.capacity - 1]
                    store[layer] = new
        self.slots, self.capacity = slots, capacity

    def keep(self, slots: Tensor) -> None:
        """Keep only the slots `slots` (in that order): slot slots[i] becomes slot i."""
        for layer in range(self.num_layers):
            for store in (self.keys, self.values):
                old = store[layer]
                if old is not None:
                    store[layer] = old[slots]
        self.slots = len(slots)

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


def attention_mask(starts: Tensor, queries: int, width: int, pad: Tensor | None) -> Tensor:
    """[A, 1, Q, width] bool: query q of row a (at column starts[a] + q) reads columns 0 .. starts[a] + q.

    starts: [A] may be negative where a row's first queries are padding. pad [A, Q] marks padded queries,
    which read column 0 only (finite, and nothing reads their output).
    """
    cols = torch.arange(width, device=starts.device)
    query_cols = starts[:, None] + torch.arange(queries, device=starts.device)[None, :]  # [A, Q]
    mask = cols[None, None, :] <= query_cols[:, :, None]                                   # [A, Q, width]
    if pad is not None:
        mask = mask & ~pad[:, :, None] | (pad[:, :, None] & (cols[None, None, :] == 0))
    return mask[:, None]
