"""The micro-batch token budget chosen from memory (`actor.max_tokens_per_microbatch=0`, the default).

A fixed budget is either too small for a large machine (the step is cut into micro-batches that fit
many times over, and each costs a pass over the weights and re-runs shared prompts) or too large for
a small one. The budget here is what fits in `MEMORY_FRACTION` of the device's memory once the
training state is counted:

    budget = (fraction x memory - state) / activation bytes per token,    clamped to [MIN, MAX] tokens

- memory: the GPU's total memory, or on a CPU the machine's (or its cgroup's limit, if lower);
- state: `STATE_BYTES_PER_PARAM` per parameter (float32 weights, gradients and AdamW's two moments,
  16 bytes, plus a bf16 compute or rollout copy and the reference, rounded up to 24);
- activation bytes per token, what a decoder keeps for its backward (Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", without recomputation, with a
  SwiGLU MLP): per layer 34 h + 8 i + 5 a s bytes in 16-bit activations (h hidden, i MLP width,
  a query heads, s sequence length), twice that for float32 activations.

It depends on the machine's total memory, not on what is free at the moment, so a run and its
resume choose the same budget (and so the same micro-batches). The controller chooses it, from the
memory where it runs, for every role, so only for `backend=local` (the ranks run in its process); with
`backend=ray` the ranks may run on other machines and GPUs, and 0 means `MIN_TOKENS` (the old fixed default):
set `actor.max_tokens_per_microbatch` for them yourself. On SmolLM2-135M it estimates more than
the activation memory measured, a safe side to err on (docs/performance-log.md, "The fair comparison on the AMD EPYC,
and the bf16 compute copy", item 2).
"""

from __future__ import annotations

import os
from pathlib import Path

MEMORY_FRACTION = 0.5
STATE_BYTES_PER_PARAM = 24
MIN_TOKENS, MAX_TOKENS = 4096, 65536  # the old fixed default; past a step's size a larger budget buys nothing
ROUND_TO = 256


def activation_bytes_per_token(*, layers: int, hidden: int, intermediate: int, heads: int, seq: int,
                               act_bytes: int) -> float:
    """Bytes of saved activations per token of one forward (see the module docstring); act_bytes 2 or 4."""
    return layers * (34 * hidden + 8 * intermediate + 5 * heads * seq) * act_bytes / 2


def token_budget(*, memory_bytes: float, params: int, per_token: float, fraction: float = MEMORY_FRACTION) -> int:
    """Padded tokens per micro-batch that fit in `fraction` of `memory_bytes` next to the training state of
    `params` parameters, rounded down to `ROUND_TO`, within [MIN_TOKENS, MAX_TOKENS]."""
    room = fraction * memory_bytes - STATE_BYTES_PER_PARAM * params
    tokens = int(room / per_token) // ROUND_TO * ROUND_TO if per_token > 0 else MAX_TOKENS
    return max(MIN_TOKENS, min(MAX_TOKENS, tokens))


def machine_memory_bytes() -> int:
    """The memory a training process here can use: the first GPU's, else the machine's RAM (or its cgroup's
    limit, when one is set and lower)."""
    import torch
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.exists() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text().strip()))
    return int(total)


def auto_token_budget(model_config, *, params: int, seq: int, compute_dtype: str | None,
                      memory_bytes: int | None = None) -> int:
    """The budget for a model with this HF config (`num_hidden_layers`, `hidden_size`, `intermediate_size`,
    `num_attention_heads`; missing fields count as for a 4x-wide MLP), sequences of up to `seq` tokens, activations
    in `compute_dtype`, on this machine (or `memory_bytes`)."""
    hidden = int(getattr(model_config, "hidden_size", 0) or 0)
    per_token = activation_bytes_per_token(
        layers=int(getattr(model_config, "num_hidden_layers", 1) or 1), hidden=hidden,
        intermediate=int(getattr(model_config, "intermediate_size", 0) or 4 * hidden),
        heads=int(getattr(model_config, "num_attention_heads", 1) or 1), seq=seq,
        act_bytes=2 if compute_dtype == "bfloat16" else 4)
    memory = machine_memory_bytes() if memory_bytes is None else memory_bytes
    return token_budget(memory_bytes=memory, params=params, per_token=per_token)


def estimated_params(model_config) -> int:
    """Parameters of a decoder from its HF config (embeddings, attention with grouped key/value heads, a gated
    MLP, the head unless tied): enough for the state term of the budget, without loading the weights."""
    h = int(getattr(model_config, "hidden_size", 0) or 0)
    i = int(getattr(model_config, "intermediate_size", 0) or 4 * h)
    heads = int(getattr(model_config, "num_attention_heads", 1) or 1)
    kv = int(getattr(model_config, "num_key_value_heads", heads) or heads)
    head_dim = int(getattr(model_config, "head_dim", 0) or h // heads)
    vocab = int(getattr(model_config, "vocab_size", 0) or 0)
    layer = h * heads * head_dim * 2 + h * kv * head_dim * 2 + 3 * h * i
    tied = bool(getattr(model_config, "tie_word_embeddings", False))
    return int(getattr(model_config, "num_hidden_layers", 1) or 1) * layer + vocab * h * (1 if tied else 2)


def microbatch_budget(budget: int, *, model_path: str, seq: int, compute_dtype: str | None,
                      memory_bytes: int | None = None, ranks_here: bool = True) -> int:
    """`budget` as configured, or for 0 the budget from memory for the model in `model_path` (its config.json;
    `MIN_TOKENS` when there is none to read), never less than one sequence of `seq` tokens. `ranks_here=False`
    (backend=ray: the ranks may run on other machines and GPUs, whose memory this process cannot see): `MIN_TOKENS`,
    the old fixed default, rather than a budget sized for the wrong memory."""
    if budget > 0:
        return budget
    if not ranks_here:
        return max(seq, MIN_TOKENS)
    try:
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return max(seq, MIN_TOKENS)
    config = getattr(config, "text_config", None) or config
    return max(seq, auto_token_budget(config, params=estimated_params(config), seq=seq, compute_dtype=compute_dtype,
                                      memory_bytes=memory_bytes))
