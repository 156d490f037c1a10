"""Partial rollout (`rollout.partial`, APRIL-style): samples that may pause and continue in a later rollout, with
the weights of that later step; single-turn samples and conversations with an environment or tools alike.

A step's rollout gets more groups than the step trains (carried-over ones first, then new prompts), each sample
with its `Progress` so far. The rollout plays the unfinished samples over the request batcher and counts the
groups whose samples have all finished (`Quota`); once `quota` groups are complete, and every group marked
`must_finish` (one whose oldest token would otherwise grow too stale) is too, it pauses the batcher
(`RequestBatcher.pause`): at that point, set by token counts, every sample still running is handed back with the
tokens it sampled so far, their log-probs and the weight version of each. A paused sample's next request is its
ids so far (re-prefilled under the new weights) with the budget left, drawing from its own random stream at its
token offset (`Request.position`), so its tokens do not depend on where the pause fell beyond the weights that
sampled them.

A paused conversation (`PartialEnvLoop`) is plain data too: its trajectory before the open turn (prompt ids,
each model turn's sampled ids with log-probs and per-token versions, each reply's rendered ids, the messages)
and the open turn's tokens. Never the environment: to go on, a fresh environment is `reset` with the same row
and seed and stepped with each recorded model turn (tool turns run their calls again), and each reply must
render to exactly the recorded ids (`replay`); then the open turn continues from its turn's random stream
(turns.stream_seed) at its offset. So rollout.partial needs environments and tools whose replies depend only
on the row, the seed and the model's turns; agent programs (their state is a user program's) are refused.

The controller's side (which groups a step trains, staleness, checkpoints) is controller/partial.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from grpoflow.errors import UserError
from grpoflow.multiturn.env import GuardedEnvironment
from grpoflow.multiturn.loop import EnvLoop, Played, RolloutItem, SingleTurn
from grpoflow.multiturn.trajectory import Segment, Trajectory
from grpoflow.multiturn.turns import SampleInfo, add_model_turn, env_seeds, info_of, stream_seed
from grpoflow.rollout.batcher import Client, RequestBatcher
from grpoflow.rollout.protocol import Completion, Request, SamplingParams


@dataclass
class Progress:
    """One sample of a partial rollout so far, as plain data: what the controller's pool and a checkpoint hold."""
    seed: int             # the seed of the rollout it started in: its streams and its environment's seed derive from it
    ids: list[int] = field(default_factory=list)        # the open turn's tokens so far (single-turn: the sample's)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)   # the weight version that sampled each of them
    finish: str = ""      # "stop" | "length" once finished; "" while it has more to sample
    text: str = ""        # single-turn: the decoded completion, once finished
    past: dict | None = None  # multi-turn: the trajectory before the open turn (finished: all of it), as_data()

    def continued(self, c: Completion, text: str) -> "Progress":
        """This single-turn sample after a request that went on from it returned `c` (finish "paused": not yet)."""
        return Progress(self.seed, self.ids + list(c.ids), self.log_probs + list(c.log_probs),
                        self.versions + list(c.versions), "" if c.finish == "paused" else c.finish, text)

    @property
    def oldest(self) -> int | None:
        """The weight version of its oldest token (None: nothing sampled yet)."""
        past = [v for s in (self.past or {}).get("segments", []) if s["log_probs"] is not None
                for v in (s["versions"] if s["versions"] is not None else [s["version"]] * len(s["ids"]))]
        return min(past + self.versions, default=None)

    def trajectory(self, prompt_ids: list[int]) -> Trajectory:
        """The sample as a trajectory: a conversation's recorded one (the open turn left out), or the one model
        segment of a single-turn sample after `prompt_ids` (per-token versions kept)."""
        if self.past is not None:
            return Trajectory.from_data(self.past)
        t = Trajectory(list(prompt_ids), [{"role": "assistant", "content": self.text}], turns=1,
                       truncated=self.finish == "length",
                       ended={"": "paused", "length": "token_budget"}.get(self.finish, "eos"))
        if self.ids:
            t.segments.append(Segment(list(self.ids), list(self.log_probs), min(self.versions), list(self.versions)))
        return t

    @staticmethod
    def from_data(data: dict) -> "Progress":
        return Progress(**data)


