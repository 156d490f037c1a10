"""The single controller: the RL loop as plain sequential Python.

`Controller.step()` is the whole algorithm: generate -> reward -> old/ref log-probs ->
values -> advantages -> critic update -> actor update -> weight sync -> metrics. Heavy work
happens in worker groups; the controller only moves typed batches between them and never
branches on an algorithm's name: what a step computes follows from what the configured
estimator's signature asks for (values -> a critic, baselines -> a greedy rollout).

It is built from a `RunPlan` (grpoflow/plan/): the config checked, every registry name resolved, the tokenizer
loaded; it resolves nothing itself. The controller holds the roles (worker groups), the step, the advantages and the
checkpoint state (save, load, the last checkpoint written); the run around it (resume, the loop over steps,
validation and checkpoint cadence, logging, preemption, automatic restarts) is `RunLoop` in fit.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from functools import partial
from typing import Any, Iterator
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from grpoflow.algorithms import call_with_available, groups_with_signal, required_inputs
from grpoflow.config import Config, require_checked, to_yaml
from grpoflow.controller.checkpoint import (CheckpointManager, load_state, restore_queue, rng_state, save_state,
                                           set_rng_state)
from grpoflow.controller.curriculum import build_sampler, group_feedback
from grpoflow.controller.distill import SELF, Distiller, resolve_teacher
from grpoflow.controller.partial import PartialQueue
from grpoflow.controller.placement import build_placement
from grpoflow.controller.restart import restartable
from grpoflow.controller.rewarding import build_rewards, reward_roles
from grpoflow.controller.rollouts import RolloutQueue, Rollouts, step_seed
from grpoflow.algorithms.advantage_inputs import AdvantageInputs
from grpoflow.controller.step_math import group_rows, partition_groups, token_rewards
from grpoflow.controller.train_samples import TrainSamples
from grpoflow.controller.held_out import evaluate_held_out, val_params, val_seed
from grpoflow.controller.weight_sync import WeightSync
from grpoflow.plan.run_plan import RunPlan
from grpoflow.data.batch import Batch
from grpoflow.distributed.worker_group import WorkerError, WorkerGroup
from grpoflow.controller.reward_health import reward_health
from grpoflow.rewards.scoring import RewardScorer, Scores
from grpoflow.engines.protocol import SamplingParams
from grpoflow.training.budget import microbatch_budget
from grpoflow.training.forward import UpdateSchedule
from grpoflow.training.precision import role_precision
from grpoflow.training.timing import StageTimer
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.critic import CriticWorker
from grpoflow.workers.frozen import FrozenWorker
from grpoflow.workers.rollout import RolloutWorker


class Controller:
    """The roles of one run, its step and its checkpoint state; `RunLoop(controller).fit()` runs it."""

    def __init__(self, plan: RunPlan) -> None:
        """The roles of `plan` (grpoflow/plan/: checked, every name resolved, tokenizer loaded); nothing is resolved
        again here."""
        cfg, model_path = plan.cfg, plan.model_path
        require_checked(cfg, "Controller")  # checked once, at the edge (plan.checks.check_config)
        self.plan, self.cfg, self.run_dir = plan, cfg, plan.run_dir
        self.val_items = plan.val_items
        self.advantage_fn = plan.parts.advantage_fn
        needs = required_inputs(self.advantage_fn)
        a, alg, r = cfg.actor, cfg.algorithm, cfg.rollout
        # Where the roles run (this process, or Ray actors colocated or split); the rest of the
        # controller cannot tell the difference.
        teacher = cfg.distill.teacher.path  # checked (same tokenizer) before any worker starts
        self.teacher_path = resolve_teacher(teacher, self.run_dir, plan.tokenizer) if teacher else None
        self.pad_token_id = plan.pad_token_id  # pads the batches gathered from ranks or concatenated here
        self.placement = build_placement(cfg)
        try:
            self._build_groups(cfg, model_path, needs)
        except BaseException:
            self.placement.close()
            raise
        self.needs_baselines = "baselines" in needs
        # colocated engines that can free their memory (vllm, sglang with rollout.free_cache_engine) sleep in training
        self.sleep_engines = self.placement.colocated and self.rollout.call(RolloutWorker.can_sleep)
        # With one optimizer step per RL step the importance ratio is exactly 1, so the
        # old-log-prob pass would recompute what the update computes anyway: skip it unless
        # the KL-in-reward needs the log-probs before the update.
        # Stale samples (async mode) need the proximal policy's log-probs and, through actor.rollout_is,
        # the importance weight pi_old / pi_rollout.
        self.is_async = cfg.trainer.mode == "async"
        stale = self.is_async and r.max_staleness > 0
        self.need_old_log_probs = a.minibatches * a.epochs > 1 or alg.use_kl_in_reward or stale
        self.sampling = SamplingParams(n=r.n, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)
        # One path for every kind of run: the rollout workers play the trajectories (single-turn samples,
        # rollout.multi_turn conversations, rollout.agent episodes) over their engines' batchers.
        self.rollouts = Rollouts(self.rollout, multi_turn=r.multi_turn.enabled, agent=r.agent.enabled)
        self.model_path, self.train_items, self.needs = model_path, plan.train_items, needs
        self._start_state(plan.scorer)
        self.reward_health = reward_health(cfg.reward, plan.scorer, warn=lambda text: tqdm.write(f"WARNING: {text}"),
                                           total_steps=cfg.trainer.total_steps)
        self.last_saved: Path | None = None  # the newest checkpoint this run wrote or loaded: where a restart resumes
        self.checkpoints = CheckpointManager(self.run_dir, keep_last=cfg.trainer.keep_last)
        self.train_samples = TrainSamples(self.run_dir, every=cfg.trainer.log_train_every,
                                          groups=cfg.trainer.log_train_groups, load_decode=lambda: plan.decode)

    def _start_state(self, scorer: RewardScorer | None) -> None:
        """What the run holds beside the workers, as at step 0: KL controller, prompt queue, rewards, weight sync
        (rebuilt with the workers by a restart, then restored from the checkpoint)."""
        cfg, r, kl = self.cfg, self.cfg.rollout, self.cfg.algorithm.kl_ctrl
        self.kl_ctrl = call_with_available(self.plan.parts.kl_controller, kl_coef=kl.kl_coef, target_kl=kl.target_kl,
                                           horizon=kl.horizon)
        self.rollouts.group = self.rollout
        sampler, per_step = build_sampler(cfg, len(self.train_items)), cfg.data.prompts_per_step
        self.queue: RolloutQueue | PartialQueue
        if r.partial.enable:  # groups carried from step to step, unfinished samples paused (controller/partial.py)
            self.queue = PartialQueue(self.rollouts, self.train_items, sampler, prompts_per_step=per_step,
                                      params=self.sampling, oversample=r.partial.oversample,
                                      max_staleness=r.partial.max_staleness, seed_of=self.step_seed,
                                      version=lambda: self.version, pad_token_id=self.pad_token_id)
        else:
            self.queue = RolloutQueue(self.rollouts, self.train_items, sampler, prompts_per_step=per_step,
                                      params=self.sampling, ahead=r.max_staleness if self.is_async else 0,
                                      last_step=cfg.trainer.total_steps, seed_of=self.step_seed)
        self.rewards = build_rewards(cfg, scorer, self.reward_model, self.judge)
        self.weight_sync = WeightSync(self.actor, self.rollout, queued=self.is_async, dtype=rollout_dtype(self.cfg))
        self.version = 0  # of the weights the engines hold (or, async, have queued)

    def rebuild(self) -> None:
        """Tear every worker group down and build them again (on the Ray nodes still alive), with the run's state
        as at step 0; a checkpoint is loaded next (trainer.max_restarts)."""
        old = self.placement
        started, old.started_ray = old.started_ray, False  # Ray itself stays up
        old.close()
        try:
            placement = build_placement(self.cfg)
        except BaseException:
            old.started_ray = started  # so that close() still stops a Ray this run started
            raise
        placement.started_ray, self.placement = started, placement
        self._build_groups(self.cfg, self.model_path, self.needs)
        self._start_state(self.rewards.scorer)

    def _build_groups(self, cfg: Config, model_path: str, needs: set[str]) -> None:
        budget = microbatch_budget(cfg.actor.max_tokens_per_microbatch, model_path=model_path,
                                   seq=cfg.data.max_prompt_length + cfg.rollout.max_new_tokens,
                                   compute_dtype=cfg.model.compute_dtype,  # every role's; 0: from memory
                                   ranks_here=cfg.backend == "local")
        if budget != cfg.actor.max_tokens_per_microbatch:
            how = "chosen from memory" if cfg.backend == "local" else \
                "the floor: with backend=ray the ranks' memory is not known here; set it for your devices"
            tqdm.write(f"micro-batch budget: {budget} tokens per rank, {how} (actor.max_tokens_per_microbatch=0)")
        cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, max_tokens_per_microbatch=budget))
        a, alg, seed = cfg.actor, cfg.algorithm, cfg.trainer.seed
        train_pool = self.placement.train
        self.actor = WorkerGroup("actor", partial(
            ActorWorker, model_path=model_path, cfg=a, seed=seed, temperature=cfg.rollout.temperature,
            horizon=cfg.rollout.max_new_tokens,
            total_optimizer_steps=cfg.trainer.total_steps * a.minibatches * a.epochs,
            model_cfg=cfg.model, topk_kl_coef=cfg.distill.topk_coef if cfg.distill.topk else 0.0,
            lora_sync=cfg.rollout.lora_sync, exact=cfg.rollout.exact, parts=self.plan.parts,
            tokenizer=self.plan.tokenizer), pool=train_pool)
        # The reference policy exists only for a KL term; with LoRA the actor serves it (adapters off).
        self.needs_ref = a.kl_coef > 0 or alg.use_kl_in_reward
        self.ref: WorkerGroup[FrozenWorker] | None = None
        if self.needs_ref and cfg.model.lora.rank == 0:
            self.ref = WorkerGroup("reference", partial(FrozenWorker, model_path=model_path, **frozen_options(cfg)),
                                   pool=train_pool)
        self.teacher: WorkerGroup[FrozenWorker] | None = None
        self.distiller = self._build_teacher(cfg, train_pool, model_path, self.teacher_path) \
            if self.teacher_path else None
        schedule = UpdateSchedule(a.minibatches, a.epochs, a.max_tokens_per_microbatch)
        self.critic = WorkerGroup("critic", partial(
            CriticWorker, model_path=model_path, cfg=cfg.critic, schedule=schedule, seed=seed,
            compute_dtype=cfg.model.compute_dtype), pool=train_pool) if "values" in needs else None
        self.reward_model, self.judge = reward_roles(cfg, self.run_dir, train_pool)
        self.rollout = rollout_group(dataclasses.replace(self.plan, cfg=cfg), self.placement.rollout,
                                     lora=adapter_layout(cfg))

    def _build_teacher(self, cfg: Config, pool: Any, model_path: str, teacher_path: str) -> Distiller:
        """On-policy distillation's teacher: a frozen model's group like the reference (or the actor itself)."""
        self.teacher = None if teacher_path == SELF else WorkerGroup("teacher", partial(
            FrozenWorker, model_path=teacher_path, **frozen_options(cfg), topk=cfg.distill.topk), pool=pool,
            pad_token_id=self.pad_token_id)
        return Distiller(cfg.distill, teacher=self.teacher, actor=self.actor, tokenizer=self.plan.tokenizer)

    def step(self, step: int) -> dict[str, float]:
        """One RL step; returns its metrics. Each stage adds the fields it computes to the batch."""
        cfg, timer = self.cfg, StageTimer()
        metrics: dict[str, float] = {}
        torch.manual_seed(self.step_seed(step))
        with timer("step"):
            with self.engines_awake():
                batch, items = self.generate_and_score(step, timer, metrics)
            if self.is_async:
                metrics.update(staleness_metrics(batch, self.version))
            if self.needs_baselines:
                with timer("gen_baseline"), self.engines_awake():
                    batch = batch.replace(baselines=self.rewards.greedy_baselines(self.rollouts, items, cfg.rollout.n))
            if self.need_old_log_probs:
                with timer("old_log_prob"):
                    batch = batch.replace(old_log_probs=self.actor.call(ActorWorker.compute_log_prob, batch))
            if self.needs_ref:
                with timer("ref"):
                    batch = batch.replace(ref_log_probs=self.ref_log_prob(batch))
            if self.distiller is not None:
                with timer("teacher"):
                    batch = self.distiller.score(batch)
            if self.critic is not None:
                with timer("values"):
                    batch = batch.replace(values=self.critic.call(CriticWorker.compute_values, batch))
            with timer("adv"):
                scored, batch = batch, self.compute_advantages(batch, metrics)
            self.train_samples.record(step, scored, batch)  # a copy of a few groups to a writer thread
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self.critic.call(CriticWorker.update_critic, batch))
            if step > cfg.critic.warmup_steps or self.critic is None:
                with timer("update_actor"):
                    metrics.update(self.actor.call(ActorWorker.update_policy, batch))
                with timer("sync"):
                    self.version += 1
                    self.weight_sync.push(self.version)
                if self.weight_sync.last_bytes is not None:  # bucketed (split placement): what each engine received
                    metrics["perf/weight_sync_bytes"] = float(self.weight_sync.last_bytes)
        # The dispatch layer's own cost: time in worker calls beyond the ranks' time on them.
        dispatch = sum(g.take_dispatch_seconds() for g in self.groups())
        metrics.update({"timing_s/dispatch": dispatch, "perf/dispatch_share": dispatch / timer.seconds["step"]})
        if self.is_async:
            metrics.update(wait_metrics(timer.seconds["step"], timer.seconds.get("trainer_wait", 0.0),
                                        timer.seconds["gen_busy"]))
        return {**metrics, **batch_metrics(batch), **timer.metrics(),
                "perf/throughput": float(batch.attention_mask.sum()) / timer.seconds["step"]}

    def ref_log_prob(self, batch: Batch) -> Tensor:
        """[B, R] reference log-probs: from the reference group, or with LoRA from the actor (adapters off)."""
        if self.ref is not None:
            return self.ref.call(FrozenWorker.log_probs, batch)
        return self.actor.call(ActorWorker.compute_ref_log_prob, batch)

    @contextlib.contextmanager
    def engines_awake(self) -> Iterator[None]:
        """Colocated vllm/sglang engines hold their KV cache only while generating (rollout.free_cache_engine):
        the actor trains in the memory they free."""
        if self.sleep_engines:
            self.rollout.call(RolloutWorker.wake)
        try:
            yield
        finally:
            if self.sleep_engines:
                self.rollout.call(RolloutWorker.sleep)

    def groups(self) -> list[WorkerGroup[Any]]:
        every = [self.actor, self.ref, self.teacher, self.critic, self.reward_model, self.judge, self.rollout]
        return list({id(g): g for g in every if g is not None}.values())

    def step_seed(self, step: int, draw: int = 0) -> int:
        """Rollouts depend on (trainer.seed, step, draw) only, wherever and whenever they run."""
        return step_seed(self.cfg.trainer.seed, step, draw)

    def generate_and_score(self, step: int, timer: StageTimer, metrics: dict) -> tuple[Batch, list]:
        """Sample `rollout.n` responses for `data.prompts_per_step` prompts and score them.

        With `algorithm.filter_groups.enable` (DAPO dynamic sampling), groups whose rewards are all
        equal carry no signal: they are set aside and more prompts are drawn, up to `max_draws`
        rounds; if still short, set-aside groups fill the step (their advantage is zero).
        """
        cfg, want = self.cfg, self.cfg.data.prompts_per_step
        draws = cfg.algorithm.filter_groups.max_draws if cfg.algorithm.filter_groups.enable else 1
        kept: list[tuple[Batch, object]] = []
        spare: list[tuple[Batch, object]] = []
        scores: Scores | None = None
        for draw in range(draws):
            with timer("trainer_wait" if self.is_async else "gen"):
                pending = self.queue.take(step) if draw == 0 else \
                    self.rollouts.submit(self.queue.draw(want), self.sampling, self.step_seed(step, draw))
                batch, busy = pending.result()
                metrics.update(pending.metrics)
            timer.seconds["gen_busy"] = timer.seconds.get("gen_busy", 0.0) + busy  # the engines' own time
            with timer("reward"):
                shaped, scored = self.rewards.shaped(batch, step)
                batch = batch.replace(scores=shaped, reward_parts=scored.sample_parts())
            self.reward_health.check(step, scored, shaped, batch.group_ids)  # stops a run that would learn nothing
            # each drawn prompt's pass rate -> the curriculum, by group id and over episodes (an agent episode may
            # give several samples: its `final` one counts); the zero-advantage share over the groups present
            raw = torch.tensor(scored.scores, dtype=torch.float32)
            final = [c.final for c in batch.carried] if len(batch.carried) == len(batch) else None
            metrics.update(group_feedback(self.queue.sampler, pending.items, shaped, raw, batch.group_ids,
                                          self.cfg.data.curriculum.solved_score, final))
            scores = scored if scores is None else scores.merge(scored)
            if draws == 1:
                metrics.update({**scores.metrics(), **length_metrics(batch)})
                return batch, pending.items  # group ids come from the batch (an agent episode may give several)
            keep, set_aside = partition_groups(groups_with_signal(shaped, batch.group_ids), batch.group_ids)
            kept += [(batch.select(group_rows(batch, g)), pending.items[g]) for g in keep]
            spare += [(batch.select(group_rows(batch, g)), pending.items[g]) for g in set_aside]
            if len(kept) >= want:
                break
        assert scores is not None
        metrics.update(scores.metrics())
        metrics.update({"filter_groups/draws": draw + 1, "filter_groups/signal_groups": float(len(kept))})
        chosen = (kept + spare)[:want]
        batch = Batch.concat([b.replace(group_ids=torch.full_like(b.group_ids, g)) for g, (b, _) in enumerate(chosen)],
                             pad_token_id=self.pad_token_id)
        metrics.update(length_metrics(batch))
        return batch, [it for _, it in chosen]

    def compute_advantages(self, batch: Batch, metrics: dict) -> Batch:
        """Token-level rewards (score at the last token, minus the KL penalty if in the reward) -> advantages."""
        alg = self.cfg.algorithm
        assert batch.scores is not None and batch.truncated is not None, "advantages need scored samples"
        kl = (batch.old_log_probs, batch.ref_log_probs) if alg.use_kl_in_reward else (None, None)
        rewards, response_mask, kl_metrics = token_rewards(
            batch.scores, batch.response_mask, batch.truncated, mask_truncated=self.cfg.actor.mask_truncated,
            old_log_probs=kl[0], ref_log_probs=kl[1], kl_coef=self.kl_ctrl.value, kl_estimator=alg.kl_penalty)
        batch = batch.replace(response_mask=response_mask)
        mask = response_mask.float()
        if kl_metrics:
            metrics.update({k: float(v) for k, v in kl_metrics.items()})
            self.kl_ctrl.update(float(kl_metrics["kl_in_reward/kl_mean"]), n_steps=len(batch))
        inputs = AdvantageInputs(
            scores=rewards.sum(-1), token_level_rewards=rewards, response_mask=mask, group_ids=batch.group_ids,
            values=batch.values, baselines=batch.baselines, norm_adv_by_std=alg.norm_adv_by_std,
            epsilon=alg.epsilon, gamma=alg.gamma, lam=alg.lam, completions=batch.completions, rows=batch.rows)
        out = call_with_available(self.advantage_fn, **inputs.kwargs())
        advantages, returns = out if isinstance(out, tuple) else (out, None)
        if self.distiller is not None:  # the teacher's per-token reverse KL, mixed with the task advantage
            advantages, distill_metrics = self.distiller.advantages(batch, advantages)
            metrics.update(distill_metrics)
        if returns is None and batch.values is not None:
            returns = advantages + batch.values
        return batch.replace(advantages=advantages, returns=returns, token_level_rewards=rewards)

    def drain(self) -> None:
        """Wait for the weight updates and generations still in flight (async mode) and drop them."""
        self.weight_sync.wait()
        self.queue.drain()

    def close(self) -> None:
        """Stop the workers (Ray actors, and Ray if this run started it), the tool processes or the agent endpoint."""
        try:
            self.rollout.call(RolloutWorker.close)
        except WorkerError as e:  # a dead rank's tool processes and endpoint went with it; stop the rest anyway
            tqdm.write(f"closing the rollout workers: {e.args[0].splitlines()[0]}")
        finally:
            self.placement.close()

    def evaluate_held_out(self, step: int) -> dict[str, float]:
        """The validation after step `step` (0: before training): the `val/...` metrics of the held-out prompts."""
        if not self.val_items:
            return {}
        with self.engines_awake():  # as `grpoflow eval` does (commands/evaluate.py), with the run's roles
            return evaluate_held_out(self.rollouts, self.val_items, self.rewards.score, params=val_params(self.cfg),
                                     batch_size=self.cfg.rollout.val_batch_size,
                                     samples_path=self.run_dir / "samples.jsonl", step=step,
                                     num_samples=self.cfg.trainer.log_samples,
                                     seed=val_seed(self.cfg.trainer.seed, step))

    def save_checkpoint(self, step: int) -> Path:
        """Everything needed to continue exactly: weights, optimizers, sampler, KL controller, RNG, and the
        step count the LR schedule was built for."""
        def write(folder: Path) -> None:
            folder.mkdir(parents=True)
            try:
                self.actor.call(ActorWorker.save_checkpoint, str(folder / "actor"))
                if self.critic is not None:
                    self.critic.call(CriticWorker.save_checkpoint, str(folder / "critic"))
            except WorkerError as e:  # the rank's own error (disk full, permission) is what the message names
                if e.original is None or restartable(e):
                    raise
                raise e.original from e
            save_state({"step": step, "version": self.version, **self.queue.state_dict(),
                        "kl_ctrl": self.kl_ctrl.state_dict(), "rng": rng_state(),
                        "total_steps": self.cfg.trainer.total_steps}, folder / "controller.pt")
            (folder / "config.yaml").write_text(to_yaml(self.cfg))  # what a resume compares its settings with

        self.train_samples.flush()  # the training groups of the steps the checkpoint holds are on disk
        self.last_saved = self.checkpoints.save(step, write)
        return self.last_saved

    def load_checkpoint(self, folder: Path) -> int:
        """Restore a checkpoint written by `save_checkpoint`; returns its step."""
        state = load_state(folder / "controller.pt")
        restore_queue(self.queue, state, folder / "controller.pt")  # first: a state that does not fit stops at once
        self.actor.call(ActorWorker.load_checkpoint, str(folder / "actor"))
        if self.critic is not None:
            self.critic.call(CriticWorker.load_checkpoint, str(folder / "critic"))
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        set_rng_state(state["rng"])
        self.version = state["version"]
        self.weight_sync.push(self.version)
        self.weight_sync.wait()
        saved_total = state.get("total_steps", self.cfg.trainer.total_steps)
        if saved_total != self.cfg.trainer.total_steps:
            tqdm.write(schedule_change_warning(saved_total, self.cfg))
        self.last_saved = folder
        return state["step"]


def rollout_dtype(cfg: Config) -> str:
    """The rollout engines' dtype (training/precision.py), in which their weights are synced too: bfloat16 when the
    run computes or stores in bf16 (the rollout copy never trains, so needs no fp32 master), else float32."""
    return role_precision("rollout", dtype=cfg.model.dtype, compute_dtype=cfg.model.compute_dtype).weights_dtype


def frozen_options(cfg: Config) -> dict[str, Any]:
    """The frozen role's options (reference and teacher, workers/frozen.py): the policy's precision inputs, so that
    it computes as the actor does, and the actor's forward settings."""
    a = cfg.actor
    return dict(temperature=cfg.rollout.temperature, max_tokens=a.max_tokens_per_microbatch,
                chunk_size=a.logprob_chunk_size, dtype=cfg.model.dtype, compute_dtype=cfg.model.compute_dtype,
                lora=cfg.model.lora.rank > 0)


