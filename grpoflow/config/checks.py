"""The config's checks: every value and combination that can be judged without a model or a registry.

`check_config_values(cfg)` raises one `ConfigError` naming the key and the fix. It is pure: it never changes `cfg`. The
keys whose default depends on other keys (`actor.rollout_is`) are resolved before it, once, by loading.py
(`resolve_defaults`, which `load_config` and `saved_config` call); an unresolved one is an error here.

The start-up check of a run is wider: `grpoflow.plan.checks.check_config` runs `check_config_values`, then
resolves every registry-backed name (estimators, losses, rewards, engines, environments, tools, agents; user files
are imported there), keeps what they resolve to (`RunParts`: nothing looks a name up again) and marks the config
checked (`mark_checked`). It runs once per command that starts a run, at the edge (grpoflow/plan/); the controller
only asks `require_checked` instead of checking again. (`check_config_values` alone also runs in `load_config`, so
that a typo fails before torch is imported: pure and cheap.)

`batch_schedule` resolves the batch algebra of one step (docs/architecture.md, "One step's dataflow") and refuses
what does not divide.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpoflow.config.foreign.verl import VERL_KL
from grpoflow.config.schema import (AgentConfig, Config, ConfigError, CurriculumConfig, DistillConfig, JudgeConfig,
                                    MultiTurnConfig, TinkerConfig, world_size)

# A Config instance's attribute (not a field: never in config.yaml) holding its values as they were when the
# start-up check passed; a config changed since, or rebuilt with dataclasses.replace, is no longer checked.
_CHECKED_AS = "_checked_as"


def mark_checked(cfg: Config) -> None:
    """Record that `cfg`, with the values it holds now, passed the full start-up check (`check_config` calls this
    last)."""
    object.__setattr__(cfg, _CHECKED_AS, cfg.to_dict())


def is_checked(cfg: Config) -> bool:
    """`cfg` passed the start-up check and has not changed since."""
    return getattr(cfg, _CHECKED_AS, None) == cfg.to_dict()


def require_checked(cfg: Config, who: str) -> None:
    """Refuse a config that did not pass the start-up check (or changed after it): `who` takes a checked one."""
    if not is_checked(cfg):
        changed = " or was changed after it" if hasattr(cfg, _CHECKED_AS) else ""
        raise ValueError(f"{who} was given a config that has not passed the start-up check{changed}: call "
                         "grpoflow.plan.checks.check_config(cfg) on the final config first, as `grpoflow "
                         "train` does.")


def keep_checked(source: Config, derived: Config) -> Config:
    """`derived` (a copy of `source` with a resolved value that every check accepts) marked checked if `source`
    was; for loading.resolve_total_steps."""
    if is_checked(source):
        mark_checked(derived)
    return derived


def check_config_values(cfg: Config) -> None:
    """The checks that need no model and no registry: choices, ranges, combinations and the batch schedule.
    Never changes `cfg`; its dependent defaults must be resolved (loading.resolve_defaults). Registry-backed names
    (estimators, losses, KL estimators, rewards, engines) are resolved by
    `grpoflow.plan.checks.check_config`, also before any model loads."""
    checks = [
        (cfg.backend in ("local", "ray"), f"backend={cfg.backend!r}; use local or ray."),
        (cfg.placement in ("colocated", "split"), f"placement={cfg.placement!r}; use colocated or split."),
        (cfg.resources.nodes >= 1 and cfg.resources.devices_per_node >= 1,
         "resources.nodes and resources.devices_per_node must be >= 1."),
        (cfg.backend == "ray" or world_size(cfg) == 1,
         f"backend=local runs one rank per role, but resources asks for {world_size(cfg)}; use backend=ray "
         "for more ranks."),
        (cfg.backend == "ray" or cfg.placement == "colocated",
         "placement=split runs the rollout engines in their own processes; it needs backend=ray."),
        (cfg.rollout.workers >= 1, "rollout.workers must be >= 1."),
        (cfg.placement == "split" or cfg.rollout.workers in (1, world_size(cfg)),
         f"placement=colocated runs one rollout engine per actor rank ({world_size(cfg)}); rollout.workers="
         f"{cfg.rollout.workers} needs placement=split."),
        (cfg.rollout.sync_timeout_s > 0, "rollout.sync_timeout_s must be > 0."),
        (cfg.rollout.lora_sync in ("merged", "adapter"),
         f"rollout.lora_sync={cfg.rollout.lora_sync!r}; use merged or adapter."),
        (cfg.rollout.lora_sync == "merged" or cfg.model.lora.rank > 0,
         "rollout.lora_sync=adapter sends LoRA adapters, but model.lora.rank=0 trains all weights; set model.lora.rank "
         "> 0 or rollout.lora_sync=merged."),
        (cfg.rollout.lora_versions >= 1, "rollout.lora_versions must be >= 1."),
        (cfg.rollout.max_staleness >= 0, "rollout.max_staleness must be >= 0."),
        (cfg.trainer.mode in ("sync", "async"), f"trainer.mode={cfg.trainer.mode!r}; use sync or async."),
        (cfg.trainer.resume_config_changes in ("refuse", "allow"),
         f"trainer.resume_config_changes={cfg.trainer.resume_config_changes!r}; use refuse or allow."),
        (cfg.trainer.mode == "sync" or cfg.placement == "split",
         "trainer.mode=async overlaps generation with training, so the rollout engines need their own processes: "
         "set placement=split backend=ray."),
        (cfg.model.compute_dtype in (None, "float32", "bfloat16", "auto"),
         f"model.compute_dtype={cfg.model.compute_dtype!r}; use float32, bfloat16, auto or null (the default)."),
        (cfg.model.dtype in ("float32", "bfloat16"), f"model.dtype={cfg.model.dtype!r}; use float32 or bfloat16."),
        (cfg.model.lora.rank >= 0, "model.lora.rank must be >= 0."),
        (cfg.data.overlong in ("drop", "error"), f"data.overlong={cfg.data.overlong!r}; use drop or error."),
        (cfg.rollout.n >= 1, f"rollout.n={cfg.rollout.n} must be >= 1."),
        (cfg.rollout.val_n >= 1, f"rollout.val_n={cfg.rollout.val_n} must be >= 1."),
        (cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1."),
        (cfg.rollout.kv_reuse_mb >= 0, "rollout.kv_reuse_mb must be >= 0 (0: no KV reuse across turns)."),
        (cfg.rollout.kv_cache_mb >= 0, "rollout.kv_cache_mb must be >= 0 (0: from the device's memory)."),
        (cfg.rollout.temperature > 0, "rollout.temperature must be > 0 for training rollouts "
                                      "(use rollout.val_temperature=0 for greedy validation)."),
        (0 < cfg.rollout.top_p <= 1, f"rollout.top_p={cfg.rollout.top_p} must be in (0, 1]."),
        (cfg.data.prompts_per_step >= 1, "data.prompts_per_step must be >= 1."),
        (cfg.actor.lr > 0, "actor.lr must be > 0."),
        (cfg.actor.epochs >= 1, "actor.epochs must be >= 1."),
        (cfg.actor.lr_schedule in ("constant", "cosine", "linear"),
         f"actor.lr_schedule={cfg.actor.lr_schedule!r}; use constant, cosine or linear."),
        (cfg.algorithm.epsilon < 0.01,
         f"algorithm.epsilon={cfg.algorithm.epsilon} is the small number added to a group's reward std before "
         "dividing (default 1e-6), not TRL's clip epsilon: for PPO clipping set actor.clip_ratio_low and "
         "actor.clip_ratio_high."),
        *foreign_value_checks(cfg),
        (cfg.sft.until_accuracy is None or 0 < cfg.sft.until_accuracy <= 1,
         f"sft.until_accuracy={cfg.sft.until_accuracy} is a share of held-back rows answered right: use a value in "
         "(0, 1], e.g. 0.4, or null for a fixed sft.steps."),
        (cfg.sft.probe_rows >= 1 and cfg.sft.check_every >= 1, "sft.probe_rows and sft.check_every must be >= 1."),
        (cfg.actor.minibatches >= 1, "actor.minibatches must be >= 1."),
        (cfg.actor.clip_ratio_c > 1, "actor.clip_ratio_c must be > 1."),
        (cfg.actor.kl_coef >= 0, "actor.kl_coef must be >= 0."),
        (cfg.actor.rollout_is is not None,
         "actor.rollout_is=None is unresolved here: build the config with load_config or saved_config, which resolve "
         "the keys whose default depends on others (grpoflow.config.loading.resolve_defaults)."),
        (cfg.actor.rollout_is in ("off", "token", "sequence"),
         f"actor.rollout_is={cfg.actor.rollout_is!r}; use token, sequence, off or null (automatic)."),
        (cfg.algorithm.filter_groups.max_draws >= 1, "algorithm.filter_groups.max_draws must be >= 1."),
        (cfg.reward.weights is None or len(cfg.reward.weights) == len(cfg.reward.functions),
         f"reward.weights has {len(cfg.reward.weights or [])} entries for {len(cfg.reward.functions)} "
         "reward.functions; give one weight per function."),
        (cfg.reward.timeout_s is None or cfg.reward.timeout_s > 0, "reward.timeout_s must be > 0 (or null)."),
        (cfg.reward.workers >= 0, "reward.workers must be >= 0."),
        (all(s in ("auto", "grpoflow", "trl", "verl")
             for s in (cfg.reward.style if isinstance(cfg.reward.style, list) else [cfg.reward.style])),
         f"reward.style={cfg.reward.style!r}; use auto, grpoflow, trl or verl, or a list of them (one per "
         "reward.functions entry)."),
        (not isinstance(cfg.reward.style, list) or len(cfg.reward.style) == len(cfg.reward.functions),
         f"reward.style has {len(cfg.reward.style)} entries for {len(cfg.reward.functions)} reward.functions; give one "
         "style per function (as reward.weights), or one style for all."),
        (0 < cfg.reward.max_error_share <= 1,
         f"reward.max_error_share={cfg.reward.max_error_share} must be in (0, 1]."),
        (0 <= cfg.reward.overlong_buffer_len < cfg.rollout.max_new_tokens,
         f"reward.overlong_buffer_len={cfg.reward.overlong_buffer_len} must be in [0, rollout.max_new_tokens)."),
        (cfg.trainer.total_steps >= 0, "trainer.total_steps must be >= 0."),
        (cfg.trainer.total_epochs is None or cfg.trainer.total_epochs >= 1,
         f"trainer.total_epochs={cfg.trainer.total_epochs} must be >= 1 (or null: trainer.total_steps counts)."),
        *distill_checks(cfg.distill),
        *judge_checks(cfg.reward.judge),
        *curriculum_checks(cfg.data.curriculum),
        (cfg.data.shuffle or not cfg.data.curriculum.enable,
         "data.shuffle=false asks for the prompts in file order, and data.curriculum.enable draws them by how they "
         "fared: turn one of them off."),
        *multi_turn_checks(cfg.rollout.multi_turn, cfg.rollout.agent),
        *partial_checks(cfg),
        *tinker_checks(cfg.tinker),
        (cfg.trainer.val_every >= 0, "trainer.val_every must be >= 0."),
        (cfg.trainer.log_train_every >= 0 and cfg.trainer.log_train_groups >= 0,
         "trainer.log_train_every and trainer.log_train_groups must be >= 0 (0 turns train_samples.jsonl off)."),
        (cfg.trainer.save_every >= 0 and cfg.trainer.keep_last >= 0, "trainer.save_every and trainer.keep_last "
                                                                     "must be >= 0."),
        (cfg.trainer.max_restarts >= 0, f"trainer.max_restarts={cfg.trainer.max_restarts} must be >= 0 (0: a dead "
                                        "worker stops the run)."),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    batch_schedule(cfg)


@dataclass
class Schedule:
    """The resolved batch algebra of one RL step (printed at start)."""
    prompts_per_step: int
    n: int
    trajectories: int
    minibatches: int
    trajectories_per_minibatch: int
    epochs: int
    optimizer_steps: int
    max_tokens_per_microbatch: int
    max_microbatches_per_minibatch: int

    def describe(self) -> str:
        return (f"schedule: {self.prompts_per_step} prompts x {self.n} samples = {self.trajectories} trajectories"
                f" per step | {self.minibatches} mini-batch(es) of {self.trajectories_per_minibatch} x "
                f"{self.epochs} epoch(s) = {self.optimizer_steps} optimizer step(s) | micro-batches of <= "
                f"{self.max_tokens_per_microbatch or 'a budget from memory of >= 4096'} tokens, <= "
                f"{self.max_microbatches_per_minibatch} per mini-batch")


def batch_schedule(cfg: Config) -> Schedule:
    """Resolve and check the batch algebra; every size problem is an error here, before any model loads."""
    p, n, m = cfg.data.prompts_per_step, cfg.rollout.n, cfg.actor.minibatches
    if p % m:
        divisors = [d for d in range(1, p + 1) if p % d == 0]
        raise ConfigError(f"actor.minibatches={m} does not divide data.prompts_per_step={p} (mini-batches hold "
                          f"whole groups); use one of {divisors}.")
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    budget = cfg.actor.max_tokens_per_microbatch
    if budget == 0:  # chosen from memory when the model is known (training.budget): at least one sequence
        budget = max(seq, 4096)
    if budget < seq:
        raise ConfigError(f"actor.max_tokens_per_microbatch={budget} is smaller than one sequence "
                          f"(data.max_prompt_length + rollout.max_new_tokens = {seq}); raise it to at least {seq}.")
    per_mb = p // m * n
    per_micro = max(1, budget // seq)
    return Schedule(p, n, p * n, m, per_mb, cfg.actor.epochs, m * cfg.actor.epochs, cfg.actor.max_tokens_per_microbatch,
                    -(-per_mb // per_micro))


# ---------------------------------------------------------------- the newer sections


def curriculum_checks(c: CurriculumConfig) -> list[tuple[bool, str]]:
    """The curriculum's keys."""
    return [
        (len(c.shares) == 3 and min(c.shares, default=0) >= 0 and sum(c.shares) > 0,
         f"data.curriculum.shares={c.shares}: give three shares >= 0 (easy, learnable, hard), not all 0."),
        (c.window >= 1 and c.retire_after >= 0, "data.curriculum.window must be >= 1 and retire_after >= 0."),
        (0 <= c.hard_below < c.easy_above <= 1, "data.curriculum needs 0 <= hard_below < easy_above <= 1."),
    ]