class Quota:
    """Counts the groups whose samples have all finished and pauses the batcher once `quota` are complete and no
    `must_finish` group is still open (at once, when that already holds)."""

    def __init__(self, batcher: RequestBatcher, items: list[RolloutItem], quota: int) -> None:
        self.batcher, self.items, self.quota = batcher, items, quota
        self.left = [sum(not p.finish for p in item.carried or []) for item in items]  # samples still to finish
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


Go = Callable[[Client, RolloutItem, int, Progress], Awaitable[tuple[Progress, SampleInfo]]]


async def play_partial(batcher: RequestBatcher, items: list[RolloutItem], n: int, quota: int, go: Go) -> Played:
    """Every unfinished sample j of every item as its own coroutine `go(client, item, j, progress)` -> (its
    progress after this rollout, its facts; `paused` if it did not finish); the finished ones only count. Each
    sample comes back with its progress in `SampleInfo.progress` and, if it finished in this rollout, the batcher
    tick it finished at (`finished_at`: which groups completed first)."""
    for item in items:
        if item.carried is None or len(item.carried) != n:
            raise ValueError(f"a partial rollout's item needs the progress of its {n} samples (RolloutItem."
                             "carried); the controller's PartialQueue sends them.")
    rule = Quota(batcher, items, quota)
    clients = [batcher.client(k) for k in range(len(items) * n)]  # all open before the first tick

    async def sample(k: int, j: int) -> tuple[Progress, SampleInfo]:
        item, client = items[k], clients[k * n + j]
        p = (item.carried or [])[j]
        try:
            if p.finish:  # finished in an earlier rollout: it only counts
                return p, SampleInfo()
            p, info = await go(client, item, j, p)
        finally:
            client.done()
        if not info.paused:
            info.finished_at = batcher.ticks
            rule.finished(k)
        return p, info

    done = await asyncio.gather(*(sample(k, j) for k in range(len(items)) for j in range(n)))
    return [(item.position, p.trajectory(item.ids), dataclasses.replace(info, progress=p))
            for item, (p, info) in zip((item for item in items for _ in range(n)), done)]


class PartialSingleTurn:
    """Single-turn samples that go on from their `RolloutItem.carried` progress (the module docstring)."""
    multi_turn = False
    agent = False
    admission_wait_s = None  # the batcher waits for every trajectory between turns (deterministic)

    def __init__(self, tokenizer: Any, quota: int) -> None:
        self.tokenizer, self.quota = tokenizer, quota

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None) -> Played:
        async def go(client: Client, item: RolloutItem, j: int, p: Progress) -> tuple[Progress, SampleInfo]:
            c = await client.generate(Request(tuple(item.ids + p.ids), params.max_new_tokens - len(p.ids),
                                              stream_seed(p.seed, item.index, params.n, j, 0),
                                              tuple(params.stop_token_ids), params.temperature, params.top_p,
                                              position=len(p.ids)))
            paused = c.finish == "paused"
            text = "" if paused else self.tokenizer.decode(p.ids + c.ids, skip_special_tokens=True)
            return p.continued(c, text), SampleInfo(prefilled=c.prefilled, context=len(item.ids) + len(p.ids),
                                                    paused=paused, ended="paused" if paused else "")

        return await play_partial(batcher, items, params.n, self.quota, go)

    def close(self) -> None:
        pass


