"""Validation metrics over k samples per prompt: mean@k, std@k, pass@k (unbiased), maj@k.

Pure functions of per-prompt score lists (and extracted answers for voting); the numbers are
averaged over prompts. A sample counts as correct for pass@k when its score >= `threshold`.
"""

from __future__ import annotations

import math
from collections import Counter
from statistics import mean, pstdev


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021, Codex): 1 - C(n - c, k) / C(n, k), n samples, c correct."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}.")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_score(answers: list[str], scores: list[float]) -> float:
    """The score of the most frequent answer (ties: the one seen first), i.e. maj@k for one prompt."""
    counts = Counter(answers)
    best = max(counts.values())
    winner = next(a for a in answers if counts[a] == best)
    return scores[answers.index(winner)]


def group_metrics(scores: list[list[float]], answers: list[list[str]], *, threshold: float = 1.0) -> dict[str, float]:
    """Metrics over prompts, each with k samples: mean@k, std@k, pass@1, pass@k, maj@k (k >= 2 for the last)."""
    k = len(scores[0])
    out = {f"mean@{k}": mean(mean(s) for s in scores)}
    if k > 1:
        out[f"std@{k}"] = mean(pstdev(s) for s in scores)
        correct = [sum(x >= threshold for x in s) for s in scores]
        for j in sorted({1, k}):
            out[f"pass@{j}"] = mean(pass_at_k(k, c, j) for c in correct)
        out[f"maj@{k}"] = mean(majority_score(a, s) for a, s in zip(answers, scores))
    return out


def extract_answer(completion: str) -> str:
    """What majority voting compares: the last \\boxed{} content, else a GSM8K `#### x`, else the text."""
    from grpoflow.rewards.answers import extract_gsm8k_answer
    from grpoflow.rewards.math_normalize import last_boxed

    return last_boxed(completion) or extract_gsm8k_answer(completion, "strict") or completion.strip()
