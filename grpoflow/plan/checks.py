"""The start-up check: every config key that names something in a registry is resolved here, once, before any
model loads, so a typo costs seconds and names the key; what it resolves is kept (`RunParts`), never looked up again.

`config.check_config_values` checks plain values (choices, ranges, the batch schedule) without importing torch; this
adds what needs the registries: advantage estimators, policy losses, loss aggregation modes, KL estimators and
controllers, reward functions, rollout engines, environments, tools, tool formats, agents, and the combinations that
make no sense. User files (reward functions, environments, tools, agents) are imported here.

It runs once per command that starts a run (plan/run_plan.py) and marks the config it passed (`config.mark_checked`).
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from grpoflow.algorithms import (ADVANTAGE_ESTIMATORS, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES,
                                 required_inputs)
from grpoflow.algorithms.advantage_inputs import ADVANTAGE_INPUTS
from grpoflow.config import Config, ConfigError, RewardConfig, check_config_values, mark_checked
from grpoflow.data.tool_format import ToolFormat, tool_format
from grpoflow.engines.choice import MachineFacts, auto_engine, engine_refusal, probe_machine
from grpoflow.engines.factory import ROLLOUT_ENGINES
from grpoflow.errors import UserError
from grpoflow.plugins import Registry
from grpoflow.rewards import build_reward
from grpoflow.rewards.judge import JudgeConfigError, ScoreParser
from grpoflow.trajectories.env import load_env
from grpoflow.trajectories.loop import EnvLoop, SingleTurn
from grpoflow.trajectories.rollout import Kind
from grpoflow.trajectories.tools import Tool, load_tools, tool_from_function

JUDGE = "judge"  # the reward name that reads the judge's score


@dataclass(frozen=True, eq=False)
class RunParts:
    """What the config's registry names resolve to, resolved once (`check_config`). A copy sent to another process
    (a Ray worker) travels as its config and is resolved again there: once per process, user files imported where
    they run."""
    cfg: Config
    advantage_fn: Callable
    policy_loss: Callable
    kl_controller: Callable
    engine_builder: Callable                 # rollout.engine
    reward: Callable | None                  # reward.function(s), built (rewards/combine.py); None: none named
    env_cls: type | None = None              # rollout.multi_turn.env
    tools: list[Tool] = field(default_factory=list)  # rollout.multi_turn.tools and the environment's own
    tool_format: ToolFormat | None = None    # rollout.multi_turn.tool_parser, for tool loops and agent replies
    agent: Callable | None = None            # rollout.agent.program

    def __reduce__(self) -> tuple[Callable, tuple[Config]]:
        return check_config, (self.cfg,)

    @property
    def tool_schemas(self) -> list[dict] | None:
        """The chat-template schemas of the run's tools (what every conversation's prompt renders), or None."""
        return [t.schema for t in self.tools] or None


def resolve(registry: Registry, key: str, name: str) -> Callable:
    """`registry.resolve(name)`, or a ConfigError that names the config key."""
    try:
        return registry.resolve(name)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"{key}={name!r}: {e}") from None


def check_config(cfg: Config) -> RunParts:
    """Everything that can be checked without a model, every registry name resolved once; raises ConfigError naming
    the key and the fix. Never changes `cfg`'s values; marks it checked (`config.is_checked`) when every check
    passed."""
    check_config_values(cfg)
    a, alg = cfg.actor, cfg.algorithm
    estimator = resolve(ADVANTAGE_ESTIMATORS, "algorithm.adv_estimator", alg.adv_estimator)
    policy_loss = resolve(POLICY_LOSSES, "actor.policy_loss", a.policy_loss)
    resolve(LOSS_AGGREGATIONS, "actor.loss_agg_mode", a.loss_agg_mode)
    resolve(KL_ESTIMATORS, "actor.kl_estimator", a.kl_estimator)
    resolve(KL_ESTIMATORS, "algorithm.kl_penalty", alg.kl_penalty)
    kl_controller = resolve(KL_CONTROLLERS, "algorithm.kl_ctrl.type", alg.kl_ctrl.type)
    engine_builder = resolve(ROLLOUT_ENGINES, "rollout.engine", cfg.rollout.engine)
    check_partial(cfg)
    check_engine_fits(cfg)
    r = cfg.reward
    spec = r.functions or r.function
    reward = None
    if spec:
        try:
            reward = build_reward(spec, r.weights, r.routes, r.style)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None
    check_judge(r)
    check_teacher_path(cfg.distill.teacher.path)
    missing = required_inputs(estimator) - set(ADVANTAGE_INPUTS)
    if missing:
        raise ConfigError(f"algorithm.adv_estimator={alg.adv_estimator!r} needs {sorted(missing)}, which no step "
                          f"provides (available: {list(ADVANTAGE_INPUTS)}).")
    modes = POLICY_LOSSES.meta(a.policy_loss).get("agg_modes")
    if modes and a.loss_agg_mode not in modes:
        raise ConfigError(f"actor.policy_loss={a.policy_loss} is defined with loss_agg_mode in {list(modes)}, "
                          f"not {a.loss_agg_mode!r}; set actor.loss_agg_mode={modes[0]}.")
    if a.rollout_is in ("token", "sequence") and cfg.rollout.top_p < 1:
        check_nucleus_sampling(cfg)
    check_exact(cfg)
    env_cls, tools, parser = check_multi_turn(cfg)
    agent = check_agent(cfg, estimator)
    if "baselines" in required_inputs(estimator) and alg.filter_groups.enable:
        raise ConfigError("algorithm.filter_groups needs groups of samples with different rewards; an estimator "
                          "with a greedy baseline (remax) is meant for rollout.n=1. Disable one of them.")
    mark_checked(cfg)
    return RunParts(cfg, advantage_fn=estimator, policy_loss=policy_loss, kl_controller=kl_controller,
                    engine_builder=engine_builder, reward=reward, env_cls=env_cls, tools=tools, tool_format=parser,
                    agent=agent)


def check_exact(cfg: Config) -> None:
    """rollout.exact makes the engine's kernels and the trainer's batch-invariant: the engine must declare it has
    them (`batch_invariant`, engines/factory.py; hf does)."""
    if cfg.rollout.exact and not ROLLOUT_ENGINES.meta(cfg.rollout.engine).get("batch_invariant", False):
        raise ConfigError(f"rollout.exact=true makes the hf engine's and the trainer's kernels batch-invariant; "
                          f"rollout.engine={cfg.rollout.engine} computes with its own (bound: docs/numerics.md). Use "
                          "rollout.engine=hf or rollout.exact=false.")


def kind_class(cfg: Config) -> type[Kind]:
    """The class of rollout kind `cfg.rollout` asks for (workers/rollout_kinds.py builds it): its declared abilities
    (`can_pause`, `replays_on_resume`) are what the start-up check asks."""
    if cfg.rollout.agent.enabled:
        from grpoflow.trajectories.agents import AgentEpisodes  # the agent endpoint: the `agents` extra

        return AgentEpisodes
    return EnvLoop if cfg.rollout.multi_turn.enabled else SingleTurn


def check_partial(cfg: Config, facts: MachineFacts | None = None) -> None:
    """rollout.partial pauses trajectories and continues them in a later rollout: the rollout kind must declare it can
    pause, and the engine (rollout.engine; auto: as this machine resolves it) that it pauses and, for a kind that
    replays a paused trajectory on resume, that it continues a paused request exactly (engines/factory.py). Asked of
    their declarations, never of their names."""
    r = cfg.rollout
    if not r.partial.enable:
        return
    kind = kind_class(cfg)
    if not kind.can_pause:
        raise ConfigError("rollout.partial pauses samples and carries them (and the checkpoint saves them) into the "
                          f"next step, but an {kind.__name__} trajectory holds state that cannot be saved or replayed "
                          "(an agent episode, rollout.agent.program, holds a user program's); partial rollout takes "
                          "single-turn runs and rollout.multi_turn.env / rollout.multi_turn.tools conversations: unset "
                          "rollout.partial.enable or rollout.agent.program.")
    if facts is None and r.engine == "auto" and ranks_here(cfg):
        facts = probe_machine()
    engine = auto_choice(cfg, facts)[0] if r.engine == "auto" and facts is not None else r.engine
    if engine == "auto":  # the ranks' machines decide (a Ray cluster elsewhere): auto picks hf for conversations
        return
    declared = ROLLOUT_ENGINES.meta(engine)
    how = "rollout.partial stops samples at a token boundary and continues them in a later rollout; "
    if not declared.get("pausing", False):
        raise ConfigError(f"{how}rollout.engine={engine} declares no pausing (it cannot stop its requests at a token "
                          "boundary): use rollout.engine=hf.")
    if kind.replays_on_resume and not declared.get("exact_resume", False):
        raise ConfigError(f"{how}a paused {kind.__name__} conversation is replayed on a fresh environment, which "
                          f"needs the engine to continue a paused request exactly, and rollout.engine={engine} "
                          "declares pausing without exact_resume (its continuation samples other tokens; it pauses "
                          "single-turn samples only): use rollout.engine=hf.")


def check_nucleus_sampling(cfg: Config) -> None:
    """Importance sampling with rollout.top_p < 1 needs each token's nucleus (models/nucleus.py) so the trainer
    scores it under the distribution it was drawn from: engines that record it, on paths that carry it."""
    a, r = cfg.actor, cfg.rollout
    why = " (trainer.mode=async turns it on for stale samples)" if cfg.trainer.mode == "async" else \
        " (rollout.partial turns it on for stale samples)" if r.partial.enable else ""
    if not ROLLOUT_ENGINES.meta(r.engine).get("nucleus_floors", False):
        raise ConfigError(f"actor.rollout_is={a.rollout_is}{why} with rollout.top_p={r.top_p} needs each token's "
                          f"top-p nucleus, which rollout.engine={r.engine} does not report (its log-probs are not "
                          "the ones the trainer can recompute). Use rollout.engine=hf, rollout.top_p=1 or "
                          "actor.rollout_is=off.")
    if r.agent.enabled:
        raise ConfigError(f"actor.rollout_is={a.rollout_is}{why} with rollout.top_p={r.top_p}: rollout.agent's "
                          "episodes do not carry each token's top-p nucleus to the trainer. Set rollout.top_p=1 or "
                          "actor.rollout_is=off.")


def ranks_here(cfg: Config) -> bool:
    """The ranks run on this machine (backend=local, or a Ray instance started here), so its facts decide."""
    return cfg.backend == "local" or cfg.ray.address is None


def auto_choice(cfg: Config, facts: MachineFacts) -> tuple[str, str]:
    """rollout.engine=auto for this config on a machine with `facts`: (engine, why) (engines/choice.py)."""
    r = cfg.rollout
    needs_hf = "rollout.partial with multi-turn conversations" if r.partial.enable and r.multi_turn.enabled else None
    return auto_engine(cuda_available=facts.cuda_available, vllm_version=facts.vllm_version,
                       vllm_import_error=facts.vllm_import_error, needs_hf=needs_hf)


def check_engine_fits(cfg: Config, facts: MachineFacts | None = None) -> None:
    """rollout.engine (auto: as this machine resolves it) and rollout.tensor_parallel_size are something the
    machine can run (engines/choice.py): else one line naming the fix, before any model loads. `facts`: this
    machine's (probed when None); a Ray cluster's ranks are judged by the config alone."""
    r = cfg.rollout
    if facts is None and ranks_here(cfg):
        facts = probe_machine()
    engine = auto_choice(cfg, facts)[0] if r.engine == "auto" and facts is not None else r.engine
    refusal = engine_refusal(engine, tensor_parallel_size=r.tensor_parallel_size, facts=facts)
    if refusal:
        raise ConfigError(refusal)


def names_judge(spec: str | Sequence[str] | None) -> bool:
    """Whether a reward spec (a name, or a list of names) includes the `judge` reward."""
    if not spec:
        return False
    return JUDGE in ([spec] if isinstance(spec, str) else list(spec))


def judged(r: RewardConfig) -> bool:
    """Whether a judge is configured (reward.judge.url or reward.judge.path)."""
    return bool(r.judge.url or r.judge.path)


def check_judge(r: RewardConfig) -> None:
    """The judge is configured exactly when some reward names it; its parser loads."""
    named = names_judge(r.functions or r.function) or any(names_judge(s) for s in (r.routes or {}).values())
    configured = judged(r)
    if named and not configured:
        raise ConfigError("a reward names `judge` but no judge is configured: set reward.judge.url (an "
                          "OpenAI-compatible server) or reward.judge.path (a local model folder).")
    if configured and not named:
        raise ConfigError("reward.judge is configured but no reward uses it: add `judge` to reward.functions (with "
                          "reward.weights), set reward.function=judge, or route a data_source to it in reward.routes.")
    if configured:
        try:
            ScoreParser(r.judge.parser, r.judge.max_score)
        except (JudgeConfigError, ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None


def check_teacher_path(path: str | None) -> None:
    """distill.teacher.path names something that exists (its tokenizer is checked when the controller starts)."""
    if path is None or path == "self" or path.startswith("builtin:"):
        return
    if not Path(path).exists():
        raise ConfigError(f"distill.teacher.path={path} does not exist; give a local HF model folder, a .gguf file, "
                          "a builtin:tiny-<size> model or self.")


def check_multi_turn(cfg: Config) -> tuple[type | None, list[Tool], ToolFormat | None]:
    """rollout.multi_turn.env names an environment class, rollout.multi_turn.tools name usable tools (typed, with
    docstrings; with the environment's own, names unique) and rollout.multi_turn.tool_parser a tool format; returns
    them."""
    r = cfg.rollout.multi_turn
    env_cls = None
    if r.env:
        try:
            env_cls = load_env(r.env)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None
        check_env_args(r.env, env_cls, dict(r.env_args))
    elif r.env_args:
        raise ConfigError(f"rollout.multi_turn.env_args={dict(r.env_args)} is set but rollout.multi_turn.env is not; "
                          "set both or neither.")
    tools: list[Tool] = []
    if r.tools:
        try:
            tools = load_tools(list(r.tools))
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise ConfigError(f"rollout.multi_turn.tools: {e}") from None
    if r.enabled:
        tools += [tool_from_function(fn) for fn in getattr(env_cls, "tools", []) or []]
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UserError(f"rollout.multi_turn.tools and the environment's tools name {duplicates} twice; rename "
                            "one.")
    parser = None
    if r.enabled or cfg.rollout.agent.enabled:  # tool calls are parsed in tool loops and agent replies
        try:
            parser = tool_format(r.tool_parser)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"rollout.multi_turn.tool_parser={r.tool_parser!r}: {e}") from None
    return env_cls, tools, parser


def check_env_args(spec: str, env_cls: type, env_args: dict) -> None:
    """rollout.multi_turn.env_args fit the environment class's constructor (checked on its signature; nothing is
    built)."""
    try:
        inspect.signature(env_cls).bind(**env_args)
    except TypeError as e:
        raise ConfigError(f"rollout.multi_turn.env_args={env_args} do not fit rollout.multi_turn.env={spec}'s "
                          f"constructor {env_cls.__name__}{inspect.signature(env_cls)}: {e}; set "
                          "rollout.multi_turn.env_args to its keyword arguments.") from None


def check_agent(cfg: Config, estimator: Callable) -> Any:
    """rollout.agent.program names an async (row, client) function or a built-in agent that can be built (verifiers:
    its harness is built here, before step 1), its libraries are installed, and nothing asks for groups of exactly
    rollout.n samples (agent episodes may split into several samples); returns the agent (None: episodes are off)."""
    a = cfg.rollout.agent
    if not a.program:  # agent episodes are off
        return None
    missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"rollout.agent.program needs {missing}, which are not installed: pip install "
                          "'grpoflow[agents]'.")
    from grpoflow.trajectories.agents import load_agent

    try:
        agent = load_agent(a.program, dict(a.args), a.model, [*cfg.data.train_files, *(cfg.data.val_files or [])])
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    if cfg.algorithm.filter_groups.enable:
        raise ConfigError("algorithm.filter_groups needs groups of exactly rollout.n samples; an agent episode may "
                          "give several. Disable it with rollout.agent.program.")
    if "baselines" in required_inputs(estimator):
        raise ConfigError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} needs a greedy baseline per "
                          "prompt, which agent episodes do not give; use grpo, rloo or reinforce_plus_plus.")
    return agent