def judge_checks(j: JudgeConfig) -> list[tuple[bool, str]]:
    """The LLM judge's keys."""
    return [
        (not (j.url and j.path), "reward.judge.url and reward.judge.path are both set; the judge is either a server "
                                 "(url) or a local model (path)."),
        (j.max_concurrency >= 1 and j.retries >= 0 and j.timeout_s > 0 and j.max_tokens >= 1,
         "reward.judge.max_concurrency and max_tokens must be >= 1, retries >= 0 and timeout_s > 0."),
        (j.max_score is None or j.max_score > 0, "reward.judge.max_score must be > 0 (or null)."),
    ]


def distill_checks(d: DistillConfig) -> list[tuple[bool, str]]:
    """The distillation keys' ranges and combinations."""
    self_teacher = d.teacher.path == "self"
    return [
        (d.kl_coef >= 0 and d.task_weight >= 0 and d.topk >= 0 and d.topk_coef >= 0,
         "distill.kl_coef, distill.task_weight, distill.topk and distill.topk_coef must be >= 0."),
        (not self_teacher or bool(d.teacher.prompt_template),
         "distill.teacher.path=self scores the student with itself; without privileged context "
         "(distill.teacher.prompt_template) the teacher equals the student and the signal is 0: set a template."),
        (not (self_teacher and d.topk > 0), "distill.topk needs a teacher model of its own (distill.teacher.path); the "
                                            "self-distilling teacher gives the sampled tokens' log-probs only."),
    ]


