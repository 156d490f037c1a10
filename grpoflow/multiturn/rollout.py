"""One rollout for every kind of run: build what `cfg.rollout` asks for, run its trajectories over a request
batcher, return the samples as one Batch.

The kinds (each a `play(batcher, items, params, seed)` coroutine, loop.py and agents.py):

    SingleTurn     one request per (prompt, sample): the trivial trajectory
    EnvLoop        conversations with `rollout.env` and/or `rollout.tools`
    AgentEpisodes  `rollout.agent` programs through the OpenAI-compatible endpoint

`run_rollout` plays them on an asyncio loop of its own with the engine behind a `RequestBatcher`; a rollout
worker calls it for its share of the step's prompts. Group ids are the items' positions in the step.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Protocol, Union

import torch

from grpoflow.config import Config
from grpoflow.data.batch import Batch
from grpoflow.multiturn.chat import ChatRenderer
from grpoflow.multiturn.env import load_env, with_system_prompt
from grpoflow.multiturn.loop import EnvLoop, Played, RolloutItem, SingleTurn
from grpoflow.multiturn.tool_runner import ToolRunner
from grpoflow.multiturn.tools import load_tools, tool_from_function
from grpoflow.multiturn.trajectory import to_batch
from grpoflow.multiturn.turns import ToolUse, opening_messages
from grpoflow.rollout.batcher import BatchCalls, RequestBatcher, StepEngine
from grpoflow.rollout.protocol import RolloutEngine, SamplingParams


class Kind(Protocol):
    multi_turn: bool
    agent: bool

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None) -> Played: ...

    def close(self) -> None: ...


def run_rollout(kind: Kind, engine: RolloutEngine, items: list[RolloutItem], params: SamplingParams,
                seed: int | None, *, deterministic: bool = True, pad_token_id: int = 0,
                decode: Callable[[list[int]], str] | None = None) -> Batch:
    """`params.n` trajectories of each item, played over `engine` (prompt-major; an agent episode may give
    several samples). `decode(ids)`: prompt texts of multi-turn samples."""
    step_engine: StepEngine = engine if hasattr(engine, "admit") else BatchCalls(engine)  # type: ignore[assignment]

    async def main() -> Played:
        batcher = RequestBatcher(step_engine, version=lambda: engine.version, deterministic=deterministic,
                                 max_wait_s=getattr(kind, "admission_wait_s", None))
        server = asyncio.ensure_future(batcher.serve())
        try:
            played = await kind.play(batcher, items, params, seed)
        except BaseException:
            server.cancel()
            with contextlib.suppress(BaseException):
                await server
            raise
        batcher.close()
        await server
        return played

    try:
        played = asyncio.run(main())
    finally:
        end = getattr(engine, "end_rollout", None)
        if end is not None:
            end()
    return played_batch(played, kind.multi_turn, pad_token_id=pad_token_id, decode=decode)


def played_batch(played: Played, multi_turn: bool, *, pad_token_id: int,
                 decode: Callable[[list[int]], str] | None) -> Batch:
    """The samples as a Batch: group ids from their items' positions, facts in `infos`; a multi-turn sample's
    prompt text is its opening, rendered."""
    trajectories = [t for _, t, _ in played]
    texts = [decode(t.prompt_ids) if decode is not None else "" for t in trajectories] if multi_turn else []
    batch = to_batch(trajectories, pad_token_id=pad_token_id, prompt_texts=texts, rows=[], multi_turn=multi_turn)
    assert batch.policy_version is not None
    newest = max(int(batch.policy_version.max()) if len(batch) else 0, 0)  # a sample with no model turn
    return batch.replace(group_ids=torch.tensor([g for g, _, _ in played], dtype=torch.long),
                         policy_version=torch.where(batch.policy_version < 0, newest, batch.policy_version),
                         infos=[info for _, _, info in played])


def build_rollout(cfg: Config, tokenizer: Any) -> Union[SingleTurn, EnvLoop, Any]:
    """The kind of rollout `cfg.rollout` asks for (close it with `.close()`)."""
    if cfg.rollout.agent:
        return build_agent_episodes(cfg, tokenizer)
    if cfg.rollout.multi_turn:
        return build_env_loop(cfg, tokenizer)
    return SingleTurn(tokenizer)


def opening_of(cfg: Config) -> Callable[[dict], list[dict]]:
    d = cfg.data

    def opening(row: dict) -> list[dict]:
        """The dataset prompt as chat messages (with data.system_prompt), when the environment gives none."""
        prompt = row.get(d.prompt_key)
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        return with_system_prompt(messages, d.system_prompt)

    return opening


def build_agent_episodes(cfg: Config, tokenizer: Any) -> Any:
    """The agent of `rollout.agent` and a started endpoint (imports fastapi: the `agents` extra)."""
    from grpoflow.multiturn.agents import AgentEpisodes, load_agent
    from grpoflow.multiturn.endpoint import Endpoint

    r = cfg.rollout
    assert r.agent
    agent = load_agent(r.agent)
    endpoint = Endpoint(tokenizer, model_name=r.agent_model, tool_parser=r.tool_parser, max_calls=r.max_turns).start()
    return AgentEpisodes(agent, endpoint, timeout_s=r.agent_timeout_s, error_score=cfg.reward.error_score,
                         opening=opening_of(cfg))


def build_env_loop(cfg: Config, tokenizer: Any) -> EnvLoop:
    """The loop for `cfg.rollout`: its environment class, its tools (the configured ones and those the environment
    declares, run by a ToolRunner: `EnvLoop.close` stops it), and a renderer whose template was checked."""
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
    return EnvLoop(renderer, env_cls=env_cls, tools=tools, max_turns=r.max_turns, opening=opening_of(cfg),
                   system_prompt=cfg.data.system_prompt)


def prompt_text(renderer: ChatRenderer, messages: list[dict]) -> str:
    """The opening of a conversation as the template renders it (what a multi-turn sample's prompt says)."""
    return renderer.render(opening_messages(messages), add_generation_prompt=True)