def rollout_group(plan: RunPlan, pool: Any = None, *, lora: dict | None = None) -> WorkerGroup[RolloutWorker]:
    """The rollout role of `plan` in `pool` (None: this process): the run's and `grpoflow eval`'s alike, so that eval
    samples as the run's validation did. `lora`: the adapter layout the engines serve (`adapter_layout`)."""
    cfg, sync_timeout = plan.cfg, plan.cfg.rollout.sync_timeout_s
    return WorkerGroup("rollout", partial(
        RolloutWorker, model_path=plan.model_path, cfg=cfg, seed=cfg.trainer.seed, dtype=rollout_dtype(cfg), lora=lora,
        parts=plan.parts, tokenizer=plan.tokenizer), pool=pool, pad_token_id=plan.pad_token_id,
        timeouts={RolloutWorker.update_weights: sync_timeout, RolloutWorker.end_weight_update: sync_timeout})


def adapter_layout(cfg: Config) -> dict | None:
    """What a rollout engine needs to serve the policy's LoRA adapters unmerged (rollout.lora_sync=adapter)."""
    if cfg.rollout.lora_sync != "adapter":
        return None
    lora = cfg.model.lora
    target = lora.target_modules
    return {"rank": lora.rank, "alpha": lora.alpha, "target_modules": target[0] if target == ["all-linear"] else target}


