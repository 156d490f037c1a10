"""The single controller: the RL loop as plain sequential Python.

`Controller.step()` is the whole algorithm: generate -> reward -> old/ref log-probs ->
advantages -> update -> weight sync -> metrics. Heavy work happens in worker groups; the
controller only moves typed batches between them and never branches on an algorithm name.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from grpoflow.algorithms import call_with_available, get_advantage, required_inputs
from grpoflow.config import Config
from grpoflow.controller.metrics import MetricsLogger, StageTimer
from grpoflow.controller.validation import validate
from grpoflow.data.batch import Batch
from grpoflow.data.sampler import EpochSampler
from grpoflow.distributed.worker_group import WorkerError, WorkerGroup
from grpoflow.engines.rollout import SamplingParams
from grpoflow.engines.train import NonFiniteLossError
from grpoflow.rewards.scoring import score_completions
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.reference import ReferenceWorker
from grpoflow.workers.rollout import RolloutWorker


class TrainingError(RuntimeError):
    """Training stopped; the message names the cause, the fix, and what was kept."""


ADVANTAGE_INPUTS = ("scores", "response_mask", "group_ids", "norm_adv_by_std", "epsilon", "completions", "rows")


class Controller:
    def __init__(self, cfg: Config, *, model_path: str, train_items: list, val_items: list, reward_fn,
                 run_dir: str | Path) -> None:
        self.cfg, self.reward_fn, self.run_dir = cfg, reward_fn, Path(run_dir)
        self.train_items, self.val_items = train_items, val_items
        self.advantage_fn = get_advantage(cfg.algorithm.adv_estimator)
        missing = required_inputs(self.advantage_fn) - set(ADVANTAGE_INPUTS)
        if missing:
            raise TrainingError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} needs {sorted(missing)}, "
                                f"which this run does not provide (available: {list(ADVANTAGE_INPUTS)}).")
        a = cfg.actor
        self.actor = WorkerGroup("actor", partial(ActorWorker, model_path=model_path, cfg=a, seed=cfg.trainer.seed,
                                                  temperature=cfg.rollout.temperature,
                                                  horizon=cfg.rollout.max_new_tokens,
                                                  total_optimizer_steps=cfg.trainer.total_steps * a.minibatches
                                                  * a.epochs), backend=cfg.backend)
        # The reference policy exists only for the KL term: with kl_coef=0 it is never built.
        self.ref = WorkerGroup("reference", partial(
            ReferenceWorker, model_path=model_path, temperature=cfg.rollout.temperature,
            max_tokens=a.max_tokens_per_microbatch, chunk_size=a.logprob_chunk_size),
            backend=cfg.backend) if a.kl_coef > 0 else None
        self.rollout = WorkerGroup("rollout", partial(RolloutWorker, model_path=model_path, engine=cfg.rollout.engine),
                                   backend=cfg.backend)
        # With one optimizer step per RL step the importance ratio is exactly 1, so the
        # old-log-prob pass would recompute what the update computes anyway: skip it.
        self.need_old_log_probs = a.minibatches * a.epochs > 1
        self.sampler = EpochSampler(len(train_items), seed=cfg.trainer.seed)
        self.sampling = SamplingParams(n=cfg.rollout.n, max_new_tokens=cfg.rollout.max_new_tokens,
                                       temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
        self.version = 0
        self.logger = MetricsLogger(self.run_dir, every=cfg.trainer.log_every)

    def step(self, step: int) -> dict[str, float]:
        """One RL step; returns its metrics."""
        cfg, timer = self.cfg, StageTimer()
        items = [self.train_items[i] for i in self.sampler.next_indices(cfg.data.prompts_per_step)]
        torch.manual_seed(cfg.trainer.seed * 1_000_003 + step)  # rollouts depend on (seed, step) only
        with timer("step"):
            with timer("gen"):
                batch = self.rollout.generate(items, self.sampling)
                batch = batch.replace(group_ids=torch.arange(len(items)).repeat_interleave(cfg.rollout.n))
            with timer("reward"):
                scored = score_completions(self.reward_fn, batch.prompts, batch.completions, batch.rows,
                                           error_score=cfg.reward.error_score)
                batch = batch.replace(scores=torch.tensor(scored.scores, dtype=torch.float32))
            if self.need_old_log_probs:
                with timer("old_log_prob"):
                    batch = self.actor.compute_log_prob(batch)
            if self.ref is not None:
                with timer("ref"):
                    batch = self.ref.compute_ref_log_prob(batch)
            with timer("adv"):
                batch = batch.replace(advantages=self.advantages(batch))
            with timer("update_actor"):
                actor_metrics = self.actor.update_policy(batch)
            with timer("sync"):
                self.sync_weights()
        return {**scored.metrics(), **actor_metrics, **batch_metrics(batch), **timer.metrics(),
                "perf/throughput": float(batch.attention_mask.sum()) / timer.seconds["step"]}

    def advantages(self, batch: Batch) -> torch.Tensor:
        a = self.cfg.algorithm
        return call_with_available(
            self.advantage_fn, scores=batch.scores, response_mask=batch.response_mask.float(),
            group_ids=batch.group_ids, norm_adv_by_std=a.norm_adv_by_std, epsilon=a.epsilon,
            completions=batch.completions, rows=batch.rows)

    def sync_weights(self) -> None:
        """Push the actor's weights to the rollout engine, one tensor at a time, versioned."""
        self.version += 1
        self.rollout.update_weights(self.actor.named_weights(), self.version)

    def validate(self) -> dict[str, float]:
        if not self.val_items:
            return {}
        params = SamplingParams(n=1, max_new_tokens=self.cfg.rollout.max_new_tokens,
                                temperature=self.cfg.rollout.val_temperature, top_p=1.0)
        return validate(self.rollout, self.val_items, self.reward_fn, params=params,
                        batch_size=self.cfg.rollout.val_batch_size, error_score=self.cfg.reward.error_score)

    def fit(self) -> dict[str, dict[str, float]]:
        """Validate, train `trainer.total_steps` steps (validating every `val_every`), validate again."""
        t = self.cfg.trainer
        do_val = t.val_every > 0 and bool(self.val_items)
        first = self.validate() if do_val else {}
        if first:
            self.logger.log(0, first, force_print=True)
        last = dict(first)
        start = time.perf_counter()
        bar = tqdm(range(1, t.total_steps + 1), desc="grpo", unit="step", dynamic_ncols=True)
        for step in bar:
            try:
                metrics = self.step(step)
            except WorkerError as e:
                if isinstance(e.original, NonFiniteLossError):
                    raise TrainingError(
                        f"Stopped at step {step}: {e.original}. Lower actor.lr, check that rewards are finite and "
                        f"of moderate scale, or raise actor.grad_clip's strictness; metrics of steps before "
                        f"{step} are kept in {self.logger.path}.") from None
                raise
            if do_val and (step % t.val_every == 0 or step == t.total_steps):
                last = self.validate()
                metrics.update(last)
            self.logger.log(step, metrics, force_print=step == t.total_steps)
            bar.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}")
        return {"before": first, "after": last, "seconds": time.perf_counter() - start}


def batch_metrics(batch: Batch) -> dict[str, float]:
    lengths = batch.response_lengths.float()
    width = batch.response_ids.shape[1]
    return {"response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/clip_ratio": (lengths >= width).float().mean().item() if width else 0.0,
            "critic/score/max": batch.scores.max().item(), "critic/score/min": batch.scores.min().item(),
            "critic/advantages/mean": (batch.advantages.sum() / batch.response_mask.sum().clamp(min=1)).item()}
