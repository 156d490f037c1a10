"""TRL's GRPOConfig fields, translated to grpoflow's config keys with their units converted.

The tables (`TRL_OURS`, `TRL_CONVERTED`, `TRL_NOT_APPLICABLE`, `TRL_MISSING`; the categories are the package's
docstring's), `translate_trl` and the conversions, TRL's batch-size checks (refused as TRL refuses them), and how a
TRL field or config is recognised (`is_trl_field`, `looks_like_trl`). Standard library only.
"""

from __future__ import annotations

from typing import Any, Callable

from grpoflow.config.foreign.translation import Translation, whole_size

TRL_OURS: dict[str, Any] = {
    "learning_rate": "actor.lr",
    "weight_decay": "actor.weight_decay",
    "warmup_steps": "actor.lr_warmup_steps",
    "lr_scheduler_type": ("actor.lr_schedule", {"constant": "constant", "cosine": "cosine", "linear": "linear",
                                                "constant_with_warmup": "constant"}),
    "max_grad_norm": "actor.grad_clip",
    "num_train_epochs": "trainer.total_epochs",
    "max_steps": "trainer.total_steps",
    "num_generations": "rollout.n",
    "max_completion_length": "rollout.max_new_tokens",
    "max_prompt_length": "data.max_prompt_length",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "beta": "actor.kl_coef",
    "epsilon": "actor.clip_ratio_low",
    "epsilon_high": "actor.clip_ratio_high",
    "loss_type": ("actor.loss_agg_mode", {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "bnpo": "token-mean",
                                          "dr_grpo": "seq-mean-token-sum-norm"}),
    "scale_rewards": ("algorithm.norm_adv_by_std", {"True": True, "False": False, "group": True, "none": False}),
    "num_iterations": "actor.epochs",
    "mask_truncated_completions": "actor.mask_truncated",
    "importance_sampling_level": ("actor.policy_loss", {"token": "ppo", "sequence": "gspo"}),
    "seed": "trainer.seed",
    "shuffle_dataset": "data.shuffle",
    "output_dir": "trainer.output_dir",
    "logging_steps": "trainer.log_every",
    "save_steps": "trainer.save_every",
    "eval_steps": "trainer.val_every",
    "run_name": "trainer.run_name",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "reward_weights": "reward.weights",
    "vllm_gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "vllm_tensor_parallel_size": "rollout.tensor_parallel_size",
}
TRL_CONVERTED = {
    "per_device_train_batch_size": "data.prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps "
                                   "/ num_generations; actor.max_tokens_per_microbatch = it x (max_prompt_length + "
                                   "max_completion_length)",
    "gradient_accumulation_steps": "(with per_device_train_batch_size) data.prompts_per_step",
    "steps_per_generation": "actor.minibatches = steps_per_generation / gradient_accumulation_steps",
    "generation_batch_size": "data.prompts_per_step = generation_batch_size / num_generations",
    "bf16": "model.compute_dtype=bfloat16 when true (float32 when false)",
    "use_vllm": "rollout.engine=vllm when true, hf when false",
    "report_to": "trainer.loggers",
    "vllm_importance_sampling_correction": "actor.rollout_is=token when true, off when false",
    "warmup_ratio": "actor.lr_warmup_steps = ratio x max_steps (with max_steps)",
}
TRL_NOT_APPLICABLE = {
    "use_cpu": "the device is found", "logging_dir": "the run folder", "dataloader_num_workers": "no data loader",
    "dataloader_pin_memory": "no data loader", "remove_unused_columns": "every column reaches the reward",
    "save_strategy": "trainer.save_every", "eval_strategy": "trainer.val_every", "logging_strategy": "every step",
    "push_to_hub": "no model hub", "hub_model_id": "no model hub", "overwrite_output_dir": "runs resume; use a new "
    "trainer.output_dir", "vllm_mode": "the engine runs colocated or split (placement)", "ddp_find_unused_parameters":
    "FSDP2 with backend=ray", "log_completions": "train_samples.jsonl always", "num_completions_to_print":
    "train_samples.jsonl", "model_init_kwargs": "the model folder's own config",
    "save_total_limit": "trainer.keep_last",
    "ds3_gather_for_generation": "no DeepSpeed",
    "torch_empty_cache_steps": "freed where needed", "disable_dropout": "dropout is off in RL (eval mode forward)",
}
TRL_MISSING = {
    "top_k": "no top-k sampling", "min_p": "no min-p sampling", "repetition_penalty": "no repetition penalty",
    "fp16": "bf16 or fp32 only", "adam_beta1": "AdamW's default betas", "adam_beta2": "AdamW's default betas",
    "adam_epsilon": "AdamW's default epsilon", "top_entropy_quantile": "no entropy-quantile masking",
    "delta": "no two-sided clipping bound", "sync_ref_model": "the reference is fixed",
}


def trl_category(key: str) -> str | None:
    if key in TRL_OURS:
        return "ours"
    if key in TRL_CONVERTED:
        return "converted"
    if key in TRL_NOT_APPLICABLE:
        return "n/a"
    if key in TRL_MISSING:
        return "missing"
    return None


def is_trl_field(key: str) -> bool:
    """A TRL GRPOConfig field name (no section: ours all have one)."""
    return "." not in key and trl_category(key) is not None


def looks_like_trl(data: dict) -> bool:
    """A YAML mapping of TRL GRPOConfig fields (flat), not of grpoflow sections."""
    return bool(data) and all(not isinstance(v, dict) for v in data.values()) and \
        any(trl_category(k) is not None for k in data)


