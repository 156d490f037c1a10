"""Trajectories as coroutines: a plain sample (`SingleTurn`), or a conversation with an environment and tools
(`EnvLoop`). Each trajectory awaits its model turns from the request batcher (engines/batcher.py), which
batches every trajectory's requests continuously; none waits for another's turn.

A conversation: sample a turn (at most the budget left, ending at the template's end-of-turn token), let
the environment see it (or run its tool calls), append the reply as rendered ids
(`chat.ChatRenderer.continuation_ids`), and go on until the environment is done, the model ends with
EOS, the budget or `rollout.multi_turn.max_turns` runs out (the rules in turns.py). The environment sees every
model turn, the last one too. A trajectory's next turn names its client as KV key, so the engine
prefills only the tokens added since its last turn.

The environment's seed is the same for a prompt's `n` trajectories, so they start from the same state;
turn t of sample j draws from `turns.stream_seed(seed, i, n, j, t)`.

Partial rollout (rollout.partial, APRIL-style; the controller's side is controller/partial.py) is this same path:
a rollout may be given a pause quota and items that carry their samples so far (`RolloutItem.carried`: each a
paused `Trajectory`, or nothing yet; `RolloutItem.finished`: those done in an earlier rollout). `play_each` counts
the items whose samples have all finished (`Quota`); once `quota` are complete, and every item marked
`must_finish` (one whose oldest token would otherwise grow too stale) is too, it pauses the batcher
(`RequestBatcher.pause`): at that point, set by token counts, every sample still running comes back paused, its
open turn's tokens so far (with their log-probs and the weight version of each) in `Trajectory.open`; a finished
one comes back as the row the controller trains on (rollout.py renders it where it was played). Each trajectory
resumes from its own previous output: a single-turn sample asks for the rest
of its budget after its ids so far (re-prefilled under the new weights), drawing from its own random stream at
its token offset (`Request.position`), so its tokens do not depend on where the pause fell beyond the weights
that sampled them. A paused conversation is plain data too (never the environment): to go on, a fresh
environment is `reset` with the same row and seed and stepped with each recorded model turn (tool turns run
their calls again), each reply must render to exactly the recorded ids (`EnvLoop.replay`), then the open turn
continues from its turn's stream at its offset. So rollout.partial needs environments and tools whose replies
depend only on the row, the seed and the model's turns; agent programs (their state is a user program's) are
refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from grpoflow.errors import UserError
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import GuardedEnvironment, with_system_prompt
from grpoflow.trajectories.trajectory import EndState, Segment, Trajectory
from grpoflow.trajectories.turns import (Carried, SampleInfo, ToolUse, TurnStop, add_model_turn, count_engine_work,
                                     env_seeds, first_turn_seeds, floors_of, info_of, joined, read_turn, stream_seed)
from grpoflow.engines.batcher import Client, RequestBatcher
from grpoflow.engines.protocol import Completion, Request, SamplingParams

# An environment's opening longer than this many characters per allowed token (data.max_prompt_length) is over it
# without tokenizing: tokenizers average 3-5 characters per token, a run of spaces a few dozen at most.
MAX_CHARS_PER_TOKEN = 64


@dataclass
class RolloutItem:
    """One prompt as a rollout worker receives it: its ids, dataset index (seeds its streams), position in the
    step's prompts (its group id), for multi-turn runs its dataset row, and for a partial rollout (the module
    docstring) its n samples so far (`carried[j]`: the paused trajectory, None: not begun or in `finished`), the
    samples that finished in an earlier rollout, the seed of the rollout its samples started in (their streams and
    their environment's seed derive from it), and whether they must all finish in this rollout."""
    ids: list[int]
    index: int
    position: int
    row: dict | None = None
    carried: list[Trajectory | None] | None = None
    finished: tuple[int, ...] = ()
    seed: int | None = None
    must_finish: bool = False


Played = list[tuple[int, Trajectory, SampleInfo, Carried]]  # (group id, sample, its facts, what it carries)


class Quota:
    """Counts the items whose samples have all finished and pauses the batcher once `quota` are complete and no
    `must_finish` item is still open (at once, when that already holds)."""

    def __init__(self, batcher: RequestBatcher, items: list[RolloutItem], quota: int) -> None:
        self.batcher, self.items, self.quota = batcher, items, quota
        self.left = [len(item.carried or []) - len(item.finished) for item in items]  # samples still to finish
        self.complete = sum(count == 0 for count in self.left)
        self.due = sum(count > 0 and item.must_finish for item, count in zip(items, self.left))
        self._check()

    def finished(self, k: int) -> None:
        """A sample of item `k` finished."""
        self.left[k] -= 1
        if self.left[k] == 0:
            self.complete += 1
            self.due -= self.items[k].must_finish
        self._check()

    def _check(self) -> None:
        if self.complete >= self.quota and not self.due:
            self.batcher.pause()


class CountedClient(Client):
    """A carried sample's client (rollout.partial): when its trajectory is done, the sample counts as finished in
    this rollout unless its last request paused, at once: the trajectory waited on nothing since that request came
    back, so the batcher has not ticked since and the pause point stays set by token counts."""

    def __init__(self, client: Client, finished: Callable[[], None]) -> None:
        super().__init__(client.batcher, client.order)
        self.finished, self.paused, self.over = finished, False, False

    async def generate(self, request: Request) -> Completion:
        c = await super().generate(request)
        self.paused = c.finish == "paused"
        return c

    def done(self) -> None:
        super().done()
        if not self.over and not self.paused:
            self.finished()
        self.over = True


async def play_each(batcher: RequestBatcher, items: list[RolloutItem], n: int,
                    trajectory: Callable[[Client, RolloutItem, int], Awaitable[Trajectory]], *,
                    quota: int | None = None) -> Played:
    """Every (item, sample) as its own coroutine `trajectory(client, item, j)` (which calls `client.done()` when it
    needs the engine no more), gathered in order.

    An item that carries its samples so far (rollout.partial, the module docstring): a sample that finished in an
    earlier rollout only counts (nothing of it comes back: the controller holds its row), the others go on from
    where they stopped, and each comes back as its training row with, if it paused, its trajectory so far
    (`Carried.trajectory`, `.paused`) and, if it finished in this rollout, the batcher tick it finished at
    (`finished_at`: which groups completed first); `Carried.episode` is k * n + j. With `quota`, every item
    carries its n samples, and the batcher pauses once `quota` items are complete (`Quota`)."""
    if quota is not None and any(item.carried is None or len(item.carried) != n for item in items):
        raise ValueError(f"a partial rollout's item needs the progress of its {n} samples (RolloutItem.carried); "
                         "the controller's PartialQueue sends them.")
    rule = Quota(batcher, items, quota) if quota is not None else None
    clients = [batcher.client(k) for k in range(len(items) * n)]  # all open before the first tick
    finished_at = [-1] * len(clients)

    def finished(k: int, j: int) -> None:
        finished_at[k * n + j] = batcher.ticks
        if rule is not None:
            rule.finished(k)

    async def sample(k: int, j: int) -> tuple[int, Trajectory, SampleInfo, Carried] | None:
        item, client = items[k], clients[k * n + j]
        if item.carried is None:
            t = await trajectory(client, item, j)
            return item.position, t, info_of(t), Carried(episode=k * n + j)
        if j in item.finished:  # finished in an earlier rollout: it only counts
            client.done()
            return None
        t = await trajectory(CountedClient(client, lambda: finished(k, j)), item, j)
        paused = t.end is EndState.PAUSED
        return item.position, t, info_of(t), Carried(episode=k * n + j, trajectory=t if paused else None,
                                                     paused=paused, finished_at=finished_at[k * n + j])

    played = await asyncio.gather(*(sample(k, j) for k in range(len(items)) for j in range(n)))
    return [p for p in played if p is not None]


def head_of(t: Trajectory | None) -> Completion:
    """The open turn of a paused trajectory (nothing: none), as the start of the completion that continues it."""
    turn = t.open if t is not None and t.open is not None else Segment([])
    return Completion(list(turn.ids), list(turn.log_probs or []), list(turn.versions or []), "paused",
                      floors=list(turn.floors or []))


class SingleTurn:
    """One sample per (prompt, j): a single request, no chat template needed; a carried sample (rollout.partial)
    asks for the rest of its budget after its ids so far."""
    multi_turn = False
    agent = False
    can_pause, replays_on_resume = True, False  # a paused sample goes on from its tokens so far
    admission_wait_s = None  # the batcher waits for every trajectory between turns (deterministic)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None, quota: int | None = None) -> Played:
        streams = first_turn_seeds(seed, [it.index for it in items], params.n)
        stream_of = {(id(it), j): streams[k * params.n + j] for k, it in enumerate(items) for j in range(params.n)}

        async def sample(client: Client, item: RolloutItem, j: int) -> Trajectory:
            carried = item.carried[j] if item.carried is not None else None
            head = head_of(carried) if carried is not None else Completion([], [], [], "")
            stream = stream_of[id(item), j] if item.carried is None else \
                stream_seed(item.seed, item.index, params.n, j, 0)
            prompt = item.ids + head.ids
            try:
                c = joined(head, await client.generate(Request(
                    tuple(prompt), params.max_new_tokens - len(head.ids), stream, tuple(params.stop_token_ids),
                    params.temperature, params.top_p, position=len(head.ids))))
            finally:
                client.done()
            t = Trajectory(list(item.ids), [])
            if c.finish == "paused":
                paused(t, c, len(prompt))
                return t
            add_model_turn(t, c, self.tokenizer.decode(c.ids, skip_special_tokens=True), len(prompt))
            t.end = EndState.TOKEN_BUDGET if c.truncated else EndState.EOS
            return t

        return await play_each(batcher, items, params.n, sample, quota=quota)

    def close(self) -> None:
        pass


def paused(t: Trajectory, c: Completion, prompt_tokens: int) -> None:
    """`t` paused in its open turn `c` (rollout.partial; asked with `prompt_tokens` of context)."""
    count_engine_work(t, c, prompt_tokens)
    t.open = Segment(list(c.ids), list(c.log_probs), min(c.versions, default=0), list(c.versions), floors_of(c))
    t.end = EndState.PAUSED


class EnvLoop:
    """Conversations with an environment (`rollout.multi_turn.env`) and/or tools (`rollout.multi_turn.tools`)."""
    multi_turn = True
    agent = False
    can_pause, replays_on_resume = True, True  # a paused conversation is replayed on a fresh environment
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
                   seed: int | None, quota: int | None = None) -> Played:
        seed_of = {id(it): s for it, s in zip(items, env_seeds(seed, [it.index for it in items]))}
        return await play_each(batcher, items, params.n, lambda client, item, j: self.trajectory(
            client, item, j, params, seed, seed_of[id(item)]), quota=quota)

    async def trajectory(self, client: Client, item: RolloutItem, j: int, params: SamplingParams, seed: int | None,
                         env_seed: int) -> Trajectory:
        """One conversation; a carried one (rollout.partial) with its own seed, replayed on a fresh environment up
        to its open turn, which goes on from its tokens so far."""
        carried = item.carried[j] if item.carried is not None else None
        if item.carried is not None:
            seed, env_seed = item.seed, env_seeds(item.seed, [item.index])[0]
        env = await self.new_env()
        t = Trajectory([], [])
        try:
            t = await self.opened(env, item.row or {}, env_seed)
            head = None
            if carried is not None:
                t = await self.replay(env, t, carried, item, j)
                if env is not None and env.failure is not None:
                    return t
                head = head_of(carried)
            await self.converse(client, t, env, item, j, params, seed, head)
            return t
        finally:
            client.done()
            if env is not None:
                if t.end is not EndState.PAUSED:  # over (or failed): the environment's reward
                    t.rewards = await env.reward()
                    t.end = env.end or t.end
                await env.close()

    async def new_env(self) -> GuardedEnvironment | None:
        """A started environment for one trajectory (None: a tools-only loop)."""
        if self.env_cls is None:
            return None
        env = GuardedEnvironment(self.env_cls, self.env_args, timeout_s=self.env_timeout_s)
        await env.start()
        return env

    async def opened(self, env: GuardedEnvironment | None, row: dict, env_seed: int) -> Trajectory:
        """A conversation as it opens: the environment's `reset` (or the dataset prompt), rendered and bounded.

        An opening over `max_prompt_length` tokens fails its environment (the trajectory ends "error", as after a
        `reset` that raised, from the dataset prompt); one over MAX_CHARS_PER_TOKEN characters per allowed token is
        refused before it is tokenized (a 2 MB opening took 1.2 GB to tokenize)."""
        first = await env.reset(row, env_seed) if env is not None else None
        messages = with_system_prompt(first if first is not None else self.opening(row), self.system_prompt)
        limit = self.max_prompt_length
        if first is not None and env is not None and limit is not None:
            chars = sum(len(str(m.get("content") or "")) for m in messages)
            ids = self.renderer.prompt_ids(messages) if chars <= MAX_CHARS_PER_TOKEN * limit else None
            if ids is None or len(ids) > limit:
                size = f"{chars} characters" if ids is None else f"{len(ids)} tokens"
                env.refuse("reset", f"opened a conversation of {size}, over data.max_prompt_length={limit}; "
                                    f"raise data.max_prompt_length or shorten the environment's opening")
                messages = with_system_prompt(self.opening(row), self.system_prompt)
            else:
                return Trajectory(ids, list(messages))
        return Trajectory(self.renderer.prompt_ids(messages), list(messages))

    async def converse(self, client: Client, t: Trajectory, env: GuardedEnvironment | None, item: RolloutItem, j: int,
                       params: SamplingParams, seed: int | None, head: Completion | None = None) -> None:
        """Turns from `t.turns` on until the conversation is over, or until the batcher pauses a turn
        (rollout.partial): then that turn's tokens so far are `t.open`. `head`: the first turn's tokens sampled
        in an earlier rollout; the turn goes on from them at their offset in its random stream. Sets `t.end`
        (trajectory.EndState)."""
        budget, end = params.max_new_tokens, self.renderer.turn.end_token_id
        t.end = EndState.MAX_TURNS  # unless the loop below ends it otherwise
        for turn in range(t.turns, self.max_turns):
            before, head = head or Completion([], [], [], ""), None
            prompt = tuple(t.prompt_ids + t.response_ids + before.ids)
            c = await client.generate(Request(prompt, budget - t.used - len(before.ids),
                                              stream_seed(seed, item.index, params.n, j, turn), (end,),
                                              params.temperature, params.top_p, key=client.order,
                                              position=len(before.ids)))
            c = joined(before, c)
            if c.finish == "paused":
                paused(t, c, len(prompt))
                return
            text = self.renderer.decode(c.ids)
            add_model_turn(t, c, text, len(prompt))
            stop = read_turn(c.ids, cut=c.truncated, end_of_turn=end)  # cut at the budget left, or ended how
            ended = EndState.TOKEN_BUDGET if stop is TurnStop.CUT else EndState.EOS if stop is not \
                TurnStop.END_OF_TURN else EndState.MAX_TURNS if turn + 1 >= self.max_turns else None
            replies, over = await self.answer(t, env, text, ended is not None)
            if over or ended is not None:
                t.end = ended or (EndState.ENV_DONE if env is not None else EndState.STOP)
                return
            ids = self.renderer.continuation_ids(t.messages, replies)
            if t.used + len(ids) >= budget:
                t.end = EndState.TOKEN_BUDGET  # the reply and one more token do not fit in the budget
                return
            t.segments.append(Segment(ids))
            t.messages += replies

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

    async def replay(self, env: GuardedEnvironment | None, t: Trajectory, recorded: Trajectory, item: RolloutItem,
                     j: int) -> Trajectory:
        """`t`, a conversation `env.reset` just opened, brought to where `recorded` paused: each recorded model turn
        is added and answered again (the environment steps on it, or its tool calls run), and each reply must render
        to the recorded ids (a UserError names the turn otherwise). The engine counts (prefilled, context, KV reuse)
        are the recorded ones: nothing is sampled here. An environment that fails on replay (an error or a timeout)
        ends the conversation there, as it would have in an uninterrupted rollout."""
        who = env.name if env is not None else "the tools"
        if t.prompt_ids != recorded.prompt_ids:
            raise not_replayable(f"{who}.reset opened the conversation", "its opening", item, j)
        model, replies = recorded.segments[0::2], recorded.segments[1::2]
        assert len(model) == len(replies) == recorded.turns, "a paused conversation alternates model turns and replies"
        for turn, (said, reply) in enumerate(zip(model, replies)):
            versions = said.versions if said.versions is not None else [said.version or 0] * len(said.ids)
            text = self.renderer.decode(said.ids)
            add_model_turn(t, Completion(said.ids, said.log_probs or [], versions, "stop"), text, 0)
            at = len(t.messages)
            answer, over = await self.answer(t, env, text, False)
            if env is not None and env.failure is not None:
                return t
            ids = [] if over else self.renderer.continuation_ids(t.messages, answer)
            if over or ids != reply.ids or answer != recorded.messages[at:at + len(answer)]:
                source = "its tool calls" if self.tools is not None and self.tools.calls_in(text) is not None else who
                raise not_replayable(f"{source} answered model turn {turn + 1}", "the recorded reply", item, j)
            t.segments.append(Segment(ids))
            t.messages += answer
        if t.step_reward != recorded.step_reward:
            raise not_replayable(f"{who}'s step rewards", "the recorded ones", item, j)
        t.prefilled, t.context = recorded.prefilled, recorded.context
        t.kv_reused, t.kv_evicted = recorded.kv_reused, recorded.kv_evicted
        return t

    def close(self) -> None:
        """Stop the tool processes."""
        if self.tools is not None:
            self.tools.runner.close()


def not_replayable(what: str, recorded: str, item: RolloutItem, j: int) -> UserError:
    return UserError(
        f"rollout.partial continues a paused conversation (dataset index {item.index}, sample {j}) by replaying it "
        f"on a fresh environment, and on replay {what} differently from {recorded}: rollout.partial needs "
        "environments and tools whose replies depend only on the row, the seed and the model's turns (draw any "
        "randomness from reset's seed, not from an unseeded random or the clock), or unset rollout.partial.enable.")
