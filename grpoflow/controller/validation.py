"""Validation: generate on held-out prompts and report mean@1 per data source."""

from __future__ import annotations

from collections import defaultdict

from grpoflow.engines.rollout import SamplingParams


def validate(rollout, items: list, scorer, *, params: SamplingParams, batch_size: int) -> dict[str, float]:
    """`val/<data_source>/mean@1` (and `val/mean@1` over all prompts) of one sample per prompt.

    `rollout` is the rollout worker group; `params.n` must be 1 (mean@k for k > 1 comes later).
    """
    per_source: dict[str, list[float]] = defaultdict(list)
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        batch = rollout.generate(chunk, params)
        scored = scorer.score(batch.prompts, batch.completions, batch.rows)
        for item, score in zip(chunk, scored.scores):
            per_source[item.data_source].append(score)
    metrics = {f"val/{src}/mean@1": sum(v) / len(v) for src, v in per_source.items()}
    every = [s for v in per_source.values() for s in v]
    if every:
        metrics["val/mean@1"] = sum(every) / len(every)
    return metrics
