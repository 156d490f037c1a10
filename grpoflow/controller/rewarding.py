"""Reward assembly: everything that turns a sampled batch into one score per sample.

    score = rule rewards (reward.function[s], scored by the RewardScorer; the LLM judge's score, judged for the
            whole batch first by `Judging`, is the rule reward named `judge`)
          + reward.model.weight x the reward model's score (when reward.model.path is set)
          + DAPO's overlong penalty (when reward.overlong_buffer_len > 0)

and ReMax's greedy baseline: the score of one greedy response per prompt. `reward_roles` and `build_rewards` make
the roles and the assembly from the config, once for the run (Controller) and `grpoflow eval` alike, so that eval
scores a run's held-out prompts exactly as its validation did.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from grpoflow.algorithms import overlong_penalty
from grpoflow.config import Config, RewardConfig
from grpoflow.controller.judging import Judging, resolve_judge_path
from grpoflow.plan.checks import judged
from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.distributed.worker_group import WorkerGroup
from grpoflow.rewards.scoring import RewardScorer, Scores
from grpoflow.rewards.shapes import SampleContext, TrainerState
from grpoflow.engines.protocol import SamplingParams
from grpoflow.workers.judge import JudgeWorker
from grpoflow.workers.reward_model import RewardModelWorker

if TYPE_CHECKING:
    from grpoflow.controller.rollouts import Rollouts


def reward_roles(cfg: Config, run_dir: Path, pool: Any = None
                 ) -> tuple[WorkerGroup[RewardModelWorker] | None, WorkerGroup[JudgeWorker] | None]:
    """The reward model's and the local judge's worker groups (None where reward.model.path / reward.judge.path is
    not set), placed in `pool` (None: this process); a .gguf judge is dequantized into `run_dir`."""
    rm, j = cfg.reward.model, cfg.reward.judge
    reward_model = WorkerGroup("reward_model", partial(
        RewardModelWorker, model_path=rm.path, max_length=rm.max_length, batch_size=rm.batch_size),
        pool=pool) if rm.path else None
    judge = WorkerGroup("judge", partial(
        JudgeWorker, model_path=resolve_judge_path(j.path, run_dir), max_new_tokens=j.max_tokens,
        engine=cfg.rollout.engine), pool=pool) if j.path else None
    return reward_model, judge


def build_rewards(cfg: Config, scorer: RewardScorer | None, reward_model: WorkerGroup[RewardModelWorker] | None,
                  judge: WorkerGroup[JudgeWorker] | None) -> RewardAssembly:
    """The run's reward assembly: rule rewards, the judge (over `judge`, or reward.judge.url), the reward model."""
    return RewardAssembly(scorer, reward_model, cfg.reward, max_new_tokens=cfg.rollout.max_new_tokens,
                          judging=Judging(cfg.reward, judge) if judged(cfg.reward) else None,
                          steps=cfg.trainer.total_steps)