def schedule_change_warning(saved_total: int, cfg: Config) -> str:
    """What resuming with another trainer.total_steps does to the run."""
    a = cfg.actor
    effect = (f"the {a.lr_schedule} learning-rate schedule continues on the new horizon, so the learning rate from "
              "here on differs from the run the checkpoint came from" if a.lr_schedule != "constant" else
              "the learning rate is constant, so only the number of steps changes")
    return (f"warning: resuming with trainer.total_steps={cfg.trainer.total_steps}, but the checkpoint was written by "
            f"a run with trainer.total_steps={saved_total}: {effect}. Set trainer.total_steps={saved_total} to "
            "continue the original run exactly.")


def staleness_metrics(batch: Batch, version: int) -> dict[str, float]:
    """How many weight versions behind the trained policy the samples were generated."""
    assert batch.policy_version is not None
    staleness = (version - batch.policy_version).float()
    return {"async/staleness/mean": staleness.mean().item(), "async/staleness/max": staleness.max().item()}


def wait_metrics(step_s: float, trainer_wait_s: float, gen_busy_s: float) -> dict[str, float]:
    """Async mode's overlap, from a step's seconds, its trainer's wait for samples and its engines' generating time:
    the engines were idle for the part of the step they did not generate (`timing_s/rollout_wait`), and each wait
    as a share of the step (`perf/trainer_wait_share`, `perf/rollout_wait_share`). Generation overlapped training
    when the step is shorter than the two stages in a row: gen_busy + (step - trainer_wait), i.e. when the trainer
    waited less than the engines generated."""
    rollout_wait = max(0.0, step_s - gen_busy_s)
    return {"timing_s/rollout_wait": rollout_wait, "perf/trainer_wait_share": trainer_wait_s / step_s,
            "perf/rollout_wait_share": rollout_wait / step_s}


def length_metrics(batch: Batch) -> dict[str, float]:
    lengths = batch.response_lengths.float()
    assert batch.truncated is not None
    return {"response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/clip_ratio": batch.truncated.float().mean().item()}


def batch_metrics(batch: Batch) -> dict[str, float]:
    scores, rewards, advantages = batch.scores, batch.token_level_rewards, batch.advantages
    assert scores is not None and rewards is not None and advantages is not None
    out = {"critic/score/mean": scores.mean().item(), "critic/score/max": scores.max().item(),
           "critic/score/min": scores.min().item(), "critic/rewards/mean": rewards.sum(-1).mean().item(),
           "critic/advantages/mean": (advantages.sum() / batch.response_mask.sum().clamp(min=1)).item()}
    if batch.values is not None:
        out["critic/values/mean"] = (batch.values.sum() / batch.response_mask.sum().clamp(min=1)).item()
    return out
