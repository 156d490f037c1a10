"""The multi-turn rollout of a run: the agent loop built from `rollout.env` / `rollout.tools`
(docs/multi-turn.md), or agent episodes through the OpenAI-compatible endpoint from `rollout.agent`
(docs/agents.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from grpoflow.config import Config
from grpoflow.data.dataset import PromptItem
from grpoflow.multiturn.chat import ChatRenderer
from grpoflow.multiturn.env import guarded, load_env, with_system_prompt
from grpoflow.multiturn.loop import AgentLoop, Generate, ToolUse
from grpoflow.multiturn.tool_runner import ToolRunner
from grpoflow.multiturn.tools import load_tools, tool_from_function

if TYPE_CHECKING:  # the agents module imports the endpoint (fastapi): loaded only when rollout.agent is set
    from grpoflow.multiturn.agents import AgentEpisodes


def build_agent_rollout(cfg: Config, tokenizer: Any, generate: Generate) -> "AgentLoop | AgentEpisodes | None":
    """The multi-turn rollout for `cfg.rollout`: agent episodes with `rollout.agent`, the agent loop with
    `rollout.env` / `rollout.tools`, else None (one sample per prompt). Close it with `close_agent_rollout`."""
    if cfg.rollout.agent:
        return build_agent_episodes(cfg, tokenizer, generate)
    return build_agent_loop(cfg, tokenizer, generate) if cfg.rollout.multi_turn else None


def build_agent_episodes(cfg: Config, tokenizer: Any, generate: Generate) -> "AgentEpisodes":
    """The agent of `rollout.agent` and a started endpoint in front of `generate`."""
    from grpoflow.multiturn.agents import AgentEpisodes, load_agent
    from grpoflow.multiturn.endpoint import Endpoint

    r = cfg.rollout
    assert r.agent
    agent = load_agent(r.agent)
    endpoint = Endpoint(generate, tokenizer, model_name=r.agent_model, tool_parser=r.tool_parser,
                        max_calls=r.max_turns,
                        max_prompt_tokens=max(4 * (cfg.data.max_prompt_length + r.max_new_tokens), 4096)).start()
    # a conversation's prompt is its opening (<= data.max_prompt_length) plus at most a sample's budget; the
    # factor 4 leaves room for an agent's own system prompt and tool schemas
    return AgentEpisodes(agent, endpoint, timeout_s=r.agent_timeout_s, error_score=cfg.reward.error_score,
                         opening=opening_of(cfg))


def opening_of(cfg: Config) -> Callable[[PromptItem], list[dict]]:
    d = cfg.data

    def opening(item: PromptItem) -> list[dict]:
        """The dataset prompt as chat messages (with data.system_prompt), when the environment gives none."""
        prompt = item.row.get(d.prompt_key)
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        return with_system_prompt(messages, d.system_prompt)

    return opening


def build_agent_loop(cfg: Config, tokenizer: Any, generate: Generate) -> AgentLoop:
    """The loop for `cfg.rollout` (with `rollout.multi_turn`): its environment class, its tools (the configured
    ones and those the environment declares, run by a ToolRunner: `AgentLoop.close` stops it), and a renderer
    whose template was checked."""
    r = cfg.rollout
    env_cls = load_env(r.env) if r.env else None
    tools = None
    declared = list(getattr(env_cls, "tools", []) or [])
    found = load_tools(list(r.tools)) + [tool_from_function(fn) for fn in declared]
    names = [t.name for t in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"rollout.tools and the environment's tools name {duplicates} twice; rename one.")
    renderer = ChatRenderer(tokenizer, [t.schema for t in found] or None)  # checks the template first
    if found:
        runner = ToolRunner(found, timeout_s=r.tool_timeout_s, cpu_time_s=r.tool_cpu_time_s,
                            memory_mb=r.tool_memory_mb, workers=r.tool_workers)
        tools = ToolUse(runner, parser=r.tool_parser, max_calls_per_turn=r.max_tool_calls_per_turn,
                        max_output_tokens=r.max_tool_output_tokens)
    return AgentLoop(renderer, generate, env_cls=guarded(env_cls) if env_cls else None, tools=tools,
                     max_turns=r.max_turns, opening=opening_of(cfg),
                     system_prompt=cfg.data.system_prompt)
