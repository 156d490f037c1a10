"""The controller's side of prompt sampling: which sampler a run draws from, and the feedback after scoring.

`build_sampler` gives the epoch sampler, or with `data.curriculum.enable` the curriculum
(`data/curriculum.py`); `group_feedback` tells the sampler each drawn prompt's pass rate (from its own
samples, found by group id: n of them, or in agent runs however many its episodes gave) and returns the
step's share of groups with zero advantage (all of a group's rewards equal: no signal), logged for every
run so that curricula, dynamic sampling and plain epochs compare on one number.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoflow.algorithms import groups_with_signal
from grpoflow.config import Config
from grpoflow.data.curriculum import CurriculumSampler
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import EpochSampler, PromptSampler


def build_sampler(cfg: Config, num_items: int) -> PromptSampler:
    c = cfg.data.curriculum
    if not c.enable:
        return EpochSampler(num_items, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
    return CurriculumSampler(num_items, cfg.trainer.seed, shares=c.shares, window=c.window, easy_above=c.easy_above,
                             hard_below=c.hard_below, retire_after=c.retire_after)


def group_feedback(sampler: PromptSampler, items: list[PromptItem], scores: Tensor, raw_scores: Tensor,
                   group_ids: Tensor, solved_score: float, final: list[bool] | None = None) -> dict[str, float]:
    """Feed each item's pass rate to the sampler; the share of groups whose training `scores` are all equal
    (`groups/zero_advantage_share`) and the sampler's metrics.

    Sample b belongs to item `group_ids[b]` (its position in `items`), whatever the group sizes: n samples each,
    or an agent run's episodes, of which one may give several samples. An item's pass rate is the share of its
    episodes whose raw score is >= `solved_score`, counted on the samples marked `final` (one per episode; all
    when not given); an item with no such sample is not fed back.
    scores, raw_scores, group_ids: [B]; final: [B] or None."""
    if not items or len(scores) == 0:
        return {}
    ids = group_ids.long()
    keep = torch.ones(len(ids), dtype=torch.bool) if final is None else torch.tensor(final, dtype=torch.bool)
    solved = (raw_scores >= solved_score).float() * keep
    episodes = torch.zeros(len(items)).index_add_(0, ids, keep.float())
    passed = torch.zeros(len(items)).index_add_(0, ids, solved)
    seen = [k for k in range(len(items)) if episodes[k] > 0]
    sampler.observe([items[k].index for k in seen], [(passed[k] / episodes[k]).item() for k in seen])
    signal = groups_with_signal(scores, ids)
    groups = ids.unique()
    with_signal = torch.zeros(len(items), dtype=torch.bool).index_fill_(0, ids[signal], True)[groups]
    return {"groups/zero_advantage_share": 1.0 - with_signal.float().mean().item(), **sampler.metrics()}
