"""The actor role: the policy being trained.

Verbs: `compute_log_prob` (old log-probs, no grad), `update_policy` (mini-batches x token-budget
micro-batches, clipped policy loss + KL term), `named_weights` (for weight sync). The worker
sees its data-parallel shard only; the global token/sequence counts that normalise the loss
are summed over ranks, so the gradient is the same for any world size or micro-batch split.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from grpoflow.algorithms import POLICY_LOSSES, aggregate_loss, call_with_available, kl_penalty, truncated_is_weights
from grpoflow.config import ActorConfig, ModelConfig
from grpoflow.data.batch import Batch
from grpoflow.training.microbatch import split_by_tokens
from grpoflow.training.engine import TrainEngine, global_sum, lr_multiplier
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.lora import add_lora, is_lora
from grpoflow.models.logprobs import response_log_probs
from grpoflow.training.forward import batch_log_probs


class ActorWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, cfg: ActorConfig, temperature: float,
                 horizon: int, seed: int, total_optimizer_steps: int = 0, model_cfg: ModelConfig | None = None
                 ) -> None:
        torch.manual_seed(seed)
        self.rank, self.world_size = rank, world_size
        self.cfg, self.model_path = cfg, model_path
        self.temperature = temperature
        self.horizon = horizon  # max response length, the Dr.GRPO normaliser
        self.policy_loss = POLICY_LOSSES.resolve(cfg.policy_loss)
        schedule = partial(lr_multiplier, warmup_steps=cfg.lr_warmup_steps, total_steps=total_optimizer_steps,
                           schedule=cfg.lr_schedule, min_lr_ratio=cfg.min_lr_ratio)
        self.compute_dtype = (model_cfg or ModelConfig()).compute_dtype  # autocast of every forward
        self.engine = TrainEngine(build_policy(model_path, model_cfg or ModelConfig()), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, lr_schedule=schedule)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """With LoRA the reference policy is this model with its adapters disabled: fill `ref_log_probs`."""
        if not is_lora(self.engine.model):
            raise RuntimeError("the actor serves the reference role only with LoRA adapters (model.lora.rank > 0).")
        with self.engine.model.disable_adapter():
            log_probs, _ = batch_log_probs(self.engine.model, batch, temperature=self.temperature,
                                           max_tokens=self.cfg.max_tokens_per_microbatch,
                                           chunk_size=self.cfg.logprob_chunk_size, compute_dtype=self.compute_dtype)
        return batch.replace(ref_log_probs=log_probs)

    def compute_log_prob(self, batch: Batch) -> Batch:
        """Fill `old_log_probs` [B, R] with the current policy's log-probs."""
        log_probs, _ = batch_log_probs(self.engine.model, batch, temperature=self.temperature,
                                       max_tokens=self.cfg.max_tokens_per_microbatch,
                                       chunk_size=self.cfg.logprob_chunk_size, compute_dtype=self.compute_dtype)
        return batch.replace(old_log_probs=log_probs)

    def update_policy(self, batch: Batch) -> dict[str, float]:
        """`epochs` x `minibatches` optimizer steps on this step's data; mean metrics over them."""
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(self.cfg.epochs):
            for minibatch in batch.split(self.cfg.minibatches):
                for k, v in self._minibatch_step(minibatch).items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        return {k: v / steps for k, v in totals.items()}

    def _minibatch_step(self, minibatch: Batch) -> dict[str, float]:
        metrics = self.accumulate_gradients(minibatch)
        metrics["actor/lr"] = self.engine.lr
        metrics["actor/grad_norm"] = self.engine.optimizer_step()
        return metrics

    def accumulate_gradients(self, minibatch: Batch) -> dict[str, float]:
        """Backprop the mini-batch's loss through token-budget micro-batches (no optimizer step).

        Each micro-batch's loss is divided by the mini-batch's GLOBAL token and sequence
        counts (summed over data-parallel ranks), so the accumulated gradient is the same for
        any micro-batch split and any world size.
        """
        num_tokens = global_sum(minibatch.response_mask.sum()).item()
        num_seqs = global_sum(len(minibatch)).item()
        microbatches, _ = split_by_tokens(minibatch, self.cfg.max_tokens_per_microbatch)

        def loss_fn(model: torch.nn.Module, mb: Batch) -> tuple[Tensor, dict[str, Tensor]]:
            return self._loss(model, mb, num_tokens, num_seqs)

        return self.engine.forward_backward(microbatches, loss_fn)

    def _loss(self, model: torch.nn.Module, mb: Batch, num_tokens: float, num_seqs: float
              ) -> tuple[Tensor, dict[str, Tensor]]:
        """This micro-batch's share of the mini-batch loss, and its share of each metric."""
        cfg, mask = self.cfg, mb.response_mask.float()
        log_probs, entropy = response_log_probs(
            model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
            temperature=self.temperature, chunk_size=cfg.logprob_chunk_size, with_entropy=True,
            entropy_grad=cfg.entropy_coeff > 0, compute_dtype=self.compute_dtype)
        # Strictly on-policy (one optimizer step per RL step) the ratio is exactly 1: the
        # controller skips the old-log-prob pass and the current log-probs stand in for it.
        old = mb.old_log_probs if mb.old_log_probs is not None else log_probs.detach()
        pg_mat, pg_metrics = call_with_available(
            self.policy_loss, log_probs=log_probs, old_log_probs=old, advantages=mb.advantages,
            response_mask=mask, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c)

        def agg(values: Tensor, mode: str = cfg.loss_agg_mode) -> Tensor:
            return aggregate_loss(values, mask, mode, num_tokens=num_tokens, num_seqs=num_seqs,
                                  horizon=self.horizon)

        metrics: dict[str, Tensor] = {}
        if cfg.rollout_is:
            # Truncated importance sampling: the rollout engine sampled from a slightly different
            # distribution than the trainer computes; reweight by min(pi_old / pi_rollout, cap).
            weights, is_metrics = truncated_is_weights(old, mb.rollout_log_probs, mask, level=cfg.rollout_is,
                                                       cap=cfg.rollout_is_cap)
            pg_mat = pg_mat * weights
            metrics.update({f"actor/{k}": v * mask.sum() / num_tokens for k, v in is_metrics.items()})  # token means
        pg_loss = agg(pg_mat)
        loss = pg_loss
        metrics.update({"actor/pg_loss": pg_loss.detach(), "actor/entropy": agg(entropy.detach(), "token-mean")})
        if cfg.entropy_coeff > 0:
            loss = loss - cfg.entropy_coeff * agg(entropy)
        if cfg.kl_coef > 0:
            kl_loss = agg(kl_penalty(log_probs, mb.ref_log_probs, cfg.kl_estimator))
            loss = loss + cfg.kl_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        for name, per_token in pg_metrics.items():
            metrics[f"actor/{name}"] = agg(per_token, "token-mean")
        return loss, metrics

    def save_checkpoint(self, folder: str) -> None:
        """Rank 0 writes the policy as an HF folder (weights, config, tokenizer) + optimizer state.
        Every rank calls it: gathering sharded weights is a collective."""
        self.engine.save(folder)
        if self.rank == 0:
            load_tokenizer(self.model_path).save_pretrained(folder)

    def load_checkpoint(self, folder: str) -> None:
        self.engine.load(folder)

    def named_weights(self) -> list[tuple[str, Tensor]]:
        """The policy's parameters, one (name, full tensor) at a time, for the rollout engine (LoRA: merged).
        Every rank calls it: gathering sharded weights is a collective."""
        return list(self.engine.named_weights())


def build_policy(model_path: str, cfg: ModelConfig) -> torch.nn.Module:
    """The trainable policy: the model in `model_path`, in `cfg.dtype`, with LoRA and/or gradient
    checkpointing when configured."""
    model = load_causal_lm(model_path, dtype=getattr(torch, cfg.dtype))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora.rank > 0:
        target = cfg.lora.target_modules
        model = add_lora(model, rank=cfg.lora.rank, alpha=cfg.lora.alpha,
                         target_modules=target[0] if target == ["all-linear"] else target)
    return model
