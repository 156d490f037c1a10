"""A KV cache for the sampling loop whose full-attention layers write into buffers allocated once.

transformers' `DynamicCache` concatenates every layer's keys and values at every decode step
(`torch.cat` of the whole cache, 60 times per step for a 30-layer model). `sampling_cache` gives a
`DynamicCache` whose plain full-attention layers are `PreallocatedLayer`s instead: each holds one
[rows, heads, capacity, head_dim] buffer per keys and values, sized for the prompt and every token the
loop may add, and a decode step writes one position into it and hands attention a view of the filled
part. Everything else (the attention mask's length from `get_seq_length`, repeating rows for the n
samples, dropping finished rows) behaves as `DynamicLayer` does. Sliding-window, linear-attention and
other layer kinds keep their own cache class.
"""

from __future__ import annotations

from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A full-attention layer's cache in preallocated buffers of `capacity` positions.

    `keys` / `values` are views [rows, heads, filled, head_dim] of the buffers, as `DynamicLayer`'s
    tensors are; writing past `capacity` raises (the loop sizes it for prompt + max_new_tokens).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.filled = 0
        self._keys: Tensor | None = None
        self._values: Tensor | None = None

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Write [rows, heads, q, head_dim] new keys and values after the filled positions; return the filled views."""
        if self._keys is None or self._values is None:
            self.lazy_initialization(key_states, value_states)
            rows, heads = key_states.shape[:2]
            self._keys = key_states.new_empty(rows, heads, self.capacity, key_states.shape[-1])
            self._values = value_states.new_empty(rows, value_states.shape[1], self.capacity, value_states.shape[-1])
        start, q = self.filled, key_states.shape[-2]
        if start + q > self.capacity:
            raise RuntimeError(f"PreallocatedLayer: {start + q} positions do not fit its capacity of {self.capacity}")
        self._keys[:, :, start:start + q] = key_states
        self._values[:, :, start:start + q] = value_states
        self.filled = start + q
        self.keys, self.values = self._keys[:, :, :self.filled], self._values[:, :, :self.filled]
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row `repeats` times in a row (row i -> rows i * repeats ... i * repeats + repeats - 1)."""
        if self._keys is not None and self._values is not None:
            self._set(self._keys.repeat_interleave(repeats, 0), self._values.repeat_interleave(repeats, 0))

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep only the rows `indices` (in that order)."""
        if self._keys is not None and self._values is not None:
            self._set(self._keys[indices], self._values[indices])

    def _set(self, keys: Tensor, values: Tensor) -> None:
        self._keys, self._values = keys, values
        self.keys, self.values = keys[:, :, :self.filled], values[:, :, :self.filled]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer is for the sampling loop, which never crops its cache")


def sampling_cache(config, capacity: int) -> DynamicCache:
    """A `DynamicCache` for `config`'s model whose plain full-attention layers are `PreallocatedLayer`s of
    `capacity` positions (prompt length + the most tokens the loop adds); other layer kinds as transformers
    builds them."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
