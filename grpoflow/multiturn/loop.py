"""Trajectories as coroutines: a plain sample (`SingleTurn`), or a conversation with an environment and tools
(`EnvLoop`). Each trajectory awaits its model turns from the request batcher (rollout/batcher.py), which
batches every trajectory's requests continuously; none waits for another's turn.

A conversation: sample a turn (at most the budget left, ending at the template's end-of-turn token), let
the environment see it (or run its tool calls), append the reply as rendered ids
(`chat.ChatRenderer.continuation_ids`), and go on until the environment is done, the model ends with
EOS, the budget or `rollout.multi_turn.max_turns` runs out (the rules in turns.py). The environment sees every
model turn, the last one too. A trajectory's next turn names its client as KV key, so the engine
prefills only the tokens added since its last turn.

The environment's seed is the same for a prompt's `n` trajectories, so they start from the same state;
turn t of sample j draws from `turns.stream_seed(seed, i, n, j, t)`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from grpoflow.multiturn.chat import ChatRenderer
from grpoflow.multiturn.env import GuardedEnvironment, with_system_prompt
from grpoflow.multiturn.trajectory import Segment, Trajectory
from grpoflow.multiturn.turns import (SampleInfo, ToolUse, add_model_turn, count_engine_work, env_seeds,
                                     first_turn_seeds, info_of, joined, stream_seed)
from grpoflow.rollout.batcher import Client, RequestBatcher
from grpoflow.rollout.protocol import Completion, Request, SamplingParams

if TYPE_CHECKING:  # partial.py builds on this module
    from grpoflow.multiturn.partial import Progress


@dataclass
class RolloutItem:
    """One prompt as a rollout worker receives it: its ids, dataset index (seeds its streams), position in the
    step's prompts (its group id), for multi-turn runs its dataset row, and for a partial rollout the progress of
    its n samples so far and whether they must all finish in this rollout (multiturn/partial.py)."""
    ids: list[int]
    index: int
    position: int
    row: dict | None = None
    carried: list[Progress] | None = None
    must_finish: bool = False


Played = list[tuple[int, Trajectory, SampleInfo]]  # (group id, sample, its facts), prompt-major


async def play_each(batcher: RequestBatcher, items: list[RolloutItem], n: int,
                    trajectory: Callable[[Client, RolloutItem, int], Any]) -> Played:
    """Every (item, sample) as its own coroutine `trajectory(client, item, j)`, gathered in order."""
    clients = [batcher.client(k) for k in range(len(items) * n)]
    pairs = [(item, j) for item in items for j in range(n)]
    done = await asyncio.gather(*(trajectory(c, item, j) for c, (item, j) in zip(clients, pairs)))
    return [(item.position, t, info_of(t, episode=k)) for k, ((item, _), t) in enumerate(zip(pairs, done))]


class SingleTurn:
    """One sample per (prompt, j): a single request, no chat template needed."""
    multi_turn = False
    agent = False
    admission_wait_s = None  # the batcher waits for every trajectory between turns (deterministic)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None) -> Played:
        streams = first_turn_seeds(seed, [it.index for it in items], params.n)
        stream_of = {(id(it), j): streams[k * params.n + j] for k, it in enumerate(items) for j in range(params.n)}

        async def sample(client: Client, item: RolloutItem, j: int) -> Trajectory:
            try:
                c = await client.generate(Request(tuple(item.ids), params.max_new_tokens, stream_of[id(item), j],
                                                  tuple(params.stop_token_ids), params.temperature, params.top_p))
            finally:
                client.done()
            t = Trajectory(list(item.ids), [])
            add_model_turn(t, c, self.tokenizer.decode(c.ids, skip_special_tokens=True), len(item.ids))
            t.truncated = c.truncated
            t.ended = "token_budget" if c.truncated else "eos"
            return t

        return await play_each(batcher, items, params.n, sample)

    def close(self) -> None:
        pass


class EnvLoop:
    """Conversations with an environment (`rollout.multi_turn.env`) and/or tools (`rollout.multi_turn.tools`)."""
    multi_turn = True
    agent = False
    admission_wait_s = None  # the batcher waits for every trajectory between turns (deterministic)

    def __init__(self, renderer: ChatRenderer, *, env_cls: type | None, tools: ToolUse | None,
                 max_turns: int, opening: Callable[[dict], list[dict]], system_prompt: str | None = None,
                 max_prompt_length: int | None = None, env_args: dict | None = None,
                 env_timeout_s: float = 60.0) -> None:
        """`env_cls(**env_args)`: one environment per trajectory (rollout.multi_turn.env, .env_args), each call
        within `env_timeout_s` (env.GuardedEnvironment); `opening(row)`: the conversation's first messages when the
        environment gives none (the dataset prompt); `system_prompt` (data.system_prompt) opens every
        conversation that has no system message of its own; `max_prompt_length` (data.max_prompt_length) bounds
        the opening an environment's `reset` writes."""
        self.renderer, self.env_cls, self.tools, self.max_turns = renderer, env_cls, tools, max_turns
        self.opening, self.system_prompt, self.max_prompt_length = opening, system_prompt, max_prompt_length
        self.env_args, self.env_timeout_s = dict(env_args or {}), env_timeout_s

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None) -> Played:
        seed_of = {id(it): s for it, s in zip(items, env_seeds(seed, [it.index for it in items]))}
        return await play_each(batcher, items, params.n, lambda client, item, j: self.trajectory(
            client, item, j, params, seed, seed_of[id(item)]))

    async def trajectory(self, client: Client, item: RolloutItem, j: int, params: SamplingParams, seed: int | None,
                         env_seed: int) -> Trajectory:
        env = await self.new_env()
        t = Trajectory([], [])
        try:
            t = await self.opened(env, item.row or {}, env_seed)
            await self.converse(client, t, env, item, j, params, seed)
            return t
        finally:
            client.done()
            if env is not None:
                t.rewards = await env.reward()
                t.ended = env.ended or t.ended
                await env.close()

    async def new_env(self) -> GuardedEnvironment | None:
        """A started environment for one trajectory (None: a tools-only loop)."""
        if self.env_cls is None:
            return None
        env = GuardedEnvironment(self.env_cls, self.env_args, timeout_s=self.env_timeout_s)
        await env.start()
        return env

    async def opened(self, env: GuardedEnvironment | None, row: dict, env_seed: int) -> Trajectory:
        """A conversation as it opens: the environment's `reset` (or the dataset prompt), rendered and bounded."""
        first = await env.reset(row, env_seed) if env is not None else None
        messages = with_system_prompt(first if first is not None else self.opening(row), self.system_prompt)
        t = Trajectory(self.renderer.prompt_ids(messages), list(messages))
        if first is not None and self.max_prompt_length is not None and len(t.prompt_ids) > self.max_prompt_length:
            assert env is not None
            raise ValueError(f"{env.name}.reset opened a conversation of {len(t.prompt_ids)} tokens, "
                             f"over data.max_prompt_length={self.max_prompt_length}; raise data.max_prompt_length "
                             "or shorten the environment's opening.")
        return t

    async def converse(self, client: Client, t: Trajectory, env: GuardedEnvironment | None, item: RolloutItem, j: int,
                       params: SamplingParams, seed: int | None, head: Completion | None = None) -> Completion | None:
        """Turns from `t.turns` on until the conversation is over (None), or until the batcher pauses a turn
        (rollout.partial): then that turn's tokens so far come back. `head`: the first turn's tokens sampled
        in an earlier rollout; the turn goes on from them at their offset in its random stream. Sets `t.ended`
        (trajectory.END_REASONS)."""
        budget, end = params.max_new_tokens, self.renderer.turn.end_token_id
        t.ended = "max_turns"  # unless the loop below ends it otherwise
        for turn in range(t.turns, self.max_turns):
            before, head = head or Completion([], [], [], ""), None
            prompt = tuple(t.prompt_ids + t.response_ids + before.ids)
            c = await client.generate(Request(prompt, budget - t.used - len(before.ids),
                                              stream_seed(seed, item.index, params.n, j, turn), (end,),
                                              params.temperature, params.top_p, key=client.order,
                                              position=len(before.ids)))
            c = joined(before, c)
            if c.finish == "paused":
                count_engine_work(t, c, len(prompt))
                t.ended = "paused"
                return c
            text = self.renderer.decode(c.ids)
            add_model_turn(t, c, text, len(prompt))
            t.truncated = c.truncated  # cut at the budget left
            ended = "token_budget" if c.truncated else "eos" if not c.ids or c.ids[-1] != end else \
                "max_turns" if turn + 1 >= self.max_turns else None
            replies, over = await self.answer(t, env, text, ended is not None)
            if over or ended is not None:
                t.ended = ended or ("env_done" if env is not None else "stop")
                return None
            ids = self.renderer.continuation_ids(t.messages, replies)
            if t.used + len(ids) >= budget:
                t.truncated = True  # the reply and one more token do not fit in the budget
                t.ended = "token_budget"
                return None
            t.segments.append(Segment(ids))
            t.messages += replies
        return None

    async def answer(self, t: Trajectory, env: GuardedEnvironment | None, text: str,
                     last: bool) -> tuple[list[dict], bool]:
        """(the reply messages, whether the conversation is over): the turn's tool calls run (not on a last
        turn: no reply could follow), else the environment steps on it, else the answer ends it."""
        calls = self.tools.calls_in(text) if self.tools is not None else None
        if calls is not None:
            assert self.tools is not None
            if last:
                return [], True
            return await asyncio.to_thread(self.tools.run, t, calls[0], calls[1], self.renderer.encode), False
        if env is not None:
            stepped = await env.step(text)
            t.step_reward += stepped.reward
            return stepped.messages, stepped.done
        return [], True

    def close(self) -> None:
        """Stop the tool processes."""
        if self.tools is not None:
            self.tools.runner.close()
