"""The kind of rollout a run's config asks for (trajectories/rollout.py plays it): single-turn samples, conversations
with `rollout.multi_turn.env` / `.tools`, or `rollout.agent.program` episodes through the OpenAI-compatible
endpoint. Built from the run's resolved parts (plan/checks.py): nothing is looked up by name here."""

from __future__ import annotations

from typing import Any, Callable

from grpoflow.config import Config
from grpoflow.plan.checks import RunParts
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import with_system_prompt
from grpoflow.trajectories.loop import EnvLoop, SingleTurn
from grpoflow.trajectories.rollout import Kind
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.turns import ToolUse


def build_rollout(cfg: Config, tokenizer: Any, parts: RunParts) -> Kind:
    """The kind of rollout `cfg.rollout` asks for, of the run's resolved `parts` (close it with `.close()`)."""
    if cfg.rollout.agent.enabled:
        return build_agent_episodes(cfg, tokenizer, parts)
    if cfg.rollout.multi_turn.enabled:
        return build_env_loop(cfg, tokenizer, parts)
    return SingleTurn(tokenizer)


def opening_of(cfg: Config) -> Callable[[dict], list[dict]]:
    d = cfg.data

    def opening(row: dict) -> list[dict]:
        """The dataset prompt as chat messages (with data.system_prompt), when the environment gives none."""
        prompt = row.get(d.prompt_key)
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        return with_system_prompt(messages, d.system_prompt)

    return opening


def build_agent_episodes(cfg: Config, tokenizer: Any, parts: RunParts) -> Any:
    """The agent of `rollout.agent.program` and a started endpoint (imports fastapi: the `agents` extra)."""
    from grpoflow.trajectories.agents import AgentEpisodes
    from grpoflow.trajectories.endpoint import Endpoint

    a, m = cfg.rollout.agent, cfg.rollout.multi_turn
    assert parts.agent is not None and parts.tool_format is not None
    # a conversation's prompt is its opening (<= data.max_prompt_length) plus at most a sample's budget; the factor 4
    # leaves room for an agent's own system prompt and tool schemas
    endpoint = Endpoint(tokenizer, model_name=a.model, tool_format=parts.tool_format, max_calls=m.max_turns,
                        max_prompt_tokens=max(4 * (cfg.data.max_prompt_length + cfg.rollout.max_new_tokens),
                                              4096)).start()
    return AgentEpisodes(parts.agent, endpoint, timeout_s=a.timeout_s, error_score=cfg.reward.error_score,
                         opening=opening_of(cfg))


def build_env_loop(cfg: Config, tokenizer: Any, parts: RunParts) -> EnvLoop:
    """The loop for `cfg.rollout.multi_turn`: its environment class, its tools (the configured ones and those the
    environment declares, run by a ToolRunner: `EnvLoop.close` stops it), and a renderer whose template was
    checked."""
    r = cfg.rollout.multi_turn
    tools = None
    renderer = ChatRenderer(tokenizer, parts.tool_schemas)  # checks the template first
    if parts.tools:
        assert parts.tool_format is not None
        runner = ToolRunner(parts.tools, timeout_s=r.tool_timeout_s, cpu_time_s=r.tool_cpu_time_s,
                            memory_mb=r.tool_memory_mb, workers=r.tool_workers)
        tools = ToolUse(runner, format=parts.tool_format, max_calls_per_turn=r.max_tool_calls_per_turn,
                        max_output_tokens=r.max_tool_output_tokens)
    return EnvLoop(renderer, env_cls=parts.env_cls, env_args=dict(r.env_args), env_timeout_s=r.env_timeout_s,
                   tools=tools, max_turns=r.max_turns, opening=opening_of(cfg), system_prompt=cfg.data.system_prompt,
                   max_prompt_length=cfg.data.max_prompt_length)
