"""verl's Hydra keys and TRL's GRPOConfig fields, translated to grpoflow's config keys with their units converted.

A verl run script's `key=value` arguments can be given to `grpoflow train` as they are (mixed with ours), and a
TRL GRPOConfig as a YAML file of its fields (`grpoflow train trl_config.yaml`); `grpoflow translate verl run.sh`
and `grpoflow translate trl config.yaml` print the equivalent grpoflow command instead. Each foreign key is:

    ours       the same setting under our name (a value map where the names differ: kl -> k1, ...)
    converted  computed from several keys or with other units (mini-batch size -> count, micro-batch sizes -> a
               token budget, epochs -> steps from the dataset size, ...)
    n/a        nothing to set here (GPU memory layout, offloading, logging back-ends' names, ...): listed in one
               note, never refused one at a time
    missing    a setting grpoflow does not have: listed in one warning, so nothing passes silently

`docs/migrating.md` holds both tables and tests/unit/test_foreign_keys.py walks every row of them through this
module and the config. Standard library only (the config's layer): nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# ---------------------------------------------------------------- verl

VERL_KL = {"kl": "k1", "k1": "k1", "abs": None, "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3",
           "full": None, "k3+": "k3+", "low_var_kl+": "k3+"}
VERL_PREFIXES = ("actor_rollout_ref.", "custom_reward_function.", "reward_model.")

# verl key -> our key (same meaning and unit); a tuple (our key, value map) where the values differ
VERL_OURS: dict[str, Any] = {
    "algorithm.adv_estimator": "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std",
    "algorithm.gamma": "algorithm.gamma",
    "algorithm.lam": "algorithm.lam",
    "algorithm.use_kl_in_reward": "algorithm.use_kl_in_reward",
    "algorithm.kl_penalty": ("algorithm.kl_penalty", VERL_KL),
    "algorithm.kl_ctrl.type": "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl_ctrl.kl_coef",
    "algorithm.kl_ctrl.target_kl": "algorithm.kl_ctrl.target_kl",
    "algorithm.kl_ctrl.horizon": "algorithm.kl_ctrl.horizon",
    "algorithm.filter_groups.enable": "algorithm.filter_groups.enable",
    "algorithm.filter_groups.max_num_gen_batches": "algorithm.filter_groups.max_draws",
    "data.train_files": "data.train_files",
    "data.val_files": "data.val_files",
    "data.prompt_key": "data.prompt_key",
    "data.train_batch_size": "data.prompts_per_step",
    "data.val_batch_size": "rollout.val_batch_size",
    "data.max_prompt_length": "data.max_prompt_length",
    "data.max_response_length": "rollout.max_new_tokens",
    "data.seed": "trainer.seed",
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "model.gradient_checkpointing",
    "actor_rollout_ref.model.lora_rank": "model.lora.rank",
    "actor_rollout_ref.model.lora_alpha": "model.lora.alpha",
    "actor_rollout_ref.model.target_modules": "model.lora.target_modules",
    "actor_rollout_ref.actor.optim.lr": "actor.lr",
    "actor_rollout_ref.actor.optim.weight_decay": "actor.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "actor.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.min_lr_ratio": "actor.min_lr_ratio",
    "actor_rollout_ref.actor.optim.warmup_style": ("actor.lr_schedule", {"constant": "constant", "cosine": "cosine"}),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": ("actor.lr_schedule",
                                                        {"constant": "constant", "cosine": "cosine"}),
    "actor_rollout_ref.actor.ppo_epochs": "actor.epochs",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "actor.max_tokens_per_microbatch",
    "actor_rollout_ref.actor.clip_ratio_low": "actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c": "actor.clip_ratio_c",
    "actor_rollout_ref.actor.grad_clip": "actor.grad_clip",
    "actor_rollout_ref.actor.loss_agg_mode": "actor.loss_agg_mode",
    "actor_rollout_ref.actor.entropy_coeff": "actor.entropy_coeff",
    "actor_rollout_ref.actor.kl_loss_type": ("actor.kl_estimator", VERL_KL),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("actor.policy_loss", {"vanilla": "ppo", "gspo": "gspo",
                                                                            "cispo": "cispo"}),
    "actor_rollout_ref.rollout.name": ("rollout.engine", {"vllm": "vllm", "sglang": "sglang", "hf": "hf"}),
    "actor_rollout_ref.rollout.n": "rollout.n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "rollout.tensor_parallel_size",
    "actor_rollout_ref.rollout.enforce_eager": "rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine": "rollout.free_cache_engine",
    "actor_rollout_ref.rollout.val_kwargs.temperature": "rollout.val_temperature",
    "actor_rollout_ref.rollout.val_kwargs.n": "rollout.val_n",
    "reward_model.model.path": "reward.model.path",
    "critic.optim.lr": "critic.lr",
    "critic.model.path": "critic.model_path",
    "critic.cliprange_value": "critic.cliprange_value",
    "critic.grad_clip": "critic.grad_clip",
    "trainer.total_training_steps": "trainer.total_steps",
    "trainer.total_epochs": "trainer.total_epochs",
    "trainer.val_before_train": "trainer.val_before_train",
    "data.shuffle": "data.shuffle",
    "trainer.project_name": "trainer.project",
    "trainer.experiment_name": "trainer.run_name",
    "trainer.critic_warmup": "critic.warmup_steps",
    "trainer.default_local_dir": "trainer.output_dir",
    "trainer.log_val_generations": "trainer.log_samples",
}

# verl keys computed from several keys or with other units: key -> what it becomes (for the tables)
VERL_CONVERTED = {
    "actor_rollout_ref.actor.ppo_mini_batch_size": "actor.minibatches = data.train_batch_size / ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "actor.max_tokens_per_microbatch = it x "
                                                            "(max_prompt_length + max_response_length)",
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor.max_tokens_per_microbatch (as _per_gpu)",
    "actor_rollout_ref.actor.use_kl_loss": "actor.kl_coef = kl_loss_coef when true, 0 when false",
    "actor_rollout_ref.actor.kl_loss_coef": "actor.kl_coef (with use_kl_loss=True)",
    "actor_rollout_ref.actor.clip_ratio": "actor.clip_ratio_low and actor.clip_ratio_high",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "actor.lr_warmup_steps = ratio x total steps "
                                                           "(with trainer.total_training_steps)",
    "actor_rollout_ref.rollout.val_kwargs.do_sample": "rollout.val_temperature=0 when false",
    "data.filter_overlong_prompts": "data.overlong=drop when true",
    "data.truncation": "data.overlong=error for 'error' (without filter_overlong_prompts)",
    "custom_reward_function.path": "reward.function = path:name",
    "custom_reward_function.name": "reward.function = path:name (default compute_score)",
    "reward_model.enable": "reward.model.path is used only when true",
    "trainer.test_freq": "trainer.val_every (-1: 0, never)",
    "trainer.save_freq": "trainer.save_every (-1: 0, never)",
    "trainer.logger": "trainer.loggers (console, wandb, tensorboard, mlflow; console always)",
    "trainer.resume_mode": "trainer.resume (auto -> auto, disable -> never)",
}

# verl keys with nothing to set here, and why
VERL_NOT_APPLICABLE_PREFIXES = {
    "actor_rollout_ref.actor.fsdp_config.": "FSDP2 sharding is automatic with backend=ray",
    "actor_rollout_ref.ref.fsdp_config.": "FSDP2 sharding is automatic with backend=ray",
    "critic.model.fsdp_config.": "FSDP2 sharding is automatic with backend=ray",
    "actor_rollout_ref.actor.checkpoint.": "checkpoints always hold model, optimizer and RNG state",
    "actor_rollout_ref.rollout.engine_kwargs.": "engine-specific",
    "actor_rollout_ref.rollout.agent.": "agent loops are rollout.agent.program here",
}
VERL_NOT_APPLICABLE = {
    "actor_rollout_ref.model.use_remove_padding": "micro-batches are packed by a token budget",
    "actor_rollout_ref.model.use_shm": "models load from a local folder",
    "actor_rollout_ref.model.trust_remote_code": "local folders only",
    "actor_rollout_ref.model.external_lib": "local folders only",
    "actor_rollout_ref.model.use_fused_kernels": "the HF model's own kernels",
    "actor_rollout_ref.hybrid_engine": "placement=colocated is the hybrid engine",
    "actor_rollout_ref.actor.strategy": "FSDP2 with backend=ray",
    "actor_rollout_ref.actor.use_dynamic_bsz": "micro-batches are always formed by a token budget",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "no sequence parallelism",
    "actor_rollout_ref.actor.use_torch_compile": "eager",
    "actor_rollout_ref.actor.shuffle": "mini-batches hold whole groups in order",
    "actor_rollout_ref.actor.optim.total_training_steps": "set by verl itself",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "the no-grad forward uses the token budget",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "the no-grad forward uses the token budget",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "the no-grad forward uses the token budget",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "the no-grad forward uses the token budget",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "the no-grad forward uses the token budget",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "the no-grad forward uses the token budget",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "the no-grad forward uses the token budget",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "the no-grad forward uses the token budget",
    "actor_rollout_ref.rollout.load_format": "weights are synced in memory",
    "actor_rollout_ref.rollout.layered_summon": "weights are synced in buckets",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "engine default",
    "actor_rollout_ref.rollout.max_num_seqs": "engine default",
    "actor_rollout_ref.rollout.enable_chunked_prefill": "engine default",
    "actor_rollout_ref.rollout.dtype": "model.compute_dtype decides",
    "actor_rollout_ref.rollout.mode": "one rollout path (sync or async by trainer.mode)",
    "actor_rollout_ref.rollout.prompt_length": "from data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "from data.max_response_length",
    "actor_rollout_ref.rollout.ignore_eos": "sampling stops at EOS",
    "reward_model.reward_manager": "one scorer (naive); rewards run in worker processes with reward.workers",
    "reward_model.micro_batch_size_per_gpu": "reward.model.batch_size",
    "reward_model.micro_batch_size": "reward.model.batch_size",
    "data.return_raw_chat": "chat prompts are always kept",
    "data.return_raw_input_ids": "always",
    "data.tokenizer": "the model's tokenizer",
    "trainer.n_gpus_per_node": "this machine's device with backend=local; for more ranks give backend=ray "
                               "resources.devices_per_node=N",
    "trainer.nnodes": "backend=ray resources.nodes=N",
    "trainer.device": "the device is found",
    "trainer.balance_batch": "micro-batches are balanced by tokens",
    "trainer.ray_wait_register_center_timeout": "ray.start_timeout_s",
    "trainer.del_local_ckpt_after_load": "checkpoints are kept (trainer.keep_last)",
    "trainer.max_actor_ckpt_to_keep": "trainer.keep_last",
    "trainer.max_critic_ckpt_to_keep": "trainer.keep_last",
    "critic.ppo_micro_batch_size_per_gpu": "micro-batches by token budget",
    "critic.ppo_mini_batch_size": "the critic steps with the actor's mini-batches",
    "critic.strategy": "FSDP2 with backend=ray",
}
VERL_MISSING = {
    "actor_rollout_ref.rollout.top_k": "no top-k sampling (top_p only)",
    "actor_rollout_ref.rollout.val_kwargs.top_p": "validation samples with rollout.top_p",
    "actor_rollout_ref.rollout.val_kwargs.top_k": "no top-k sampling",
    "algorithm.filter_groups.metric": "groups are filtered by their score",
}


def is_verl_key(key: str) -> bool:
    """A key of verl's config that is not also ours (verl's prefixes, or a key in the tables)."""
    target = VERL_OURS.get(key)
    same = key == (target[0] if isinstance(target, tuple) else target)  # also ours: our values (kl_penalty=k1)
    return key.startswith(VERL_PREFIXES) or key in VERL_CONVERTED or key in VERL_NOT_APPLICABLE or \
        key in VERL_MISSING or (target is not None and not same) or \
        key.startswith(tuple(VERL_NOT_APPLICABLE_PREFIXES))


def verl_category(key: str) -> str | None:
    """ours, converted, n/a or missing; None: not a verl key we know."""
    if key in VERL_OURS:
        return "ours"
    if key in VERL_CONVERTED:
        return "converted"
    if key in VERL_NOT_APPLICABLE or key.startswith(tuple(VERL_NOT_APPLICABLE_PREFIXES)):
        return "n/a"
    if key in VERL_MISSING:
        return "missing"
    return None


@dataclass
class Translation:
    """Our `key=value` pairs for foreign ones, and what could not be carried over."""
    overrides: list[tuple[str, Any]] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)          # "theirs -> ours" lines
    not_applicable: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)          # values no run can take: one sentence each
    defaults: list[tuple[str, Any]] = field(default_factory=list)  # set only where no layer sets the key

    def set_aside(self, key: str, value: Any, category: str | None, missing: dict[str, str]) -> None:
        """Record a key that sets nothing here: n/a, missing (with why, from `missing`) or unknown (None)."""
        if category == "n/a":
            self.not_applicable.append(key)
        elif category == "missing":
            self.missing.append(f"{key}={value} ({missing[key]})")
        else:
            self.unknown.append(key)

    def note(self, framework: str) -> str:
        """The one-line notes a run prints about the foreign keys it took."""
        lines = []
        if self.renamed:
            lines.append(f"{framework} keys read as grpoflow's: {', '.join(self.renamed)}")
        if self.not_applicable:
            lines.append(f"{framework} keys with nothing to set here (ignored): {', '.join(self.not_applicable)}")
        if self.missing:
            lines.append(f"WARNING: {framework} settings grpoflow does not have (ignored): {', '.join(self.missing)}")
        return "\n".join(lines)


def _mapped(key: str, value: Any) -> tuple[str, Any] | None:
    target = VERL_OURS[key]
    if isinstance(target, tuple):
        ours, values = target
        new = values.get(str(value)) if isinstance(value, (str, bool)) else None
        return (ours, new) if new is not None else None
    return target, value


def translate_verl(pairs: list[tuple[str, Any]], ours: dict[str, Any] | None = None) -> Translation:
    """Our overrides for verl `key=value` pairs (in order). `ours`: the grpoflow keys given beside them (their
    values take part in conversions, e.g. data.prompts_per_step for ppo_mini_batch_size)."""
    t, given = Translation(), dict(pairs)
    known = {**(ours or {})}

    def put(key: str, value: Any, source: str) -> None:
        t.overrides.append((key, value))
        known[key] = value
        t.renamed.append(f"{source} -> {key}={value}")

    for key, value in pairs:
        category = verl_category(key)
        if category == "ours":
            mapped = _mapped(key, value)
            if mapped is None:
                t.missing.append(f"{key}={value} (no such value here)")
            elif mapped[0] == key:
                t.overrides.append(mapped)
                known[key] = value
            else:
                put(*mapped, key)
        elif category != "converted":
            t.set_aside(key, value, category, VERL_MISSING)
    for key, value in given.items():  # a key given twice converts once, with its later value (Hydra's rule;
        if verl_category(key) == "converted":  # verl scripts append `$@` after their own values)
            _convert_verl(key, value, given, known, put, t)
    if {"trainer.project_name", "trainer.experiment_name"} & set(given) and "trainer.default_local_dir" not in given:
        project, experiment = given.get("trainer.project_name", "verl_examples"), \
            given.get("trainer.experiment_name", "gsm8k")  # verl's defaults
        t.defaults.append(("trainer.output_dir", f"checkpoints/{project}/{experiment}"))  # verl's default_local_dir
    return t


def whole_size(key: str, value: Any, t: Translation, what: str) -> int | None:
    """`value` as a size of 1 or more, or None with a sentence in `t.refused` naming `key` (`what`: its meaning)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    shown = "null" if value is None else value
    t.refused.append(f"{key}={shown} is not a size: {what} must be a whole number of 1 or more.")
    return None