class PartialEnvLoop:
    """Conversations of an `EnvLoop` (environment and/or tools) that go on from their progress: a paused one is
    replayed on a fresh environment, then its open turn continues (the module docstring)."""
    multi_turn = True
    agent = False
    admission_wait_s = None  # the batcher waits for every trajectory between turns (deterministic)

    def __init__(self, loop: EnvLoop, quota: int) -> None:
        self.loop, self.quota = loop, quota

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None) -> Played:
        return await play_partial(batcher, items, params.n, self.quota,
                                  lambda client, item, j, p: self.sample(client, item, j, p, params))

    async def sample(self, client: Client, item: RolloutItem, j: int, p: Progress,
                     params: SamplingParams) -> tuple[Progress, SampleInfo]:
        loop, env = self.loop, await self.loop.new_env()
        t, paused = Trajectory([], []), None
        try:
            t = await loop.opened(env, item.row or {}, env_seeds(p.seed, [item.index])[0])
            if p.past is not None:
                t = await replay(loop, env, t, Trajectory.from_data(p.past), item, j)
            head = Completion(p.ids, p.log_probs, p.versions, "paused") if p.past is not None else None
            if env is None or env.failure is None:
                paused = await loop.converse(client, t, env, item, j, params, p.seed, head)
        finally:
            if env is not None:
                if paused is None:  # over (or failed): the environment's reward, as an uninterrupted one's
                    t.rewards = await env.reward()
                    t.ended = env.ended or t.ended
                await env.close()
        if paused is not None:
            return (Progress(p.seed, list(paused.ids), list(paused.log_probs), list(paused.versions),
                             past=t.as_data()), SampleInfo(paused=True, ended="paused"))
        return Progress(p.seed, finish="length" if t.truncated else "stop", past=t.as_data()), info_of(t)

    def close(self) -> None:
        """Nothing: the loop (its tool processes) is its owner's to close."""


async def replay(loop: EnvLoop, env: GuardedEnvironment | None, t: Trajectory, recorded: Trajectory, item: RolloutItem,
                 j: int) -> Trajectory:
    """`t`, a conversation `env.reset` just opened, brought to where `recorded` paused: each recorded model turn
    is added and answered again (the environment steps on it, or its tool calls run), and each reply must render
    to the recorded ids (a UserError names the turn otherwise). The engine counts (prefilled, context, KV reuse) are the
    recorded ones: nothing is sampled here. An environment that fails on replay (an error or a timeout) ends the
    conversation there, as it would have in an uninterrupted rollout."""
    who = env.name if env is not None else "the tools"
    if t.prompt_ids != recorded.prompt_ids:
        raise not_replayable(f"{who}.reset opened the conversation", "its opening", item, j)
    model, replies = recorded.segments[0::2], recorded.segments[1::2]
    assert len(model) == len(replies) == recorded.turns, "a paused conversation alternates model turns and replies"
    for turn, (said, reply) in enumerate(zip(model, replies)):
        versions = said.versions if said.versions is not None else [said.version or 0] * len(said.ids)
        text = loop.renderer.decode(said.ids)
        add_model_turn(t, Completion(said.ids, said.log_probs or [], versions, "stop"), text, 0)
        at = len(t.messages)
        answer, over = await loop.answer(t, env, text, False)
        if env is not None and env.failure is not None:
            return t
        ids = [] if over else loop.renderer.continuation_ids(t.messages, answer)
        if over or ids != reply.ids or answer != recorded.messages[at:at + len(answer)]:
            source = "its tool calls" if loop.tools is not None and loop.tools.calls_in(text) is not None else who
            raise not_replayable(f"{source} answered model turn {turn + 1}", "the recorded reply", item, j)
        t.segments.append(Segment(ids))
        t.messages += answer
    if t.step_reward != recorded.step_reward:
        raise not_replayable(f"{who}'s step rewards", "the recorded ones", item, j)
    t.prefilled, t.context = recorded.prefilled, recorded.context
    t.kv_reused, t.kv_evicted = recorded.kv_reused, recorded.kv_evicted
    return t


def not_replayable(what: str, recorded: str, item: RolloutItem, j: int) -> UserError:
    return UserError(
        f"rollout.partial continues a paused conversation (dataset index {item.index}, sample {j}) by replaying it "
        f"on a fresh environment, and on replay {what} differently from {recorded}: rollout.partial needs "
        "environments and tools whose replies depend only on the row, the seed and the model's turns (draw any "
        "randomness from reset's seed, not from an unseeded random or the clock), or unset rollout.partial.enable.")


def partial_kind(kind: Any, tokenizer: Any, quota: int) -> PartialSingleTurn | PartialEnvLoop:
    """The partial-rollout form of a run's rollout kind (multiturn/rollout.py); agent episodes have none."""
    if isinstance(kind, EnvLoop):
        return PartialEnvLoop(kind, quota)
    if isinstance(kind, SingleTurn):
        return PartialSingleTurn(tokenizer, quota)
    raise UserError("rollout.partial cannot pause agent episodes (rollout.agent.program): their state is the agent "
                    "program's, which a checkpoint cannot hold; unset rollout.partial.enable or rollout.agent.program.")
