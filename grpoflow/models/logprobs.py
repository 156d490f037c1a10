"""Per-token log-probabilities and entropy of a causal LM's responses.

Four things make this pass cheap:

- **Shared prompts.** GRPO scores n responses to each prompt. When a micro-batch holds repeated
  prompts, each distinct prompt is run once (its KV cache, with its autograd graph, is then
  repeated for its responses) and only the response tokens run per row. The result and the
  gradient are those of the full forward: the repeated prompt activations are the same
  tensors, so their gradients add up exactly as the n separate copies' would.
- **bf16 compute** (`compute_dtype="bfloat16"`): the model forward (and so its backward) runs in
  bfloat16, while the parameters, their gradients and the optimizer stay in float32 (master weights):
  on a bf16 compute copy of the model (the actor on one rank, `training.mixed_precision`), or under
  `torch.autocast` for a float32 model (FSDP ranks, LoRA, the critic).
- **No padding** (models/packed.py), for a model attending with `attention.grouped_attention` (the trained
  and frozen roles on a CPU): the fused-head path runs each distinct prompt and each response's real tokens once, end to
  end in one sequence, and attention keeps to each sequence's blocks; otherwise the shared prompt's
  responses run padded to the longest.
- **No [B, R, V] logits** for the models whose logits are a plain linear head on the last hidden
  state (`FUSED_HEAD_MODEL_TYPES`: Llama, Mistral, Qwen2/3): the decoder returns hidden states, and
  `head_log_probs` applies the head in row chunks to the real (unpadded) response tokens only,
  keeping per-token results, so the backward recomputes each chunk instead of storing
  B x R x V floats. Other models (or FSDP ranks) compute log-softmax in float32 chunks over the
  response positions' logits (`logits_to_keep`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import DynamicCache

from grpoflow.models.attention import attends_packed
from grpoflow.models.head_logprobs import head_log_probs
from grpoflow.models.exact import BatchInvariantOps
from grpoflow.models.loading import cache_keyword
from grpoflow.models.log_softmax import accurate_log_softmax
from grpoflow.models.nucleus import truncated_log_probs
from grpoflow.models.packed import can_pack, distinct_prompts, pack, packed_hidden

# Share the prompt forward only when it removes at least this fraction of the tokens: the
# shared path runs two forwards instead of one, which costs a few milliseconds of overhead.
MIN_SHARED_SAVING = 0.2
# Architectures whose causal-LM logits are exactly `lm_head(last hidden state)`: no bias, no logit
# scaling or soft-capping, so the head can be applied outside the model (`head_log_probs`).
FUSED_HEAD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def as_dtype(compute_dtype: str | torch.dtype | None) -> torch.dtype:
    """torch dtype of a `model.compute_dtype` value (None: float32)."""
    dtype = getattr(torch, compute_dtype) if isinstance(compute_dtype, str) else compute_dtype
    return dtype or torch.float32


def compute_autocast(compute_dtype: str | torch.dtype | None, device: torch.device | str = "cpu",
                     model: torch.nn.Module | None = None):
    """A context that runs matrix products in `compute_dtype` (autocast), or nothing for float32/None or for a
    `model` whose parameters are in `compute_dtype` already (a bf16 compute copy: nothing to cast)."""
    dtype = as_dtype(compute_dtype)
    first = next(model.parameters(), None) if model is not None else None
    if dtype == torch.float32 or (first is not None and first.dtype == dtype):
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def token_log_probs(logits: Tensor, labels: Tensor, *, chunk_size: int = 1024, temperature: float = 1.0,
                    with_entropy: bool = False, entropy_grad: bool = False, floors: Tensor | None = None,
                    exact: bool = False) -> tuple[Tensor, Tensor | None]:
    """log p(label) and (optionally) the entropy of each position, of softmax(logits / temperature).

    logits: [B, T, V] (any float dtype; computed in float32), labels: [B, T] int64.
    Returns log_probs [B, T] float32 and entropy [B, T] float32 (or None), where
    entropy = logsumexp(z) - sum_v softmax(z)_v * z_v. Gradients flow through log_probs, and
    through entropy only with `entropy_grad` (an entropy bonus); otherwise it is a detached metric.
    `floors` [B, T] (top-p samples' nucleus floors, models/nucleus.py): log p(label) is then under the kept tokens,
    renormalised (the entropy stays the full distribution's). `exact`: log p(label) as the sampler computes it,
    accurate_log_softmax(z)[label] (the same rounding, engines/sampling.py).
    """
    b, t, v = logits.shape
    flat = logits.reshape(b * t, v)
    flat_labels = labels.reshape(b * t)
    flat_floors = floors.reshape(b * t).float() if floors is not None else None
    logps, ents = [], []
    for start in range(0, b * t, max(chunk_size, 1)):
        z = flat[start:start + chunk_size].float()
        if temperature != 1.0:
            z = z / temperature
        lse = torch.logsumexp(z, dim=-1)
        chunk_labels = flat_labels[start:start + chunk_size]
        if flat_floors is not None:
            logps.append(truncated_log_probs(z, chunk_labels, flat_floors[start:start + chunk_size]))
        elif exact:
            logps.append(accurate_log_softmax(z).gather(-1, chunk_labels[:, None]).squeeze(-1))
        else:
            logps.append(z.gather(-1, chunk_labels[:, None]).squeeze(-1) - lse)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ents.append(lse - (torch.softmax(z, dim=-1) * z).sum(-1))
    log_probs = torch.cat(logps).reshape(b, t) if logps else logits.new_zeros(b, t, dtype=torch.float32)
    entropy = (torch.cat(ents).reshape(b, t) if ents else log_probs.detach() * 0) if with_entropy else None
    return log_probs, entropy


def response_log_probs(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                       response_mask: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024,
                       with_entropy: bool = False, entropy_grad: bool = False,
                       compute_dtype: str | torch.dtype | None = None, fused: bool = True,
                       share_prompts: bool = True, packed: bool = True, keep_probs: bool = True,
                       floors: Tensor | None = None, exact: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, R] (and entropy [B, R]) of the response tokens given left-padded prompts.

    prompt_ids/prompt_mask: [B, P] (left-padded), response_ids/response_mask: [B, R]
    (right-padded). The logits at input position P - 1 + t predict response token t; they
    are divided by `temperature` (in float32) so the result matches the sampling distribution.
    The forward runs under `compute_autocast(compute_dtype)` (nothing to do for a model already in that dtype).
    Padding positions hold arbitrary values (0 on the fused-head path): mask them with `response_mask`.
    `fused` / `share_prompts` / `packed` / `keep_probs` False turn the fused head, the shared prompt forward,
    packing and the head's kept probabilities off (they are on where they apply; the results are the same either
    way up to float rounding, bench/ablation.py times the difference).
    `floors` [B, R]: the top-p samples' nucleus floors (models/nucleus.py); each log-prob is then the token's under
    the kept tokens, renormalised, what the engine sampled from. The fused head's hand-written backward knows only
    the full softmax, so the head then runs as a plain product (its [tokens, V] logits kept for autograd).
    `exact` (rollout.exact): the forward runs under `BatchInvariantOps` with the model's head and the sampler's
    log-softmax (models/exact.py: each token's numbers do not depend on the micro-batch), so the log-probs equal
    the engine's bit for bit.
    """
    if exact:
        with BatchInvariantOps(), compute_autocast(compute_dtype, prompt_ids.device, model):
            logits = response_outputs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                      share_prompts=share_prompts)
        return token_log_probs(logits, response_ids, chunk_size=chunk_size, temperature=temperature,
                               with_entropy=with_entropy, entropy_grad=entropy_grad, floors=floors, exact=True)
    head = fused_head(model) if fused else None
    if head is None:
        with compute_autocast(compute_dtype, prompt_ids.device, model):
            logits = response_outputs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                      share_prompts=share_prompts)
        return token_log_probs(logits, response_ids, chunk_size=chunk_size, temperature=temperature,
                               with_entropy=with_entropy, entropy_grad=entropy_grad, floors=floors)
    keep = response_mask.bool()
    with compute_autocast(compute_dtype, prompt_ids.device, model):
        if packed and share_prompts and attends_packed(model) and not _checkpointing(model) \
                and can_pack(prompt_mask, response_mask):
            selected = packed_hidden(model, pack(prompt_ids, prompt_mask, response_ids, response_mask,
                                                 mask_dtype=as_dtype(compute_dtype)))
        else:
            selected = response_outputs(model, prompt_ids, prompt_mask, response_ids, response_mask, hidden=True,
                                        share_prompts=share_prompts)[keep]
    if floors is not None:
        dtype = as_dtype(compute_dtype)
        logits = torch.mm(selected.to(dtype), head.weight.to(dtype).t())
        log_probs, entropy = token_log_probs(logits[None], response_ids[keep][None], chunk_size=chunk_size,
                                             temperature=temperature, with_entropy=with_entropy,
                                             entropy_grad=entropy_grad, floors=floors[keep][None])
        log_probs, entropy = log_probs[0], None if entropy is None else entropy[0]
    else:
        log_probs, entropy = head_log_probs(selected, head.weight, response_ids[keep], temperature=temperature,
                                            chunk_size=chunk_size, with_entropy=with_entropy,
                                            entropy_grad=entropy_grad, compute_dtype=as_dtype(compute_dtype),
                                            keep_probs_bytes=None if keep_probs else 0)
    zeros = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device)
    return zeros.masked_scatter(keep, log_probs), None if entropy is None else zeros.masked_scatter(keep, entropy)