def _convert_verl(key: str, value: Any, given: dict, known: dict, put: Callable, t: Translation) -> None:
    a = "actor_rollout_ref.actor."
    if key == a + "ppo_mini_batch_size":
        prompts = known.get("data.prompts_per_step", 1024)  # verl's default train_batch_size
        size = whole_size(key, value, t, "verl's mini-batch size in prompts")
        if size is not None and int(prompts) % size:
            t.refused.append(f"{key}={size} does not divide data.train_batch_size={prompts} (verl splits a step's "
                             f"prompts into mini-batches of this many): give a divisor of {prompts}.")
        elif size is not None:
            put("actor.minibatches", int(prompts) // size, f"{key}={value}")
    elif key in (a + "ppo_micro_batch_size_per_gpu", a + "ppo_micro_batch_size"):
        if whole_size(key, value, t, "verl's micro-batch size in samples") is None:
            return
        if given.get(a + "use_dynamic_bsz") in (True, "True", "true") or a + "ppo_max_token_len_per_gpu" in given:
            return  # the token budget is given as it is
        seq = int(known.get("data.max_prompt_length", 512)) + int(known.get("rollout.max_new_tokens", 512))
        put("actor.max_tokens_per_microbatch", int(value) * seq, f"{key}={value}")
    elif key == a + "use_kl_loss":
        coef = given.get(a + "kl_loss_coef", 0.001) if value in (True, "True", "true") else 0.0
        put("actor.kl_coef", float(coef), f"{key}={value}")
    elif key == a + "kl_loss_coef":
        if a + "use_kl_loss" not in given:
            t.not_applicable.append(f"{key} (without use_kl_loss=True verl adds no KL loss)")
    elif key == a + "clip_ratio":
        put("actor.clip_ratio_low", value, f"{key}={value}")
        put("actor.clip_ratio_high", value, f"{key}={value}")
    elif key == a + "optim.lr_warmup_steps_ratio":
        total = known.get("trainer.total_steps")
        if total is None:
            t.missing.append(f"{key}={value} (a ratio of steps; give actor.lr_warmup_steps)")
        else:
            put("actor.lr_warmup_steps", int(float(value) * int(total)), f"{key}={value}")
    elif key == "actor_rollout_ref.rollout.val_kwargs.do_sample":
        if value in (False, "False", "false"):
            put("rollout.val_temperature", 0.0, f"{key}={value}")
    elif key == "data.filter_overlong_prompts":
        if value in (True, "True", "true"):
            put("data.overlong", "drop", f"{key}={value}")
    elif key == "data.truncation":
        if value == "error" and given.get("data.filter_overlong_prompts") not in (True, "True", "true"):
            put("data.overlong", "error", f"{key}={value}")
        elif value != "error":
            t.missing.append(f"{key}={value} (prompts over data.max_prompt_length are dropped, not cut)")
    elif key == "custom_reward_function.path":
        put("reward.function", f"{value}:{given.get('custom_reward_function.name', 'compute_score')}",
            f"{key}={value}")
    elif key == "custom_reward_function.name":
        if "custom_reward_function.path" not in given:
            t.not_applicable.append(f"{key} (without custom_reward_function.path)")
    elif key == "reward_model.enable":
        if value in (False, "False", "false") and "reward_model.model.path" in given:
            known.pop("reward.model.path", None)
            t.overrides[:] = [(k, v) for k, v in t.overrides if k != "reward.model.path"]
    elif key in ("trainer.test_freq", "trainer.save_freq"):
        ours = "trainer.val_every" if key == "trainer.test_freq" else "trainer.save_every"
        put(ours, max(0, int(value)), f"{key}={value}")
    elif key == "trainer.logger":
        names = value if isinstance(value, list) else [value]
        kept = [n for n in names if n in ("console", "wandb", "tensorboard", "mlflow")]
        dropped = [n for n in names if n not in kept]
        put("trainer.loggers", sorted({"console", "jsonl", *kept}, key=["console", "jsonl", *kept].index),
            f"{key}={value}")
        if dropped:
            t.missing.append(f"{key}: {dropped} (loggers here: console, jsonl, wandb, tensorboard, mlflow)")
    elif key == "trainer.resume_mode":
        mode = {"auto": "auto", "disable": "never"}.get(str(value))
        if mode is None:
            t.missing.append(f"{key}={value} (give trainer.resume=<checkpoint folder>)")
        else:
            put("trainer.resume", mode, f"{key}={value}")


# ---------------------------------------------------------------- TRL

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
