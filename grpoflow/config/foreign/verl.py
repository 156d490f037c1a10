"""verl's Hydra keys, translated to grpoflow's config keys with their units converted.

The tables (`VERL_OURS`, `VERL_CONVERTED`, `VERL_NOT_APPLICABLE`, `VERL_MISSING`; the categories are the package's
docstring's), `translate_verl` and the conversions, verl's KL estimator names (`VERL_KL`, which the config check
names), verl's sections read as ours for the unknown-key hint (`VERL_SECTIONS`) and what grpoflow has for verl's
multi-turn and agent keys (`foreign_hint`). Standard library only.
"""

from __future__ import annotations

from typing import Any, Callable

from grpoflow.config.foreign.translation import Translation, whole_size

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

# verl's sections, read as ours when the unknown-key error looks for the closest valid key
VERL_SECTIONS = {"actor_rollout_ref.actor.": "actor.", "actor_rollout_ref.rollout.": "rollout.",
                 "actor_rollout_ref.model.": "model.", "actor_rollout_ref.ref.": "actor."}
# verl's actor_rollout_ref.rollout.multi_turn.* / .agent.* names -> what grpoflow has instead
VERL_SECTION_KEYS: dict[str, str] = {
    "rollout.multi_turn.enable": "has no counterpart: multi-turn is on when rollout.multi_turn.env or "
                                 "rollout.multi_turn.tools is set",
    "rollout.multi_turn.max_assistant_turns": "is `rollout.multi_turn.max_turns` here",
    "rollout.multi_turn.max_user_turns": "has no counterpart: the environment answers each model turn, so "
                                         "rollout.multi_turn.max_turns bounds both",
    "rollout.multi_turn.format": "is `rollout.multi_turn.tool_parser` here",
    "rollout.multi_turn.max_parallel_calls": "is `rollout.multi_turn.max_tool_calls_per_turn` here",
    "rollout.multi_turn.max_tool_response_length": "is `rollout.multi_turn.max_tool_output_tokens` here (tokens; a "
                                                   "longer result is replaced by an error message, not cut)",
    "rollout.multi_turn.tool_config_path": "is `rollout.multi_turn.tools` here (a list of tool names or "
                                           "path/to/file.py:function, no YAML file)",
    "rollout.multi_turn.interaction_config_path": "is `rollout.multi_turn.env` (+ `env_args`) here",
    "rollout.agent.agent_loop_config_path": "is `rollout.agent.program` here (one program: path/to/file.py:run or "
                                            "verifiers)",
}


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


def looks_like_verl(data: dict) -> bool:
    """A YAML mapping in verl's sections (a verl config), not grpoflow's."""
    return any(k in data for k in ("actor_rollout_ref", "custom_reward_function", "reward_model"))


def foreign_hint(key: str) -> str | None:
    """What grpoflow has for a verl key under rollout.multi_turn / rollout.agent (None: not a verl key)."""
    ours = VERL_SECTION_KEYS.get(key)
    if ours is None:
        return None
    return f" verl's `actor_rollout_ref.{key}` {ours} (docs/multi-turn.md, 'Coming from verl or SkyRL')."
