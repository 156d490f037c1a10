"""Drawing a token: temperature, top-p, and the log-prob (and nucleus floor) a trainer recomputes (continuous.py
calls these).

Why not `model.generate`: GRPO draws n samples of every prompt, and `generate` prefills each of the n
copies and runs its logits processors and stopping criteria at every step; the continuous sampler
prefills a prompt once, decodes every request in one forward per step, and draws here: one
log-softmax and one inverse-CDF draw per row, from the row's own counter-based stream
(`random_streams`), so the same samples come out whatever batch or worker the prompt lands in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.engines.random_streams import sample_from
from grpoflow.models.log_softmax import accurate_log_softmax
from grpoflow.models.nucleus import NO_CUT, nucleus_floor, truncated_log_probs


def sample_tokens(logits: Tensor, *, temperature: float, top_p: float,
                  uniform: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One token per row, its log-prob under the distribution it was drawn from, and that distribution's floor.

    logits: [A, V] float32. temperature <= 0 means greedy (argmax; the log-prob is then under
    the unscaled distribution). top_p < 1 draws from the smallest set of most likely tokens
    whose mass reaches top_p (nucleus sampling), and the returned log-prob is the token's under that set,
    renormalised, with the set's floor (models/nucleus.py: what the trainer needs to recompute it); top_p = 1:
    log softmax(logits / T)[token] and floor -inf.
    The draw is by inverse CDF with `uniform` ([A] in [0, 1), one per row) when given, else with
    uniforms from torch's global generator (`torch.multinomial` would draw an exponential per
    vocabulary entry, a cost docs/performance-log.md measures in "The real-model row", item 6).
    Returns tokens [A] int64, log_probs [A] float32 and floors [A] float32.
    """
    no_cut = torch.full(logits.shape[:1], NO_CUT, device=logits.device)
    if temperature <= 0:
        token = logits.argmax(-1)
        return token, accurate_log_softmax(logits).gather(-1, token[:, None]).squeeze(-1), no_cut
    z = logits / temperature if temperature != 1.0 else logits
    log_probs = accurate_log_softmax(z)  # not torch.log_softmax: float32 sums run low (models/log_softmax.py)
    probs = log_probs.exp()
    if top_p < 1.0:
        probs = top_p_filter(probs, top_p)
    if uniform is None:
        uniform = torch.rand(probs.shape[0], device=probs.device)
    token = sample_from(probs, uniform)
    if top_p < 1.0:
        floors = nucleus_floor(log_probs, top_p)
        return token, truncated_log_probs(z.float(), token, floors), floors
    return token, log_probs.gather(-1, token[:, None]).squeeze(-1), no_cut


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """[A, V] probabilities with every token outside the nucleus set to 0 (not renormalised).

    A token is kept when the mass of the tokens more likely than it is below top_p, so the most
    likely token is always kept and the kept mass is the smallest that reaches top_p.
    """
    sorted_probs, order = probs.sort(-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
