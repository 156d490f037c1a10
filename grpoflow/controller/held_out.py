"""Evaluation on the held-out prompts (validation): k samples per prompt, metrics per data source, sample
completions to read.

The run's validation (Controller.evaluate_held_out) and `grpoflow eval` sample with the same `val_params` and
`val_seed`, so that eval of a run's last checkpoint gives the run's last validation figures (exactly, greedy or
sampled).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Callable

from grpoflow.config import Config
from grpoflow.controller.rollouts import Rollouts, step_seed
from grpoflow.controller.val_metrics import extract_answer, group_metrics
from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.engines.protocol import SamplingParams
from grpoflow.rewards.scoring import Scores


def val_params(cfg: Config) -> SamplingParams:
    """rollout.val_n samples per prompt at rollout.val_temperature (0: greedy), top-p 1."""
    r = cfg.rollout
    return SamplingParams(n=r.val_n, max_new_tokens=r.max_new_tokens, temperature=r.val_temperature, top_p=1.0)


def val_seed(seed: int, step: int) -> int:
    """The seed of the validation after step `step` (0: before training) of a run with trainer.seed `seed`: apart
    from the training rollouts' seeds."""
    return 10**9 + step_seed(seed, step)


def evaluate_held_out(rollouts: Rollouts, items: list[PromptItem], reward: Callable[[Batch], Scores], *,
                      params: SamplingParams, batch_size: int,
                      samples_path: Path | None = None, step: int = 0, num_samples: int = 0, seed: int | None = None
             ) -> dict[str, float]:
    """`val/<data_source>/<metric>` and `val/<metric>` over all prompts, for k = `params.n` samples
    each: mean@k, and for k > 1 std@k, pass@1, pass@k, maj@k (see val_metrics).

    `rollouts` generates (the rollout worker group), `reward(batch)` scores a batch. The first `num_samples`
    completions are appended to `samples_path` (JSON lines: step, data_source, prompt, completion, score). `seed` (+
    the chunk's offset) seeds each generate call, so sampled validation does not depend on where the engine runs.
    Multi-turn and agent runs add `turns` and `tool_calls`: their means per trajectory.
    """
    k = params.n
    scores: dict[str, list[list[float]]] = defaultdict(list)
    answers: dict[str, list[list[str]]] = defaultdict(list)
    conversation: dict[str, list[tuple[int, int]]] = defaultdict(list)  # (turns, tool calls) per trajectory
    shown: list[dict] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        batch = rollouts.generate(chunk, params, seed=None if seed is None else seed + start)
        scored = reward(batch)
        for i, item in enumerate(chunk):
            rows = range(i * k, (i + 1) * k)
            scores[item.data_source].append([scored.scores[j] for j in rows])
            answers[item.data_source].append([extract_answer(batch.completions[j]) for j in rows])
            if batch.infos and batch.conversations:  # multi-turn and agent samples
                conversation[item.data_source] += [(batch.infos[j].turns, batch.infos[j].tool_calls) for j in rows]
        shown += [{"step": step, "data_source": chunk[j // k].data_source, "prompt": batch.prompts[j],
                   "completion": batch.completions[j], "score": scored.scores[j],
                   **({"conversation": batch.conversations[j]} if batch.conversations else {})}
                  for j in range(min(len(batch), num_samples - len(shown)))]
    if samples_path is not None and shown:
        with open(samples_path, "a") as f:
            f.writelines(json.dumps(s) + "\n" for s in shown)
    metrics = {}
    for source in scores:
        for name, value in group_metrics(scores[source], answers[source]).items():
            metrics[f"val/{source}/{name}"] = value
        metrics.update({f"val/{source}/{name}": value for name, value in conversation_means(conversation[source])})
    if scores:
        every = [s for v in scores.values() for s in v]
        every_answers = [a for v in answers.values() for a in v]
        metrics.update({f"val/{name}": value for name, value in group_metrics(every, every_answers).items()})
        metrics.update({f"val/{name}": value
                        for name, value in conversation_means([c for v in conversation.values() for c in v])})
    return metrics


def conversation_means(trajectories: list[tuple[int, int]]) -> list[tuple[str, float]]:
    """[("turns", mean), ("tool_calls", mean)] over (turns, tool calls) per trajectory; [] for none."""
    if not trajectories:
        return []
    n = len(trajectories)
    return [("turns", sum(t for t, _ in trajectories) / n), ("tool_calls", sum(c for _, c in trajectories) / n)]
