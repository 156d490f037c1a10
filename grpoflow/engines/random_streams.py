"""Counter-based random numbers: one independent stream per sample, whatever batch it is in.

A rollout's samples must not depend on how prompts are spread over rollout workers (one engine
or four, colocated or split, sync or async) or on which other prompts share a decode batch.
torch's global generator gives a single stream per process, consumed in batch order, so it
cannot promise that. Here every sample row has a 32-bit seed derived from (step seed, prompt
index, sample number), and the uniform for decode position t is a hash of (row seed, t):
vectorised integer ops, no state, the same numbers in any batch.

The hash is PCG's RXS-M-XS output permutation on 32-bit values, computed in int64 so no
product overflows (2^32 x 747796405 < 2^63).
"""

from __future__ import annotations

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF


def hash32(x: Tensor) -> Tensor:
    """[...] int64 holding uint32 values -> [...] well-mixed uint32 values (as int64)."""
    state = (x * 747796405 + 2891336453) & MASK32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & MASK32
    return ((word >> 22) ^ word) & MASK32


def prompt_seeds(seed: int, indices: Tensor) -> Tensor:
    """[B] int64 seeds of B prompts for one call: a function of (seed, prompt index) only.

    seed: the call's seed (e.g. the step's); indices: [B] each prompt's index in the dataset.
    """
    return hash32(torch.tensor(seed & MASK32, dtype=torch.int64) ^ hash32(indices.long() & MASK32))


def row_seeds(seeds: Tensor, n: int) -> Tensor:
    """[B*n] int64 seeds of the rows of B prompts x n samples (prompt-major), from [B] prompt seeds."""
    sample = torch.arange(n, dtype=torch.int64)
    return hash32(seeds.long()[:, None] ^ hash32(sample + 0x9E3779B9 & MASK32)[None, :]).reshape(-1)


def uniforms(seeds: Tensor, position: int | Tensor) -> Tensor:
    """[A] float32 in [0, 1): the uniform of each row's stream at decode position `position` (an int, or [A]
    one per row: rows of a continuous batch are at different positions of their own samples)."""
    position = torch.as_tensor(position, dtype=torch.int64, device=seeds.device)
    counter = hash32((position * 0x85EBCA6B + 0x632BE59B) & MASK32)
    bits = hash32(seeds ^ counter) >> 8  # 24 bits: exact in float32
    return bits.to(torch.float32) / float(1 << 24)


def sample_from(probs: Tensor, u: Tensor) -> Tensor:
    """[A] token ids drawn by inverse CDF from [A, V] unnormalised probabilities with uniforms [A].

    A token with probability 0 (e.g. outside the top-p nucleus) is never drawn.
    """
    cdf = probs.cumsum(-1)
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