# TRL's batch sizes: each a whole number of 1 or more (a 0 or null would divide by zero in the conversions)
TRL_SIZES = {"num_generations": "the completions per prompt", "per_device_train_batch_size": "completions per "
             "device and step", "gradient_accumulation_steps": "micro-steps per optimizer step",
             "steps_per_generation": "optimizer steps per generation", "generation_batch_size": "completions per "
             "generation"}


def _trl_sizes(fields: dict[str, Any], t: Translation) -> bool:
    """Whether TRL's batch sizes among `fields` are whole numbers >= 1 and, where a batch size is given (and so
    converted to data.prompts_per_step), fill whole groups (as TRL requires); each one that is not goes to
    `t.refused`."""
    checked = {k: whole_size(k, fields[k], t, what) for k, what in TRL_SIZES.items() if k in fields}
    sizes = {k: v for k, v in checked.items() if v is not None}
    if len(sizes) < len(checked):
        return False
    if not set(sizes) - {"num_generations"}:  # rollout.n alone: our data.prompts_per_step stays
        return True
    n = sizes.get("num_generations", 8)
    if "generation_batch_size" in sizes:
        batch, names = sizes["generation_batch_size"], "generation_batch_size"
    else:
        per_device = sizes.get("per_device_train_batch_size", 8)
        batch = per_device * sizes.get("steps_per_generation", sizes.get("gradient_accumulation_steps", 1))
        names = "per_device_train_batch_size x steps_per_generation"
    if batch % n:
        t.refused.append(f"{names} = {batch} completions is not a multiple of num_generations={n} (TRL refuses it "
                         f"too: every prompt's {n} completions must be in one generation batch): give a multiple.")
        return False
    return True


def translate_trl(fields: dict[str, Any]) -> Translation:
    """Our overrides for a GRPOConfig's fields (see TRL_OURS / TRL_CONVERTED). Sizes of 0, null, fractional or that
    do not fill whole groups are refused (`refused`), as TRL refuses them, and nothing is translated."""
    t = Translation()
    if not _trl_sizes(fields, t):
        return t

    def put(key: str, value: Any, source: str) -> None:
        t.overrides.append((key, value))
        t.renamed.append(f"{source} -> {key}={value}")

    for key, value in fields.items():
        category = trl_category(key)
        if category == "ours":
            target = TRL_OURS[key]
            if isinstance(target, tuple):
                new = target[1].get(str(value))
                if new is None:
                    t.missing.append(f"{key}={value} (no such value here)")
                else:
                    put(target[0], new, f"{key}={value}")
                    if key == "lr_scheduler_type" and value in ("linear", "cosine"):
                        put("actor.min_lr_ratio", 0.0, f"{key}={value}")  # transformers' schedules decay to 0
            elif key == "max_steps" and isinstance(value, int) and value <= 0:
                t.not_applicable.append(f"max_steps={value} (TRL's unset: num_train_epochs counts)")
            else:
                put(target, value, f"{key}={value}")
                if key == "epsilon" and "epsilon_high" not in fields:
                    put("actor.clip_ratio_high", value, f"{key}={value}")
        elif category != "converted":
            t.set_aside(key, value, category, TRL_MISSING)
    _convert_trl(fields, put, t)
    return t


def _convert_trl(f: dict[str, Any], put: Callable, t: Translation) -> None:
    n = int(f.get("num_generations", 8))
    per_device = int(f.get("per_device_train_batch_size", 8))
    accumulation = int(f.get("gradient_accumulation_steps", 1))
    steps_per_generation = int(f.get("steps_per_generation", accumulation))
    if "generation_batch_size" in f:
        put("data.prompts_per_step", max(1, int(f["generation_batch_size"]) // n), "generation_batch_size")
    elif {"per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation"} & set(f):
        put("data.prompts_per_step", max(1, per_device * steps_per_generation // n),
            "per_device_train_batch_size x steps_per_generation / num_generations")
    if "steps_per_generation" in f:
        put("actor.minibatches", max(1, steps_per_generation // accumulation), "steps_per_generation")
    if "per_device_train_batch_size" in f:
        seq = int(f.get("max_prompt_length") or 512) + int(f.get("max_completion_length", 256))
        put("actor.max_tokens_per_microbatch", per_device * seq, "per_device_train_batch_size")
    if "bf16" in f:
        put("model.compute_dtype", "bfloat16" if f["bf16"] in (True, "True", "true") else "float32", "bf16")
    if "use_vllm" in f:  # explicit either way: false is TRL's transformers generation, not rollout.engine=auto
        put("rollout.engine", "vllm" if f["use_vllm"] in (True, "True", "true") else "hf", "use_vllm")
    if "report_to" in f:
        names = f["report_to"] if isinstance(f["report_to"], list) else [f["report_to"]]
        kept = [x for x in names if x in ("wandb", "tensorboard", "mlflow")]
        put("trainer.loggers", ["console", "jsonl", *kept], "report_to")
    if "vllm_importance_sampling_correction" in f:
        on = f["vllm_importance_sampling_correction"] in (True, "True", "true")
        put("actor.rollout_is", "token" if on else "off", "vllm_importance_sampling_correction")
    if "warmup_ratio" in f:
        if "max_steps" in f:
            put("actor.lr_warmup_steps", int(float(f["warmup_ratio"]) * int(f["max_steps"])), "warmup_ratio")
        else:
            t.missing.append("warmup_ratio (a share of max_steps; give warmup_steps)")
