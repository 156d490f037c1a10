"""The controller's side of prompt sampling: which sampler a run draws from, and the feedback after scoring.

`build_sampler` gives the epoch sampler, or with `data.curriculum.enable` the curriculum
(`data/curriculum.py`); `group_feedback` tells the sampler each drawn prompt's pass rate and returns
the step's share of groups with zero advantage (all n rewards equal: no signal), logged for every run
so that curricula, dynamic sampling and plain epochs compare on one number.
"""

from __future__ import annotations

from torch import Tensor

from grpoflow.algorithms import groups_with_signal
from grpoflow.config import Config
from grpoflow.data.curriculum import CurriculumSampler
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import EpochSampler, PromptSampler
from grpoflow.controller.rollouts import group_ids


def build_sampler(cfg: Config, num_items: int) -> PromptSampler:
    c = cfg.data.curriculum
    if not c.enable:
        return EpochSampler(num_items, seed=cfg.trainer.seed)
    return CurriculumSampler(num_items, cfg.trainer.seed, shares=c.shares, window=c.window, easy_above=c.easy_above,
                             hard_below=c.hard_below, retire_after=c.retire_after)


def group_feedback(sampler: PromptSampler, items: list[PromptItem], scores: Tensor, raw_scores: Tensor, n: int,
                   solved_score: float) -> dict[str, float]:
    """Feed each item's pass rate (share of its n raw scores >= `solved_score`) to the sampler; the share of groups
    whose training `scores` [len(items) * n] are all equal (`groups/zero_advantage_share`) and the sampler's metrics."""
    if len(scores) != len(items) * n or not items:
        return {}
    rates = (raw_scores.view(len(items), n) >= solved_score).float().mean(-1).tolist()
    sampler.observe([it.index for it in items], rates)
    signal = groups_with_signal(scores, group_ids(len(items), n)).view(len(items), n)[:, 0]
    return {"groups/zero_advantage_share": 1.0 - signal.float().mean().item(), **sampler.metrics()}