class RewardAssembly:
    def __init__(self, scorer: RewardScorer | None, reward_model: WorkerGroup[RewardModelWorker] | None,
                 cfg: RewardConfig, *, max_new_tokens: int, judging: Judging | None = None, steps: int = 0) -> None:
        self.scorer, self.reward_model, self.cfg, self.max_new_tokens = scorer, reward_model, cfg, max_new_tokens
        self.judging, self.steps = judging, steps

    def score(self, batch: Batch, step: int = 0) -> Scores:
        """Rule rewards and/or the reward model's score (times reward.model.weight), per sample; the reward
        model's own score is kept in `extras["model"]` (logged as reward/model/mean); `parts` holds each sample's
        parts (a dict return's entries, "env", "model"). `step` is what TRL-shaped functions see as
        trainer_state.global_step."""
        rows, judge_counts = self.judging.rows(batch.prompts, batch.completions, batch.rows) \
            if self.judging is not None else (batch.rows, {})
        scored = self.scorer.score(batch.prompts, batch.completions, rows, sample_contexts(batch, step, self.steps)) \
            if self.scorer is not None else Scores([0.0] * len(batch))
        scored.counts.update(judge_counts)
        if batch.env_rewards is not None:  # multi-turn: the environment's reward adds to the rule rewards
            add_env_rewards(scored, batch.env_rewards.tolist(), self.cfg.error_score)
        if self.reward_model is not None:
            texts = [p + c for p, c in zip(batch.prompts, batch.completions)]
            rm = self.reward_model.call(RewardModelWorker.compute_rm_score, texts).tolist()
            scored.parts = [{**p, "model": m} for p, m in zip(scored.sample_parts(), rm)]
            scored.scores = [s + self.cfg.model.weight * m for s, m in zip(scored.scores, rm)]
            scored.extras["model"] = rm
        return scored

    def shaped(self, batch: Batch, step: int = 0) -> tuple[Tensor, Scores]:
        """[B] the training score of each sample (`score` plus DAPO's overlong penalty), and the raw Scores
        (whose per-sample `parts` then hold the penalty as "overlong")."""
        scored = self.score(batch, step)
        raw = torch.tensor(scored.scores, dtype=torch.float32)
        shaped = shape_scores(raw, batch.response_lengths, max_length=self.max_new_tokens,
                              buffer=self.cfg.overlong_buffer_len, penalty_factor=self.cfg.overlong_penalty_factor)
        if self.cfg.overlong_buffer_len > 0:
            scored.parts = [{**p, "overlong": d} for p, d in zip(scored.sample_parts(), (shaped - raw).tolist())]
        return shaped, scored

    def greedy_baselines(self, rollouts: "Rollouts", items: list[PromptItem], n: int) -> Tensor:
        """[len(items) * n] the training score of one greedy response per prompt, repeated over its n samples
        (ReMax's baseline)."""
        greedy = SamplingParams(n=1, max_new_tokens=self.max_new_tokens, temperature=0.0)
        scores, _ = self.shaped(rollouts.generate(items, greedy))
        return scores.repeat_interleave(n)


def sample_contexts(batch: Batch, step: int, steps: int) -> list[SampleContext]:
    """Each sample's context for reward functions that take it (TRL's prompts as chat messages, completion_ids,
    trainer_state): the row's own prompt, the response's ids, the step."""
    state = TrainerState(global_step=step, max_steps=steps)
    ids = [r[m.bool()].tolist() for r, m in zip(batch.response_ids, batch.response_mask)]
    return [SampleContext(row_prompt=row.get("prompt"), completion_ids=i, trainer_state=state)
            for row, i in zip(batch.rows, ids)]


def add_env_rewards(scored: Scores, env: list[float], error_score: float) -> None:
    """Add each sample's environment reward to its score; a NaN or infinite one (an environment that failed:
    trajectories/env.py's GuardedEnvironment, which logged why) makes the sample's score `error_score`, counted in
    reward/errors and reward/env/errors."""
    bad = [not math.isfinite(e) for e in env]
    scored.parts = [{**p, "env": e} for p, e in zip(scored.sample_parts(), env)]
    scored.scores = [error_score if b else s + e for s, e, b in zip(scored.scores, env, bad)]
    scored.extras["env"] = [e for e, b in zip(env, bad) if not b]
    scored.errors += sum(bad)
    if any(bad) and scored.first_error is None:
        scored.first_error = ("the environment's reward was not finite: one of its calls failed (a warning from "
                              "grpoflow.env above names the environment and the error)")
    scored.counts["reward/env/errors"] = scored.counts.get("reward/env/errors", 0.0) + sum(bad)


def shape_scores(scores: Tensor, response_lengths: Tensor, *, max_length: int, buffer: int,
                 penalty_factor: float) -> Tensor:
    """[B] scores plus DAPO's overlong penalty (`algorithms.overlong_penalty`) when `buffer` > 0."""
    if buffer <= 0:
        return scores
    return scores + overlong_penalty(response_lengths, max_length=max_length, buffer=buffer,
                                     penalty_factor=penalty_factor)
