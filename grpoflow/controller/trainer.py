"""The single controller: the RL loop as plain sequential Python.

`Controller.step()` is the whole algorithm: generate -> reward -> old/ref log-probs ->
values -> advantages -> critic update -> actor update -> weight sync -> metrics. Heavy work
happens in worker groups; the controller only moves typed batches between them and never
branches on an algorithm's name: what a step computes follows from what the configured
estimator's signature asks for (values -> a critic, baselines -> a greedy rollout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from functools import partial
from typing import Any, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from grpoflow.algorithms import (ADVANTAGE_ESTIMATORS, KL_CONTROLLERS, POLICY_LOSSES, call_with_available,
                                 groups_with_signal, kl_in_reward, overlong_penalty, required_inputs)
from grpoflow.config import Config
from grpoflow.controller.checkpoint import CheckpointManager, load_state, rng_state, save_state, set_rng_state
from grpoflow.controller.metrics import MetricsLogger, StageTimer
from grpoflow.controller.trackers import build_trackers
from grpoflow.controller.validation import validate
from grpoflow.data.batch import Batch
from grpoflow.data.sampler import EpochSampler
from grpoflow.controller.placement import build_placement
from grpoflow.distributed.worker_group import Broadcast, WorkerError, WorkerGroup
from grpoflow.rollout.protocol import SamplingParams
from grpoflow.training.engine import NonFiniteLossError
from grpoflow.rewards.scoring import RewardScorer, Scores
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.critic import CriticWorker
from grpoflow.workers.reference import ReferenceWorker
from grpoflow.workers.reward_model import RewardModelWorker
from grpoflow.workers.rollout import RolloutWorker


class TrainingError(RuntimeError):
    """Training stopped; the message names the cause, the fix, and what was kept."""


# Inputs a step can hand an advantage estimator; `values` and `baselines` cost extra work, done
# only when the estimator's signature asks for them.
ADVANTAGE_INPUTS = ("scores", "token_level_rewards", "response_mask", "group_ids", "values", "baselines",
                    "norm_adv_by_std", "epsilon", "gamma", "lam", "completions", "rows")


def check_algorithm(cfg: Config) -> None:
    """Reject combinations that make no sense, before any model is loaded."""
    estimator = ADVANTAGE_ESTIMATORS.resolve(cfg.algorithm.adv_estimator)
    missing = required_inputs(estimator) - set(ADVANTAGE_INPUTS)
    if missing:
        raise TrainingError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} needs {sorted(missing)}, "
                            f"which no step provides (available: {list(ADVANTAGE_INPUTS)}).")
    POLICY_LOSSES.resolve(cfg.actor.policy_loss)
    modes = POLICY_LOSSES.meta(cfg.actor.policy_loss).get("agg_modes")
    if modes and cfg.actor.loss_agg_mode not in modes:
        raise TrainingError(f"actor.policy_loss={cfg.actor.policy_loss} is defined with loss_agg_mode in {list(modes)}, "
                            f"not {cfg.actor.loss_agg_mode!r}; set actor.loss_agg_mode={modes[0]}.")
    if cfg.actor.rollout_is and cfg.rollout.top_p < 1:
        raise TrainingError("actor.rollout_is needs the engine's full-distribution log-probs; with rollout.top_p < 1 "
                            "they are not the sampling probabilities. Set rollout.top_p=1 or actor.rollout_is=null.")
    if "baselines" in required_inputs(estimator) and cfg.algorithm.filter_groups.enable:
        raise TrainingError("algorithm.filter_groups needs groups of samples with different rewards; an estimator "
                            "with a greedy baseline (remax) is meant for rollout.n=1. Disable one of them.")


class Controller:
    def __init__(self, cfg: Config, *, model_path: str, train_items: list, val_items: list,
                 scorer: RewardScorer | None, run_dir: str | Path) -> None:
        check_algorithm(cfg)
        self.cfg, self.scorer, self.run_dir = cfg, scorer, Path(run_dir)
        self.train_items, self.val_items = train_items, val_items
        self.advantage_fn = ADVANTAGE_ESTIMATORS.resolve(cfg.algorithm.adv_estimator)
        needs = required_inputs(self.advantage_fn)
        a, alg, seed = cfg.actor, cfg.algorithm, cfg.trainer.seed
        # Where the roles run (this process, or Ray actors colocated or split); the rest of the
        # controller cannot tell the difference.
        self.placement = build_placement(cfg)
        try:
            self._build_groups(cfg if not stale_without_is(cfg) else with_rollout_is(cfg), model_path, needs)
        except BaseException:
            self.placement.close()
            raise
        self.needs_baselines = "baselines" in needs
        r = cfg.rollout
        self.sleep_engines = self.placement.colocated and r.free_cache_engine and r.engine in ("vllm", "sglang")
        # With one optimizer step per RL step the importance ratio is exactly 1, so the
        # old-log-prob pass would recompute what the update computes anyway: skip it unless
        # the KL-in-reward needs the log-probs before the update.
        # Stale samples (async mode) need the proximal policy's log-probs and, through actor.rollout_is,
        # the importance weight pi_old / pi_rollout.
        stale = cfg.trainer.mode == "async" and cfg.rollout.max_staleness > 0
        self.need_old_log_probs = a.minibatches * a.epochs > 1 or alg.use_kl_in_reward or stale
        kl = alg.kl_ctrl
        self.kl_ctrl = call_with_available(KL_CONTROLLERS.get(kl.type), kl_coef=kl.kl_coef, init_kl_coef=kl.kl_coef,
                                           target_kl=kl.target_kl, horizon=kl.horizon)
        self.sampler = EpochSampler(len(train_items), seed=seed)
        self.sampling = SamplingParams(n=cfg.rollout.n, max_new_tokens=cfg.rollout.max_new_tokens,
                                       temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
        self.version = 0
        # Generation calls in flight (step, prompts, call) and, in async mode, weight updates not yet
        # confirmed by the engines.
        self.is_async = cfg.trainer.mode == "async"
        self.in_flight: deque = deque()
        self.next_rollout_step = 1
        self.pending_syncs: list = []
        self.logger = MetricsLogger(self.run_dir, every=cfg.trainer.log_every)
        self.checkpoints = CheckpointManager(self.run_dir, keep_last=cfg.trainer.keep_last)
        self.trackers: list = []  # built in fit(), once the resume step is known

    def _build_groups(self, cfg: Config, model_path: str, needs: set[str]) -> None:
        a, alg, seed = cfg.actor, cfg.algorithm, cfg.trainer.seed
        group = partial(WorkerGroup, pool=self.placement.train)
        self.actor = group("actor", partial(ActorWorker, model_path=model_path, cfg=a, seed=seed,
                                            temperature=cfg.rollout.temperature, horizon=cfg.rollout.max_new_tokens,
                                            total_optimizer_steps=cfg.trainer.total_steps * a.minibatches * a.epochs,
                                            model_cfg=cfg.model))
        # The reference policy exists only for a KL term; with LoRA the actor serves it (adapters off).
        self.ref = None
        if a.kl_coef > 0 or alg.use_kl_in_reward:
            self.ref = self.actor if cfg.model.lora.rank > 0 else group("reference", partial(
                ReferenceWorker, model_path=model_path, temperature=cfg.rollout.temperature,
                max_tokens=a.max_tokens_per_microbatch, chunk_size=a.logprob_chunk_size,
                compute_dtype=cfg.model.compute_dtype))
        self.critic = group("critic", partial(CriticWorker, model_path=model_path, cfg=cfg.critic, schedule=a,
                                              seed=seed, compute_dtype=cfg.model.compute_dtype)) \
            if "values" in needs else None
        rm = cfg.reward.model
        self.reward_model = group("reward_model", partial(RewardModelWorker, model_path=rm.path,
                                                          max_length=rm.max_length, batch_size=rm.batch_size)) \
            if rm.path else None
        # bf16 compute: the rollout copy is stored in bf16 (it never trains, so needs no fp32 master).
        bf16 = "bfloat16" in (cfg.model.dtype, cfg.model.compute_dtype)
        self.rollout = WorkerGroup("rollout", partial(RolloutWorker, model_path=model_path, engine=cfg.rollout.engine,
                                                      cfg=cfg.rollout, seed=seed, dtype="bfloat16" if bf16 else None),
                                   pool=self.placement.rollout,
                                   timeouts={"update_weights": cfg.rollout.sync_timeout_s})

    def step(self, step: int) -> dict[str, float]:
        """One RL step; returns its metrics."""
        cfg, timer, metrics = self.cfg, StageTimer(), {}
        torch.manual_seed(self.step_seed(step))
        with timer("step"):
            with self.engines_awake():
                batch, items = self.generate_and_score(step, timer, metrics)
            if self.is_async:
                metrics.update(staleness_metrics(batch, self.version))
            if self.needs_baselines:
                with timer("gen_baseline"), self.engines_awake():
                    batch = batch.replace(baselines=self.greedy_baselines(items))
            if self.need_old_log_probs:
                with timer("old_log_prob"):
                    batch = self.actor.compute_log_prob(batch)
            if self.ref is not None:
                with timer("ref"):
                    batch = self.ref.compute_ref_log_prob(batch)
            if self.critic is not None:
                with timer("values"):
                    batch = self.critic.compute_values(batch)
            with timer("adv"):
                batch = self.compute_advantages(batch, metrics)
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self.critic.update_critic(batch))
            if step > cfg.critic.warmup_steps or self.critic is None:
                with timer("update_actor"):
                    metrics.update(self.actor.update_policy(batch))
                with timer("sync"):
                    self.sync_weights()
        # The dispatch layer's own cost: time in worker calls beyond the ranks' time on them.
        dispatch = sum(g.take_dispatch_seconds() for g in self.groups())
        metrics.update({"timing_s/dispatch": dispatch, "perf/dispatch_share": dispatch / timer.seconds["step"]})
        if self.is_async:  # the rollout engines were idle for the part of the step they did not generate
            metrics["timing_s/rollout_wait"] = max(0.0, timer.seconds["step"] - timer.seconds["gen_busy"])
        return {**metrics, **batch_metrics(batch), **timer.metrics(),
                "perf/throughput": float(batch.attention_mask.sum()) / timer.seconds["step"]}

    @contextlib.contextmanager
    def engines_awake(self) -> Iterator[None]:
        """Colocated vllm/sglang engines hold their KV cache only while generating (rollout.free_cache_engine):
        the actor trains in the memory they free."""
        if self.sleep_engines:
            self.rollout.wake()
        try:
            yield
        finally:
            if self.sleep_engines:
                self.rollout.sleep()

    def groups(self) -> list[WorkerGroup]:
        every = [self.actor, self.ref, self.critic, self.reward_model, self.rollout]
        return list({id(g): g for g in every if g is not None}.values())

    def step_seed(self, step: int, draw: int = 0) -> int:
        """Rollouts depend on (trainer.seed, step, draw) only, wherever and whenever they run."""
        return self.cfg.trainer.seed * 1_000_003 + step + 7_919 * draw

    def rollout_for(self, step: int) -> tuple[list, Any]:
        """The prompts of `step` and its generation call. Sync mode submits it now; async mode keeps up
        to `rollout.max_staleness` later steps' generations in flight, so they run while this step
        trains (each queued behind the weight update submitted before it)."""
        ahead = self.cfg.rollout.max_staleness if self.is_async else 0
        last = min(step + ahead, self.cfg.trainer.total_steps)
        while self.next_rollout_step <= max(last, step):
            sampler_state = self.sampler.state_dict()
            items = [self.train_items[i] for i in self.sampler.next_indices(self.cfg.data.prompts_per_step)]
            call = self.rollout.timed_submit("generate", items, self.sampling, seed=self.step_seed(self.next_rollout_step))
            self.in_flight.append((self.next_rollout_step, items, call, sampler_state))
            self.next_rollout_step += 1
        queued_step, items, call, _ = self.in_flight.popleft()
        assert queued_step == step, (queued_step, step)
        return items, call

    def generate_and_score(self, step: int, timer: StageTimer, metrics: dict) -> tuple[Batch, list]:
        """Sample `rollout.n` responses for `data.prompts_per_step` prompts and score them.

        With `algorithm.filter_groups.enable` (DAPO dynamic sampling), groups whose rewards are all
        equal carry no signal: they are set aside and more prompts are drawn, up to `max_draws`
        rounds; if still short, set-aside groups fill the step (their advantage is zero).
        """
        cfg, n, want = self.cfg, self.cfg.rollout.n, self.cfg.data.prompts_per_step
        draws = cfg.algorithm.filter_groups.max_draws if cfg.algorithm.filter_groups.enable else 1
        kept: list[tuple[Batch, object]] = []
        spare: list[tuple[Batch, object]] = []
        scores = None
        for draw in range(draws):
            with timer("trainer_wait" if self.is_async else "gen"):
                if draw == 0:
                    items, call = self.rollout_for(step)
                else:
                    items = [self.train_items[i] for i in self.sampler.next_indices(want)]
                    call = self.rollout.timed_submit("generate", items, self.sampling,
                                                     seed=self.step_seed(step, draw))
                batch, busy = call.result()
            timer.seconds["gen_busy"] = timer.seconds.get("gen_busy", 0.0) + busy  # the engines' own time
            with timer("reward"):
                batch, scored = self.score(batch)
            scores = scored if scores is None else scores.merge(scored)
            if draws == 1:
                metrics.update({**scores.metrics(), **length_metrics(batch)})
                return batch.replace(group_ids=torch.arange(want).repeat_interleave(n)), items
            signal = groups_with_signal(batch.scores, torch.arange(want).repeat_interleave(n))
            for g, item in enumerate(items):
                (kept if signal[g * n] else spare).append((batch.select(list(range(g * n, (g + 1) * n))), item))
            if len(kept) >= want:
                break
        metrics.update(scores.metrics())
        metrics.update({"filter_groups/draws": draw + 1, "filter_groups/signal_groups": float(len(kept))})
        chosen = (kept + spare)[:want]
        batch = Batch.concat([b for b, _ in chosen])
        metrics.update(length_metrics(batch))
        return batch.replace(group_ids=torch.arange(want).repeat_interleave(n)), [it for _, it in chosen]

    def reward(self, batch: Batch) -> Scores:
        """Rule rewards and/or the reward model's score (times reward.model.weight), per sample."""
        scored = self.scorer.score(batch.prompts, batch.completions, batch.rows) if self.scorer is not None \
            else Scores([0.0] * len(batch))
        if self.reward_model is not None:
            rm = self.reward_model.compute_rm_score(batch).rm_scores.tolist()
            scored.scores = [s + self.cfg.reward.model.weight * m for s, m in zip(scored.scores, rm)]
            scored.extras["model"] = rm
        return scored

    def score(self, batch: Batch) -> tuple[Batch, Scores]:
        """Reward each sample; add DAPO's overlong penalty when configured."""
        r = self.cfg.reward
        scored = self.reward(batch)
        scores = torch.tensor(scored.scores, dtype=torch.float32)
        if r.overlong_buffer_len > 0:
            scores = scores + overlong_penalty(batch.response_lengths, max_length=self.cfg.rollout.max_new_tokens,
                                               buffer=r.overlong_buffer_len, penalty_factor=r.overlong_penalty_factor)
        return batch.replace(scores=scores), scored

    def greedy_baselines(self, items: list) -> torch.Tensor:
        """[B] reward of one greedy response per prompt, repeated over its samples (ReMax's baseline)."""
        greedy = SamplingParams(n=1, max_new_tokens=self.cfg.rollout.max_new_tokens, temperature=0.0)
        batch, _ = self.score(self.rollout.generate(items, greedy))
        return batch.scores.repeat_interleave(self.cfg.rollout.n)

    def compute_advantages(self, batch: Batch, metrics: dict) -> Batch:
        """Token-level rewards (score at the last token, minus the KL penalty if in the reward) -> advantages."""
        cfg, alg = self.cfg, self.cfg.algorithm
        lengths = batch.response_lengths
        rewards = torch.zeros(batch.response_ids.shape)
        rewards[torch.arange(len(batch)), (lengths - 1).clamp(min=0)] = batch.scores
        mask = batch.response_mask.float()
        if cfg.actor.mask_truncated:  # DAPO overlong filtering: truncated samples leave the loss
            mask = mask * (~batch.truncated).float()[:, None]
            batch = batch.replace(response_mask=batch.response_mask * (~batch.truncated).long()[:, None])
        if alg.use_kl_in_reward:
            rewards, kl_metrics = kl_in_reward(rewards, batch.old_log_probs, batch.ref_log_probs, mask,
                                               kl_coef=self.kl_ctrl.value, estimator=alg.kl_penalty)
            metrics.update({k: float(v) for k, v in kl_metrics.items()})
            self.kl_ctrl.update(float(kl_metrics["kl_in_reward/kl_mean"]), n_steps=len(batch))
        out = call_with_available(
            self.advantage_fn, scores=rewards.sum(-1), token_level_rewards=rewards, response_mask=mask,
            group_ids=batch.group_ids, values=batch.values, baselines=batch.baselines,
            norm_adv_by_std=alg.norm_adv_by_std, epsilon=alg.epsilon, gamma=alg.gamma, lam=alg.lam,
            completions=batch.completions, rows=batch.rows)
        advantages, returns = out if isinstance(out, tuple) else (out, None)
        if returns is None and batch.values is not None:
            returns = advantages + batch.values
        return batch.replace(advantages=advantages, returns=returns, token_level_rewards=rewards)

    def sync_weights(self) -> None:
        """Push the actor's weights to the rollout engines, one tensor at a time, versioned (inside each
        rank's process when colocated; from the actor's rank 0 to every engine when split). In async
        mode the update is queued on the engines behind the generations already in flight, and checked
        when the next one is taken."""
        self.version += 1
        if not self.is_async:
            self.actor.transfer("named_weights", self.rollout, "update_weights", self.version)
            return
        for pending in [c for c in self.pending_syncs if c.done()]:
            pending.result()  # raises a sync that failed
            self.pending_syncs.remove(pending)
        # timed_submit: the update waits behind generations in flight, which is not dispatch overhead
        self.pending_syncs.append(self.rollout.timed_submit("update_weights", Broadcast(self.actor.named_weights()),
                                                            self.version))

    def drain(self) -> None:
        """Wait for the weight updates and generations still in flight (async mode) and drop them."""
        for pending in self.pending_syncs:
            pending.result()
        for _, _, call, _ in self.in_flight:
            call.result()
        self.pending_syncs.clear()
        self.in_flight.clear()

    def close(self) -> None:
        """Stop the workers (Ray actors, and Ray if this run started it)."""
        self.placement.close()

    def validate(self, step: int) -> dict[str, float]:
        if not self.val_items:
            return {}
        r = self.cfg.rollout
        params = SamplingParams(n=r.val_n, max_new_tokens=r.max_new_tokens, temperature=r.val_temperature, top_p=1.0)
        with self.engines_awake():
            return validate(self.rollout, self.val_items, self.reward, params=params, batch_size=r.val_batch_size,
                            samples_path=self.run_dir / "samples.jsonl", step=step,
                            num_samples=self.cfg.trainer.log_samples, seed=10**9 + self.step_seed(step))

    def save_checkpoint(self, step: int) -> Path:
        """Everything needed to continue exactly: weights, optimizers, sampler, KL controller, RNG."""
        def write(folder: Path) -> None:
            folder.mkdir(parents=True)
            self.actor.save_checkpoint(str(folder / "actor"))
            if self.critic is not None:
                self.critic.save_checkpoint(str(folder / "critic"))
            # Async mode: prompts already drawn for steps in flight are drawn again after a resume.
            sampler = self.in_flight[0][3] if self.in_flight else self.sampler.state_dict()
            save_state({"step": step, "version": self.version, "sampler": sampler,
                        "kl_ctrl": self.kl_ctrl.state_dict(), "rng": rng_state()}, folder / "controller.pt")

        return self.checkpoints.save(step, write)

    def load_checkpoint(self, folder: Path) -> int:
        """Restore a checkpoint written by `save_checkpoint`; returns its step."""
        state = load_state(folder / "controller.pt")
        self.actor.load_checkpoint(str(folder / "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(str(folder / "critic"))
        self.sampler.load_state_dict(state["sampler"])
        self.next_rollout_step = state["step"] + 1
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        set_rng_state(state["rng"])
        self.version = state["version"]
        self.actor.transfer("named_weights", self.rollout, "update_weights", self.version)
        return state["step"]

    def fit(self) -> dict[str, dict[str, float]]:
        """(Resume,) validate, train to `trainer.total_steps` (validating every `val_every`, saving every
        `save_every`), validate again."""
        t = self.cfg.trainer
        checkpoint = self.checkpoints.resolve(t.resume)
        start = self.load_checkpoint(checkpoint) if checkpoint is not None else 0
        history = self.logger.start(start)
        if not start:
            (self.run_dir / "samples.jsonl").unlink(missing_ok=True)
        if checkpoint is not None:
            tqdm.write(f"resumed from {checkpoint} (step {start} of {t.total_steps})")
        self.trackers = build_trackers(t.loggers, self.run_dir, self.cfg.to_dict(), t.project,
                                       t.run_name or self.run_dir.resolve().name, resume_step=start)
        try:
            return self.train_from(start, history)
        finally:
            for tracker in self.trackers:
                tracker.close()

    def train_from(self, start: int, history: list[dict]) -> dict[str, dict[str, float]]:
        """Steps start+1 .. trainer.total_steps; `history` holds the kept records of a resumed run."""
        t = self.cfg.trainer
        do_val = t.val_every > 0 and bool(self.val_items)
        first = next((r for r in history if r["step"] == 0), {}) if start else (self.validate(0) if do_val else {})
        if first and not start:
            self.log(0, first, force_print=True)
        first = {k: v for k, v in first.items() if k != "step"}
        last = next(({k: v for k, v in r.items() if k.startswith("val/")} for r in reversed(history)
                     if any(k.startswith("val/") for k in r)), dict(first))
        began = time.perf_counter()
        bar = tqdm(range(start + 1, t.total_steps + 1), desc="rl", unit="step", dynamic_ncols=True)
        for step in bar:
            try:
                metrics = self.step(step)
            except WorkerError as e:
                if isinstance(e.original, NonFiniteLossError):
                    raise TrainingError(
                        f"Stopped at step {step}: {e.original}. Lower actor.lr, check that rewards are finite and "
                        f"of moderate scale, or lower actor.grad_clip; metrics of steps before {step} are kept "
                        f"in {self.logger.path}.") from None
                raise
            if do_val and (step % t.val_every == 0 or step == t.total_steps):
                last = self.validate(step)
                metrics.update(last)
            self.log(step, metrics, force_print=step == t.total_steps)
            if t.save_every and (step % t.save_every == 0 or step == t.total_steps):
                self.save_checkpoint(step)
            bar.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}")
        self.drain()
        if start >= t.total_steps:
            tqdm.write(f"nothing left to train: the checkpoint is at step {start} of trainer.total_steps="
                       f"{t.total_steps}; use trainer.resume=never or another trainer.output_dir to start over.")
        return {"before": first, "after": last, "seconds": time.perf_counter() - began}

    def log(self, step: int, metrics: dict[str, float], *, force_print: bool = False) -> None:
        """One step's metrics to metrics.jsonl and the console, and to every tracker of trainer.loggers."""
        self.logger.log(step, metrics, force_print=force_print)
        for tracker in self.trackers:
            tracker.log(step, metrics)


def stale_without_is(cfg: Config) -> bool:
    return cfg.trainer.mode == "async" and cfg.rollout.max_staleness > 0 and cfg.actor.rollout_is is None


def with_rollout_is(cfg: Config) -> Config:
    """Async mode corrects stale samples with token-level truncated importance sampling unless the
    config chose a level (actor.rollout_is)."""
    return dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, rollout_is="token"))


def staleness_metrics(batch: Batch, version: int) -> dict[str, float]:
    """How many weight versions behind the trained policy the samples were generated."""
    staleness = (version - batch.policy_version).float()
    return {"async/staleness/mean": staleness.mean().item(), "async/staleness/max": staleness.max().item()}


def length_metrics(batch: Batch) -> dict[str, float]:
    lengths = batch.response_lengths.float()
    return {"response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/clip_ratio": batch.truncated.float().mean().item()}


def batch_metrics(batch: Batch) -> dict[str, float]:
    out = {"critic/score/mean": batch.scores.mean().item(), "critic/score/max": batch.scores.max().item(),
           "critic/score/min": batch.scores.min().item(),
           "critic/rewards/mean": batch.token_level_rewards.sum(-1).mean().item(),
           "critic/advantages/mean": (batch.advantages.sum() / batch.response_mask.sum().clamp(min=1)).item()}
    if batch.values is not None:
        out["critic/values/mean"] = (batch.values.sum() / batch.response_mask.sum().clamp(min=1)).item()
    return out