def fused_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The LM head when log-probs can be taken from the decoder's hidden states (`head_log_probs`): a
    `FUSED_HEAD_MODEL_TYPES` model whose head is a plain bias-free Linear, on one rank (FSDP gathers the
    head's shard in the model's own forward). None otherwise."""
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]
    if getattr(config, "model_type", None) not in FUSED_HEAD_MODEL_TYPES or _several_ranks():
        return None
    return head if head is not None and type(head) is torch.nn.Linear and head.bias is None else None


def response_outputs(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                     response_mask: Tensor, *, hidden: bool = False, share_prompts: bool = True) -> Tensor:
    """[B, R, V] logits, or with `hidden` the decoder's [B, R, H] last hidden states, at the positions that
    predict each response token (row t predicts response token t).

    With `share_prompts`, repeated prompts are run once when that saves at least `MIN_SHARED_SAVING` of the tokens;
    not with gradient checkpointing (its recomputation does not go through a KV cache) and not
    on several ranks (a sharded model's forward is a collective: every rank must run as many
    forwards as the others, whatever its own prompts).
    """
    b, p = prompt_ids.shape
    r = response_ids.shape[1]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    distinct_ids, distinct_mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    shared_tokens = len(distinct_ids) * p + b * r
    forward = _last_positions(model, hidden)
    saving = shared_tokens <= (1 - MIN_SHARED_SAVING) * b * (p + r)
    if not (share_prompts and saving) or _checkpointing(model) or _several_ranks():
        out = forward(r + 1, input_ids=torch.cat([prompt_ids, response_ids], dim=1), attention_mask=attention_mask,
                      position_ids=position_ids, use_cache=False)
        return out[:, :-1]
    # Each distinct prompt once: the last prompt position predicts response token 0.
    cache, cache_kw = DynamicCache(config=model.config), cache_keyword(model)  # type: ignore[arg-type]
    first = forward(1, input_ids=distinct_ids, attention_mask=distinct_mask,
                    position_ids=(distinct_mask.cumsum(-1) - 1).clamp(min=0), **{cache_kw: cache}, use_cache=True)
    cache.reorder_cache(inverse)  # [distinct, ...] -> [B, ...]: an index_select, gradients flow back through it
    rest = forward(r, input_ids=response_ids, attention_mask=attention_mask, position_ids=position_ids[:, p:],
                   **{cache_kw: cache}, use_cache=True)
    # index_select, not first[inverse]: rows repeat, and the backward of advanced indexing on a CPU adds float32
    # rows with parallel atomics (run-to-run rounding); index_select's backward, an index_add, adds in order.
    return torch.cat([first.index_select(0, inverse), rest[:, :-1]], dim=1)


def _last_positions(model: torch.nn.Module, hidden: bool):
    """forward(keep, **inputs) -> the last `keep` positions' logits, or (`hidden`) the decoder's last hidden
    states there, without running the head."""
    if not hidden:
        return lambda keep, **inputs: model(**inputs, logits_to_keep=keep).logits
    decoder = model.get_decoder()  # type: ignore[operator]
    return lambda keep, **inputs: decoder(**inputs).last_hidden_state[:, -keep:]


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether any layer recomputes its activations (transformers' gradient checkpointing flag)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _several_ranks() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
