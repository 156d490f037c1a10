"""Responses packed without padding: the decoder runs each distinct prompt's tokens and each response's real
tokens once, laid end to end in one [1, N] sequence.

A GRPO batch pads every response to the longest, and every layer runs the padding (on the real-model row, a
fifth of its tokens: docs/performance-log.md, "Packed responses and the head's kept probabilities"). Every op of a
decoder layer but attention works token by token, so it runs on the packed tokens as they are; attention
(`packed_attention`) gathers each sequence into small padded blocks of its own:

    prompt block d     the distinct prompt d's tokens, causal over themselves
    response block i   response i's tokens, reading prompt inverse[i]'s tokens and causally their own

so a prompt shared by n responses runs once and its keys serve all n (as the shared-prompt KV cache of
`logprobs.response_outputs` does), and no padded position goes through a projection or an MLP. The
gradient is that of the padded forward: the gathers' backward adds each key's gradient from every block
that read it.

The layout travels to the attention function as a keyword argument of the decoder's forward (transformers
passes its keyword arguments down to the attention interface), so only a model whose attention
implementation is `attention.GROUPED_ATTENTION` can run packed (`attention.attends_packed`): any other
implementation would ignore the layout and attend across the whole packed sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Blocks:
    """Queries [n, q] and keys [n, k] of n padded attention blocks, as positions in the packed sequence (0 where
    padded), and the blocks' additive mask [n, 1, q, k] (0 where a key is visible, the dtype's minimum elsewhere;
    a padded query reads key 0 only, so its softmax stays finite, and nothing reads its output)."""
    queries: Tensor
    keys: Tensor
    mask: Tensor


@dataclass(frozen=True)
class PackedLayout:
    """Where every token of a packed batch sits, for the decoder's forward and for `packed_attention`.

    input_ids / position_ids: [1, N] the packed tokens (distinct prompts first, then each response's tokens
    but its last) and their positions in their own sequence. blocks: the prompt blocks and the response blocks.
    out_index: [N] each packed token's row in the blocks' outputs flattened and concatenated. predict: [T] the
    packed position whose hidden state predicts each real response token, in the row-major order of
    `response_mask` (for response i, token 0 is predicted by the last token of its prompt, token t > 0 by its
    own token t - 1).
    """
    input_ids: Tensor
    position_ids: Tensor
    blocks: tuple[Blocks, Blocks]
    out_index: Tensor
    predict: Tensor


def can_pack(prompt_mask: Tensor, response_mask: Tensor) -> bool:
    """Whether `pack` takes this batch: every prompt has a token, and every response row of the [B, R] 0/1 mask is
    ones then zeros (a hole would be a token packing drops while later tokens read it)."""
    m = response_mask.long()
    right_padded = bool((m[:, 1:] <= m[:, :-1]).all()) if m.shape[1] > 1 else True
    return right_padded and bool(prompt_mask.bool().any(-1).all())


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each distinct (left-padded) prompt once: its ids [D, P] and mask [D, P] (the mask's dtype is the ids'), and
    inverse [B], the distinct prompt of each row."""
    distinct, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1), dim=0,
                                     return_inverse=True)
    p = prompt_ids.shape[1]
    return distinct[:, :p], distinct[:, p:], inverse


