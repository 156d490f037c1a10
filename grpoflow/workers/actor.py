"""The actor role: the policy being trained.

Verbs: `compute_log_prob` (old log-probs, no grad), `compute_ref_log_prob` (LoRA: the adapter-free
model is the reference), `update_policy` (mini-batches x token-budget micro-batches, the loss of
`actor_loss`), and the weights for sync: `named_weights` (a stream, for a colocated engine) or
`open_weight_stream` + `next_weight_bucket` (buckets through the controller, for split engines).
The worker sees its data-parallel shard only; the global token/sequence counts that normalise the
loss are summed over ranks, so the gradient is the same for any world size or micro-batch split.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Iterator

import torch
from torch import Tensor

from grpoflow.algorithms import (POLICY_LOSSES, aggregate_loss, call_with_available, kl_penalty, mismatch_metrics,
                                 topk_forward_kl, truncated_is_weights)
from grpoflow.config import ActorConfig, ModelConfig
from grpoflow.data.batch import Batch
from grpoflow.models import attention
from grpoflow.models.exact import use_exact_attention
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.logprobs import response_log_probs
from grpoflow.models.lora import add_lora, is_lora
from grpoflow.plan.checks import RunParts
from grpoflow.models.topk import log_probs_at, response_log_softmax
from grpoflow.training.bf16_units import slow_bf16_warning
from grpoflow.training.budget import MIN_TOKENS
from grpoflow.training.collectives import max_over_ranks
from grpoflow.training.engine import TrainEngine, lr_multiplier
from grpoflow.training.microbatch import PaddingBatch
from grpoflow.training.forward import Counts, UpdateSchedule, accumulate_gradients, batch_log_probs, train_on_batch
from grpoflow.training.precision import Precision, role_precision
from grpoflow.training.timing import StageTimer

log = logging.getLogger("grpoflow.precision")
MISMATCH_MAX = "mismatch/abs_log_ratio_max"  # a max over micro-batches and ranks, not a sum of shares


class ActorWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, cfg: ActorConfig, temperature: float,
                 horizon: int, seed: int, total_optimizer_steps: int = 0, model_cfg: ModelConfig | None = None,
                 topk_kl_coef: float = 0.0, lora_sync: str = "merged", exact: bool = False,
                 parts: RunParts | None = None, tokenizer: Any = None) -> None:
        """`parts`: the run's resolved registry names (plan/checks.py; None, a worker built on its own: the policy
        loss is resolved here); `tokenizer`: `model_path`'s, loaded already (saved with each checkpoint; None:
        loaded then)."""
        torch.manual_seed(seed)
        self.rank, self.world_size = rank, world_size
        self.cfg, self.model_path = cfg, model_path
        self.temperature = temperature
        self.horizon = horizon  # max response length, the Dr.GRPO normaliser
        self.topk_kl_coef = topk_kl_coef  # distillation's top-k forward-KL term (distill.topk_coef; 0: off)
        self.lora_sync = lora_sync  # rollout.lora_sync: merged full weights, or the LoRA adapters only
        self.exact = exact  # rollout.exact: batch-invariant kernels, log-probs bitwise the engine's (models/exact.py)
        self.policy_loss = parts.policy_loss if parts is not None else POLICY_LOSSES.resolve(cfg.policy_loss)
        self.tokenizer = tokenizer
        # the controller resolves a budget of 0 (from memory, training.budget); built without it: the floor
        self.max_tokens = cfg.max_tokens_per_microbatch or MIN_TOKENS
        self.schedule = UpdateSchedule(cfg.minibatches, cfg.epochs, self.max_tokens)
        lr_schedule = partial(lr_multiplier, warmup_steps=cfg.lr_warmup_steps, total_steps=total_optimizer_steps,
                              schedule=cfg.lr_schedule, min_lr_ratio=cfg.min_lr_ratio)
        model_cfg = model_cfg or ModelConfig()
        # a bf16 compute copy, FSDP's mixed precision or autocast (training/precision.py)
        self.precision = role_precision("policy", dtype=model_cfg.dtype, compute_dtype=model_cfg.compute_dtype,
                                        sharded=world_size > 1, lora=model_cfg.lora.rank > 0,
                                        cuda=torch.cuda.is_available())
        self.compute_dtype = self.precision.compute_dtype
        # Sharded, only rank 0 reads the weights; the others build the model on the meta device and receive their
        # shards from it (one copy of the model in host memory, not one per rank).
        policy = build_policy(model_path, model_cfg, self.precision, meta=world_size > 1 and rank > 0, exact=exact)
        self.engine = TrainEngine(policy, lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                                  lr_schedule=lr_schedule, precision=self.precision, from_rank0=world_size > 1)
        device = next(self.engine.model.parameters()).device
        if rank == 0 and (slow := slow_bf16_warning(model_cfg.dtype, model_cfg.compute_dtype, device)):
            log.warning(slow)
        self._weights: Iterator[tuple[str, Tensor]] | None = None  # an open bucketed weight stream
        self.timer = StageTimer()  # the model math of the current update (update_policy starts a fresh one)
        self._mismatch_max = 0.0  # the largest |log-ratio| engine vs trainer in the current update

    def compute_ref_log_prob(self, batch: Batch) -> Tensor:
        """[B, R] reference log-probs: with LoRA the reference policy is this model with its adapters disabled."""
        if not is_lora(self.engine.model):
            raise RuntimeError("the actor serves the reference role only with LoRA adapters (model.lora.rank > 0).")
        with self.engine.forward_model().disable_adapter():  # type: ignore[operator]  # a PeftModel method
            return self.compute_log_prob(batch, nucleus=False)

    def compute_log_prob(self, batch: Batch, nucleus: bool = True) -> Tensor:
        """[B, R] the current policy's log-probs of the responses (0 on padding); under each sample's top-p nucleus
        where the engine recorded one (`nucleus`; the reference policy's are the full distribution's)."""
        log_probs, _ = batch_log_probs(self.engine.forward_model(), batch, temperature=self.temperature,
                                       max_tokens=self.max_tokens, chunk_size=self.cfg.logprob_chunk_size,
                                       compute_dtype=self.compute_dtype, nucleus=nucleus, exact=self.exact)
        return log_probs

    def update_policy(self, batch: Batch) -> dict[str, float]:
        """`epochs` x `minibatches` optimizer steps on this step's data; mean metrics over them, and this rank's
        seconds of model math in the update, summed over it: `timing_s/train_forward` (the log-prob forward),
        `timing_s/forward_backward` (that forward, the loss and backward) and `timing_s/optimizer` (clip + step)."""
        self.timer = StageTimer()
        self._mismatch_max = 0.0
        metrics = train_on_batch(self.engine, batch, self.schedule, self._loss, prefix="actor", timer=self.timer)
        return {**self._with_mismatch_max(metrics), **self.timer.metrics()}

    def accumulate_gradients(self, minibatch: Batch) -> dict[str, float]:
        """Backprop one mini-batch's loss, no optimizer step (what `update_policy` does per mini-batch)."""
        self._mismatch_max = 0.0
        return self._with_mismatch_max(accumulate_gradients(self.engine, minibatch, self._loss,
                                                            max_tokens=self.max_tokens))

    def _with_mismatch_max(self, metrics: dict[str, float]) -> dict[str, float]:
        """`metrics` with the largest |log-ratio| the micro-batches saw, over ranks (where the mismatch was
        measured: every rank then holds the summed `mismatch/*` keys, so all join the collective)."""
        if "mismatch/k3_kl" not in metrics:
            return metrics
        return {**metrics, MISMATCH_MAX: max_over_ranks(self._mismatch_max)}

    def _loss(self, model: torch.nn.Module, mb: Batch, counts: Counts) -> tuple[Tensor, dict[str, Tensor]]:
        """This micro-batch's share of the mini-batch loss, and its share of each metric."""
        cfg = self.cfg
        student_topk: Tensor | None = None
        entropy: Tensor | None
        with self.timer("train_forward"):
            if self.topk_kl_coef > 0 and mb.teacher_topk_ids is not None:  # full logits, for the teacher's top-k
                logp = response_log_softmax(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                                            mb.response_attention_mask, temperature=self.temperature,
                                            compute_dtype=self.compute_dtype)
                log_probs, entropy, student_topk = log_probs_at(logp, mb.response_ids, mb.teacher_topk_ids,
                                                                entropy_grad=cfg.entropy_coeff > 0)
            else:
                log_probs, entropy = response_log_probs(
                    model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_attention_mask,
                    temperature=self.temperature, chunk_size=cfg.logprob_chunk_size, with_entropy=True,
                    entropy_grad=cfg.entropy_coeff > 0, compute_dtype=self.compute_dtype, floors=mb.sampling_floors,
                    exact=self.exact)
        assert entropy is not None and mb.advantages is not None, "the update needs entropy and advantages"
        loss, metrics = actor_loss(
            self.policy_loss, log_probs=log_probs, entropy=entropy, old_log_probs=mb.old_log_probs,
            advantages=mb.advantages, ref_log_probs=mb.ref_log_probs, rollout_log_probs=mb.rollout_log_probs,
            response_mask=mb.response_mask.float(), num_tokens=counts.tokens, num_seqs=counts.seqs,
            horizon=self.horizon, loss_agg_mode=cfg.loss_agg_mode, clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c, rollout_is=cfg.rollout_is,
            rollout_is_cap=cfg.rollout_is_cap, entropy_coeff=cfg.entropy_coeff, kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator, teacher_topk_log_probs=mb.teacher_topk_log_probs,
            student_topk_log_probs=student_topk, topk_kl_coef=self.topk_kl_coef)
        worst = metrics.pop(MISMATCH_MAX, None)  # a max, not a share: kept aside from the summed metrics
        if worst is not None and not isinstance(mb, PaddingBatch):
            self._mismatch_max = max(self._mismatch_max, float(worst))
        return loss, metrics

    def save_checkpoint(self, folder: str) -> None:
        """Rank 0 writes the policy as an HF folder (weights, config, tokenizer) + optimizer state.
        Every rank calls it: gathering sharded weights is a collective."""
        self.engine.save(folder)
        if self.rank == 0:
            (self.tokenizer if self.tokenizer is not None else load_tokenizer(self.model_path)).save_pretrained(folder)

    def load_checkpoint(self, folder: str) -> None:
        self.engine.load(folder)

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The policy's parameters, one (name, full tensor) at a time, for a colocated rollout engine (LoRA:
        merged; with rollout.lora_sync=adapter the adapter tensors only). Every rank iterates it to the end:
        gathering a sharded tensor is a collective."""
        return self.engine.named_adapter_weights() if self.lora_sync == "adapter" else self.engine.named_weights()

    def open_weight_stream(self) -> None:
        """Start a bucketed weight stream (split placement: the weights travel through the controller)."""
        self._weights = self.named_weights()

    def next_weight_bucket(self, bucket_bytes: int, dtype: str = "float32") -> list[tuple[str, Tensor]]:
        """The next (name, tensor) pairs of the open stream, floating tensors cast to `dtype` (the rollout
        engine's: bfloat16 when computing in bf16, so half the bytes of the fp32 masters cross to the controller
        and the engines): tensors are added until the bucket holds at least `bucket_bytes` in that dtype (or the
        stream ends); [] once it is exhausted. Every rank calls it (a collective when sharded); the controller
        keeps rank 0's bucket. Tensors are cast on the actor's device, then moved to the CPU."""
        if self._weights is None:
            raise RuntimeError("next_weight_bucket before open_weight_stream.")
        wire = getattr(torch, dtype)
        bucket: list[tuple[str, Tensor]] = []
        size = 0  # counted on every rank alike, so all ranks end each bucket at the same tensor
        for name, tensor in self._weights:
            if tensor.is_floating_point():
                tensor = tensor.to(wire)
            if self.rank == 0:  # the only rank whose bucket the controller keeps
                bucket.append((name, tensor.cpu()))
            size += tensor.numel() * tensor.element_size()
            if size >= bucket_bytes:
                return bucket
        return bucket  # the last one; the stream is exhausted, so the next call returns []


def actor_loss(policy_loss, *, log_probs: Tensor, entropy: Tensor, old_log_probs: Tensor | None,
               advantages: Tensor, ref_log_probs: Tensor | None, rollout_log_probs: Tensor | None,
               response_mask: Tensor, num_tokens: float, num_seqs: float, horizon: int, loss_agg_mode: str,
               clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float, rollout_is: str | None,
               rollout_is_cap: float, entropy_coeff: float, kl_coef: float, kl_estimator: str,
               teacher_topk_log_probs: Tensor | None = None, student_topk_log_probs: Tensor | None = None,
               topk_kl_coef: float = 0.0) -> tuple[Tensor, dict[str, Tensor]]:
    """The actor's objective on one micro-batch: a pure function of per-token tensors [b, R].

        loss = agg(w * pg) - entropy_coeff * agg(entropy) + kl_coef * agg(kl(log_probs, ref_log_probs))
               + topk_kl_coef * agg(topk_forward_kl(teacher_topk_log_probs, student_topk_log_probs))

    `pg` is the per-token policy loss (`policy_loss`, e.g. PPO's clipped surrogate); `w` the truncated
    importance weight min(pi_old / pi_rollout, cap) when `rollout_is` is token/sequence, else 1;
    `agg` the configured aggregation (`loss_agg_mode`) normalised by the mini-batch's GLOBAL counts
    `num_tokens` / `num_seqs`, so micro-batch losses add up to the mini-batch's. Strictly on-policy
    (`old_log_probs` None: one optimizer step per RL step) the ratio is exactly 1 and the detached
    current log-probs stand in for the old ones. The last term is on-policy distillation's top-k forward KL
    (`[b, R, k]` teacher and student log-probs of the teacher's k likeliest tokens). Metrics are this
    micro-batch's share of token means (`actor/entropy`, `actor/pg_clipfrac`, ..., and `mismatch/*` between
    `old` and the engine's `rollout_log_probs`, whatever `rollout_is`) and of `actor/pg_loss`, `actor/kl_loss`;
    `mismatch/abs_log_ratio_max` is this micro-batch's own max, not a share (the caller takes the max).
    """
    mask = response_mask
    old = old_log_probs if old_log_probs is not None else log_probs.detach()
    pg_mat, pg_metrics = call_with_available(
        policy_loss, log_probs=log_probs, old_log_probs=old, advantages=advantages, response_mask=mask,
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c)

    def agg(values: Tensor, mode: str = loss_agg_mode) -> Tensor:
        return aggregate_loss(values, mask, mode, num_tokens=num_tokens, num_seqs=num_seqs, horizon=horizon)

    metrics: dict[str, Tensor] = {}
    if rollout_log_probs is not None:  # every engine reports them: the mismatch is measured on every run
        share = mask.sum() / max(num_tokens, 1.0)  # no token to measure (all masked): 0, not 0/0
        for k, v in mismatch_metrics(old, rollout_log_probs, mask, clip_ratio_low=clip_ratio_low,
                                     clip_ratio_high=clip_ratio_high).items():
            metrics[k] = v if k == MISMATCH_MAX else v * share
    if rollout_is in ("token", "sequence"):
        # The rollout engine sampled from a slightly different distribution than the trainer computes
        # (or an older policy, in async mode): reweight by min(pi_old / pi_rollout, cap).
        if rollout_log_probs is None:
            raise ValueError(f"rollout_is={rollout_is} needs the rollout engine's sampling log-probs.")
        weights, is_metrics = truncated_is_weights(old, rollout_log_probs, mask, level=rollout_is, cap=rollout_is_cap)
        pg_mat = pg_mat * weights
        metrics.update({f"actor/{k}": v * mask.sum() / num_tokens for k, v in is_metrics.items()})  # token means
    pg_loss = agg(pg_mat)
    loss = pg_loss
    metrics.update({"actor/pg_loss": pg_loss.detach(), "actor/entropy": agg(entropy.detach(), "token-mean")})
    if entropy_coeff > 0:
        loss = loss - entropy_coeff * agg(entropy)
    if kl_coef > 0:
        if ref_log_probs is None:
            raise ValueError("kl_coef > 0 needs the reference policy's log-probs.")
        kl_loss = agg(kl_penalty(log_probs, ref_log_probs, kl_estimator))
        loss = loss + kl_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach()
    if topk_kl_coef > 0 and student_topk_log_probs is not None:
        if teacher_topk_log_probs is None:
            raise ValueError("topk_kl_coef > 0 needs the teacher's top-k log-probs.")
        topk_loss = agg(topk_forward_kl(teacher_topk_log_probs, student_topk_log_probs))
        loss = loss + topk_kl_coef * topk_loss
        metrics["actor/distill_topk_kl"] = topk_loss.detach()
    for name, per_token in pg_metrics.items():
        metrics[f"actor/{name}"] = agg(per_token, "token-mean")
    return loss, metrics


def build_policy(model_path: str, cfg: ModelConfig, precision: Precision, *, meta: bool = False,
                 exact: bool = False) -> torch.nn.Module:
    """The trainable policy: the model in `model_path`, in `precision.weights`, with LoRA and/or gradient
    checkpointing when configured (and grouped attention where `precision` says: on a CPU; `exact`: the
    batch-invariant attention of models/exact.py). `meta`: on the meta device, its weights to come from rank 0
    (FSDP ranks other than 0)."""
    model = load_causal_lm(model_path, dtype=precision.weights, meta=meta)
    if exact:
        use_exact_attention(model)
    elif precision.grouped_attention:
        attention.use_grouped_attention(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora.rank > 0:
        target = cfg.lora.target_modules
        model = add_lora(model, rank=cfg.lora.rank, alpha=cfg.lora.alpha,
                         target_modules=target[0] if target == ["all-linear"] else target)
    return model
