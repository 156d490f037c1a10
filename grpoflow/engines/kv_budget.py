"""The HF engine's KV budget: how many token columns its slot cache (slots.py) may hold (`rollout.kv_cache_mb`).

The slot cache of the running decode batch is `slots x capacity` token columns, each holding a key and a value
per layer and key/value head:

    bytes per column = 2 x layers x kv_heads x head_dim x bytes of the engine's dtype

(Qwen3-0.6B: 2 x 28 x 8 x 128 x 2 = 112 KiB in bf16; 32 prompts x 8 samples x 1,536 columns are 43 GiB in fp32,
21.5 GiB in bf16). The continuous sampler admits a request only while the cache it would then need fits the
budget; the others wait, in their order, for rows to finish (continuous.py).

The budget is `rollout.kv_cache_mb` when set, else what `MEMORY_FRACTION` of the device's memory holds once the
training state is counted, as the micro-batch budget (training/budget.py) counts it:

    columns = (fraction x device memory - STATE_BYTES_PER_PARAM x params) / bytes per column

In colocated mode the cache and the actor's activations never coexist (the engine releases its cache while the
actor trains, `HFRolloutEngine.sleep`), so each may take the same fraction next to the state. On a CPU the device
memory is the machine's (or its cgroup's limit); its runs are small enough never to meet it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from grpoflow.errors import UserError

MEMORY_FRACTION = 0.5
STATE_BYTES_PER_PARAM = 24  # fp32 weights, gradients, AdamW moments and a bf16 copy (training/budget.py)


def bytes_per_column(config: Any, dtype: torch.dtype) -> int:
    """KV bytes of one token in every layer, for a model with this HF config computing in `dtype`."""
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * dtype.itemsize


def device_memory_bytes(device: torch.device) -> int:
    """The memory of `device`: a CUDA device's total, or the machine's RAM (its cgroup's limit when lower)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.exists() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text().strip()))
    return int(total)


def kv_budget_columns(config: Any, dtype: torch.dtype, *, kv_cache_mb: int, memory_bytes: int, params: int) -> int:
    """Token columns of KV cache the engine may hold: `kv_cache_mb` (> 0) or from `memory_bytes` (module docstring)."""
    room = (kv_cache_mb << 20) if kv_cache_mb > 0 else MEMORY_FRACTION * memory_bytes - STATE_BYTES_PER_PARAM * params
    return max(0, int(room // bytes_per_column(config, dtype)))


def check_fits(budget_columns: int, longest: int, *, per_column: int) -> None:
    """A request of up to `longest` tokens (prompt + new) needs `longest + 2` columns (slots.py: its tokens, the
    last one's room and the dump); one that can never fit the budget is an error before anything runs."""
    need = longest + 2
    if need > budget_columns:
        mb = budget_columns * per_column >> 20
        raise UserError(f"the HF engine's KV cache budget holds {budget_columns} tokens ({mb} MB at {per_column} "
                        f"bytes per token), fewer than one request of up to {longest} tokens "
                        f"(data.max_prompt_length + rollout.max_new_tokens) needs ({need}): raise rollout.kv_cache_mb "
                        f"(0: from the device's memory) or shorten the prompts or responses.")