def pack(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor, *,
         mask_dtype: torch.dtype) -> PackedLayout:
    """The layout of a batch: prompt_ids / prompt_mask [B, P] left-padded, response_ids / response_mask [B, R]
    right-padded (`can_pack`); `mask_dtype` the blocks' mask dtype (the model's compute dtype)."""
    device = prompt_ids.device
    d_ids, d_mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    d_mask = d_mask.bool()
    lengths = d_mask.sum(-1)                                                  # [D] prompt tokens
    d_count, lmax = len(d_ids), int(lengths.max())
    prompt_start = torch.cumsum(lengths, 0) - lengths                          # [D] exclusive
    prompt_total = int(lengths.sum())

    resp_len = response_mask.long().sum(-1)                                    # [B] real response tokens
    inputs_len = (resp_len - 1).clamp(min=0)                                   # the last one is only a label
    b, r = response_ids.shape
    cols = torch.arange(r, device=device)
    is_input = cols[None, :] < inputs_len[:, None]                             # [B, R]
    resp_start = prompt_total + torch.cumsum(inputs_len, 0) - inputs_len       # [B]

    # the packed tokens: left-padded prompts give their tokens in order under a boolean mask
    input_ids = torch.cat([d_ids[d_mask], response_ids[is_input]])
    positions = torch.cat([(d_mask.long().cumsum(-1) - 1)[d_mask],
                           (lengths[inverse][:, None] + cols[None, :])[is_input]])

    # prompt blocks: prompt d's tokens left-aligned in row d
    steps = torch.arange(lmax, device=device)
    prompt_valid = steps[None, :] < lengths[:, None]                           # [D, Lmax]
    prompt_pos = torch.where(prompt_valid, prompt_start[:, None] + steps[None, :], 0)
    causal = steps[None, :, None] >= steps[None, None, :]                      # [1, q, k]
    prompt_visible = causal & prompt_valid[:, None, :]
    prompt_blocks = Blocks(prompt_pos, prompt_pos, _additive(prompt_visible, prompt_valid, mask_dtype))

    # response blocks: response i's queries read prompt inverse[i] (the first Lmax keys) and themselves
    rmax = max(int(inputs_len.max()) if b else 0, 1)
    rsteps = torch.arange(rmax, device=device)
    resp_valid = rsteps[None, :] < inputs_len[:, None]                         # [B, Rm]
    resp_pos = torch.where(resp_valid, resp_start[:, None] + rsteps[None, :], 0)
    own = (rsteps[None, :, None] >= rsteps[None, None, :]) & resp_valid[:, None, :]   # [B, Rm, Rm]
    resp_visible = torch.cat([prompt_valid[inverse][:, None, :].expand(b, rmax, lmax), own], dim=2)
    resp_blocks = Blocks(resp_pos, torch.cat([prompt_pos[inverse], resp_pos], dim=1),
                         _additive(resp_visible, resp_valid, mask_dtype))

    flat_prompt = torch.arange(d_count * lmax, device=device).view(d_count, lmax)[prompt_valid]
    flat_resp = d_count * lmax + torch.arange(b * rmax, device=device).view(b, rmax)[resp_valid]
    last_prompt = (prompt_start + lengths - 1)[inverse]                          # [B]
    predict = torch.where(cols[None, :] == 0, last_prompt[:, None], resp_start[:, None] + cols[None, :] - 1)
    return PackedLayout(input_ids[None], positions[None], (prompt_blocks, resp_blocks),
                        torch.cat([flat_prompt, flat_resp]), predict[response_mask.bool()])


def _additive(visible: Tensor, query_valid: Tensor, dtype: torch.dtype) -> Tensor:
    """[n, 1, q, k] additive mask: `visible` [n, q, k] where the query is real, key 0 only where it is padding."""
    key0 = torch.zeros_like(visible)
    key0[..., 0] = True
    visible = torch.where(query_valid[:, :, None], visible, key0)
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
        ~visible, torch.finfo(dtype).min)[:, None]


def packed_hidden(model: torch.nn.Module, layout: PackedLayout) -> Tensor:
    """[T, H] the decoder's last hidden states that predict each real response token (`PackedLayout.predict`)."""
    decoder = model.get_decoder()  # type: ignore[operator]
    placeholder = torch.zeros(1, 1, 1, 1, device=layout.input_ids.device)  # a 4D mask: transformers builds none
    hidden = decoder(input_ids=layout.input_ids, position_ids=layout.position_ids, attention_mask=placeholder,
                     use_cache=False, packed=layout).last_hidden_state[0]
    return hidden.index_select(0, layout.predict)  # the prompt's last position repeats: logprobs.response_outputs


def packed_attention(query: Tensor, key: Tensor, value: Tensor, layout: PackedLayout, attend) -> Tensor:
    """query [1, H, N, d], key / value [1, Hk, N, d] of the packed sequence; `attend(q, k, v, mask)` the attention of
    padded blocks ([n, H, q, d], [n, Hk, k, d], [n, 1, q, k] -> [n, q, H, d]). Returns [1, N, H, d]."""
    h, d = query.shape[1], query.shape[3]
    outs = []
    for blocks in layout.blocks:  # index_select: its backward is an index_add, which a CPU runs fast
        q = _gather(query[0], blocks.queries)                                # [n, H, q, d]
        k, v = _gather(key[0], blocks.keys), _gather(value[0], blocks.keys)  # [n, Hk, k, d]
        outs.append(attend(q, k, v, blocks.mask).reshape(-1, h, d))
    return torch.cat(outs).index_select(0, layout.out_index)[None]


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """x [heads, N, d] at positions index [n, m]: [n, heads, m, d]."""
    return x.index_select(1, index.flatten()).view(x.shape[0], *index.shape, x.shape[2]).transpose(0, 1)
