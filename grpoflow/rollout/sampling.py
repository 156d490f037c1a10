"""KV-cached sampling for a Hugging Face causal LM: each prompt is prefilled once, its n samples decode.

Why not `model.generate`: GRPO draws n samples of every prompt, and `generate` prefills each of
the n copies; here the B distinct prompts are prefilled once and their KV cache is repeated n
times. Decoding then feeds one token per row and stops as soon as every row has emitted EOS;
rows that finished leave the decode batch (their cache rows are dropped) once they are a quarter
of it, so a few long samples do not keep paying for the short ones. The per-step work is one
forward, one log-softmax and one draw, without `generate`'s logits processors and stopping
criteria; the KV cache is written into buffers allocated once (`kv_cache`), not concatenated.

Draws come from torch's global generator (a seed fixes the samples of a batch) or, given one seed
per prompt, from a counter-based stream per sample (`random_streams`): the same samples whatever
batch or worker the prompt lands in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.rollout.kv_cache import sampling_cache
from grpoflow.rollout.random_streams import row_seeds, sample_from, uniforms
from grpoflow.models.loading import cache_keyword

# Finished rows leave the decode batch once they are at least 1 / DROP_FRACTION of it: a decode step's matrix
# products read every weight once whatever the row count, so a few idle rows cost little, while dropping
# copies every layer's cache. (On SmolLM2's short answers, dropping at every finish, at a quarter or never
# took the same time: `bench/ablation.py --real-model`; long, varied answers are where dropping pays.)
DROP_FRACTION = 4


def sample_tokens(logits: Tensor, *, temperature: float, top_p: float,
                  uniform: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One token per row and its log-prob under the full temperature-scaled distribution.

    logits: [A, V] float32. temperature <= 0 means greedy (argmax; the log-prob is then under
    the unscaled distribution). top_p < 1 draws from the smallest set of most likely tokens
    whose mass reaches top_p (nucleus sampling), but the returned log-prob is still the one of
    the full distribution, log softmax(logits / T)[token], the one a trainer recomputes.
    The draw is by inverse CDF with `uniform` ([A] in [0, 1), one per row) when given, else with
    uniforms from torch's global generator (`torch.multinomial` would draw an exponential per
    vocabulary entry: 40 ms per step for 64 rows over a 49k vocabulary on a CPU core).
    Returns tokens [A] int64 and log_probs [A] float32.
    """
    if temperature <= 0:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None]).squeeze(-1)
    log_probs = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, -1)
    probs = log_probs.exp()
    if top_p < 1.0:
        probs = top_p_filter(probs, top_p)
    if uniform is None:
        uniform = torch.rand(probs.shape[0], device=probs.device)
    token = sample_from(probs, uniform)
    return token, log_probs.gather(-1, token[:, None]).squeeze(-1)


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """[A, V] probabilities with every token outside the nucleus set to 0 (not renormalised).

    A token is kept when the mass of the tokens more likely than it is below top_p, so the most
    likely token is always kept and the kept mass is the smallest that reaches top_p.
    """
    sorted_probs, order = probs.sort(-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


@torch.no_grad()
def sample(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, *, n: int, max_new_tokens: int,
           temperature: float, top_p: float, eos_token_ids: Tensor, pad_token_id: int,
           seeds: Tensor | None = None, drop_finished: bool = True) -> tuple[Tensor, Tensor]:
    """n samples of each of B left-padded prompts, prompt-major (sample j of prompt i is row i * n + j).

    prompt_ids, prompt_mask: [B, P] on the model's device. eos_token_ids: [E] int64.
    seeds: [B] int64, one per prompt: each sample then draws from its own counter-based stream
    (`random_streams`), so a prompt's samples do not depend on the batch it is in; None: torch's
    global generator, so the samples depend on the seed and on the batch.
    Returns response_ids [B*n, R] (pad_token_id after a row's first EOS) and log_probs
    [B*n, R] float32 (0 after the first EOS), R = the decode steps taken (<= max_new_tokens;
    fewer when every row emitted EOS earlier). `drop_finished=False` keeps finished rows in the
    decode batch, fed padding (to measure what dropping them saves).
    """
    device = prompt_ids.device
    capacity = prompt_ids.shape[1] + max_new_tokens
    cache, cache_kw = sampling_cache(model.config, capacity), cache_keyword(model)
    positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    # The last position as an index tensor, not `logits_to_keep=1`: a [B, 1, H] slice of the hidden states is not
    # contiguous, and the head's matmul then copies its weight B times (0.6 s per call at a 49k vocabulary).
    last = torch.tensor([prompt_ids.shape[1] - 1], device=device)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, **{cache_kw: cache},
                use_cache=True, logits_to_keep=last)
    logits = out.logits[:, -1].float().repeat_interleave(n, 0)  # [B*n, V]
    if n > 1:
        cache.batch_repeat_interleave(n)
    rows = logits.shape[0]
    attention_mask = prompt_mask.new_ones(rows, capacity)  # decode step t attends to the first P + t + 1 columns
    attention_mask[:, :prompt_ids.shape[1]] = prompt_mask.repeat_interleave(n, 0)
    next_position = prompt_mask.long().sum(-1).repeat_interleave(n, 0)
    active = torch.arange(rows, device=device)       # output row of each decode-batch row
    response_ids = torch.full((rows, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    log_probs = torch.zeros(rows, max_new_tokens, device=device)
    streams = None if seeds is None else row_seeds(seeds.cpu(), n).to(device)  # [B*n]
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # per decode-batch row
    width = 0
    for t in range(max_new_tokens):
        uniform = None if streams is None else uniforms(streams[active], t)
        token, token_log_prob = sample_tokens(logits, temperature=temperature, top_p=top_p, uniform=uniform)
        token, token_log_prob = token.masked_fill(finished, pad_token_id), token_log_prob.masked_fill(finished, 0.0)
        response_ids[active, t], log_probs[active, t] = token, token_log_prob
        width = t + 1
        finished = finished | torch.isin(token, eos_token_ids)
        if t == max_new_tokens - 1 or finished.all():
            break
        if drop_finished and int(finished.sum()) * DROP_FRACTION >= len(active):
            keep = (~finished).nonzero().squeeze(-1)  # finished rows leave the decode batch, with their cache rows
            active, token, finished = active[keep], token[keep], finished[keep]
            attention_mask, next_position = attention_mask[keep], next_position[keep]
            cache.batch_select_indices(keep)
        out = model(input_ids=token[:, None], attention_mask=attention_mask[:, :prompt_ids.shape[1] + t + 1],
                    position_ids=next_position[:, None], **{cache_kw: cache}, use_cache=True)
        next_position = next_position + 1
        logits = out.logits[:, -1].float()
    return response_ids[:, :width], log_probs[:, :width]