def multi_turn_checks(m: MultiTurnConfig, a: AgentConfig) -> list[tuple[bool, str]]:
    """rollout.multi_turn's and rollout.agent's ranges, and that the two are not combined."""
    return [
        (min(m.max_turns, m.max_tool_calls_per_turn, m.max_tool_output_tokens, m.tool_workers) >= 1,
         "rollout.multi_turn.max_turns, max_tool_calls_per_turn, max_tool_output_tokens and tool_workers must be "
         ">= 1."),
        (min(m.tool_timeout_s, m.tool_cpu_time_s, m.tool_memory_mb, m.env_timeout_s) > 0,
         "rollout.multi_turn.tool_timeout_s, tool_cpu_time_s, tool_memory_mb and env_timeout_s must be > 0."),
        (a.timeout_s > 0, "rollout.agent.timeout_s must be > 0."),
        (m.max_turns < 1009, f"rollout.multi_turn.max_turns={m.max_turns}: at most 1008 turns (each turn of a "
                             "trajectory draws from its own random stream, 1009 per trajectory)."),
        (not (a.enabled and m.enabled),
         "rollout.agent.program runs its own conversation and tools; leave rollout.multi_turn.env and "
         "rollout.multi_turn.tools empty with it."),
    ]


def partial_checks(cfg: Config) -> list[tuple[bool, str]]:
    """rollout.partial's ranges, and what it cannot be combined with (yet)."""
    p = cfg.rollout.partial
    ranges = (p.oversample >= 1 and p.max_staleness >= 0,
              "rollout.partial.oversample must be >= 1 and rollout.partial.max_staleness >= 0.")
    if not p.enable:
        return [ranges]
    return [
        ranges,
        # whether the rollout kind and the engine can pause is what they declare: the start-up check asks them
        # (plan/checks.py, check_partial)
        (cfg.trainer.mode == "sync",
         "rollout.partial continues a step's unfinished samples in the next step's rollout, which trainer.mode=async "
         "has already started before the step ends: use trainer.mode=sync with rollout.partial.enable."),
        (not cfg.algorithm.filter_groups.enable,
         "rollout.partial chooses a step's groups by when they finish, and algorithm.filter_groups draws again for "
         "groups with signal; use one of them."),
    ]


