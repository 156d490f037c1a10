"""Range and combination checks of the config's newer sections (curriculum, LLM judge, distillation, multi-turn
and agent rollouts, partial rollout), kept out of config.py so it stays under the size bound; `config.validate`
runs them with the rest. Each returns (holds, message naming the key and the fix) pairs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the dataclasses live in config.py, which imports this module
    from grpoflow.config import AgentConfig, Config, CurriculumConfig, DistillConfig, JudgeConfig, MultiTurnConfig


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
    r = cfg.rollout
    if not r.partial:
        return [(r.partial_oversample >= 1 and r.partial_max_staleness >= 0,
                 "rollout.partial_oversample must be >= 1 and rollout.partial_max_staleness >= 0.")]
    return [
        (r.partial_oversample >= 1 and r.partial_max_staleness >= 0,
         "rollout.partial_oversample must be >= 1 and rollout.partial_max_staleness >= 0."),
        (not r.agent.enabled,
         "rollout.partial pauses samples and carries them (and the checkpoint saves them) into the next step, but an "
         "agent episode (rollout.agent.program) holds the state of a user program, which cannot be saved or "
         "replayed; partial rollout takes single-turn runs and rollout.multi_turn.env / rollout.multi_turn.tools "
         "conversations: unset rollout.partial or rollout.agent.program."),
        (r.engine == "hf" or (r.engine == "vllm" and not r.multi_turn.enabled),
         f"rollout.partial stops samples at a token boundary and continues them in a later rollout; "
         f"rollout.engine={r.engine} cannot pause here (sglang decodes a whole batch per call; vllm pauses "
         "single-turn samples only): use rollout.engine=hf."),
        (cfg.trainer.mode == "sync",
         "rollout.partial continues a step's unfinished samples in the next step's rollout, which trainer.mode=async "
         "has already started before the step ends: use trainer.mode=sync with rollout.partial."),
        (not cfg.algorithm.filter_groups.enable,
         "rollout.partial chooses a step's groups by when they finish, and algorithm.filter_groups draws again for "
         "groups with signal; use one of them."),
    ]


def foreign_value_checks(cfg: Config) -> list[tuple[bool, str]]:
    """Values named as verl names them, given under our keys: one sentence naming ours (so `grpoflow config`
    catches them, not only `train`)."""
    from grpoflow.foreign import VERL_KL  # stdlib only, like this module

    checks = []
    for key, value in (("actor.kl_estimator", cfg.actor.kl_estimator), ("algorithm.kl_penalty",
                                                                        cfg.algorithm.kl_penalty)):
        ours = VERL_KL.get(value)
        if value in VERL_KL and value != ours:
            fix = f"here it is `{key}={ours}`" if ours else "grpoflow has k1, k2, k3 and k3+"
            checks.append((False, f"{key}={value} is verl's name; {fix}."))
    return checks