SDK_HEARTBEAT_S = 10.0  # the tinker SDK's session heartbeat period


def tinker_checks(t: TinkerConfig) -> list[tuple[bool, str]]:
    """`grpoflow serve tinker`'s limits: positive, the shared budgets at least one request's worth, and a session
    timeout that three missed heartbeats cannot reach (else live clients' models are freed under them)."""
    return [
        (t.session_timeout_s >= 3 * SDK_HEARTBEAT_S,
         f"tinker.session_timeout_s={t.session_timeout_s:g} would end live sessions: the SDK beats every "
         f"{SDK_HEARTBEAT_S:g} s, so give at least {3 * SDK_HEARTBEAT_S:g} (three heartbeats; default 120)."),
        (min(t.max_request_mb, t.max_sample_tokens, t.body_timeout_s, t.future_ttl_s) > 0,
         "tinker.max_request_mb, max_sample_tokens, body_timeout_s and future_ttl_s must be > 0."),
        (t.max_queued_tokens >= t.max_sample_tokens,
         f"tinker.max_queued_tokens={t.max_queued_tokens} is below tinker.max_sample_tokens={t.max_sample_tokens}: "
         "the shared budget must hold at least one request; raise it."),
        (t.max_queued_mb >= t.max_request_mb,
         f"tinker.max_queued_mb={t.max_queued_mb:g} is below tinker.max_request_mb={t.max_request_mb:g}: the shared "
         "budget must hold at least one request body; raise it."),
    ]


def foreign_value_checks(cfg: Config) -> list[tuple[bool, str]]:
    """Values named as verl names them, given under our keys: one sentence naming ours (so `grpoflow config`
    catches them, not only `train`)."""
    checks = []
    for key, value in (("actor.kl_estimator", cfg.actor.kl_estimator), ("algorithm.kl_penalty",
                                                                        cfg.algorithm.kl_penalty)):
        ours = VERL_KL.get(value)
        if value in VERL_KL and value != ours:
            fix = f"here it is `{key}={ours}`" if ours else "grpoflow has k1, k2, k3 and k3+"
            checks.append((False, f"{key}={value} is verl's name; {fix}."))
    return checks
