"""One rollout for every kind of run: run its trajectories over a request batcher, return the samples as one
Batch (workers/rollout_kinds.py builds the kind a config asks for).

The kinds (each a `play(batcher, items, params, seed)` coroutine, loop.py and agents.py):

    SingleTurn     one request per (prompt, sample): the trivial trajectory
    EnvLoop        conversations with `rollout.multi_turn.env` and/or `rollout.multi_turn.tools`
    AgentEpisodes  `rollout.agent.program` programs through the OpenAI-compatible endpoint

The first two also resume samples a partial rollout paused (rollout.partial: items that carry their progress,
and a pause quota; loop.py); agent episodes cannot pause.

`run_rollout` plays them on an asyncio loop of its own with the engine behind a `RequestBatcher`; a rollout
worker calls it for its share of the step's prompts. Group ids are the items' positions in the step.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable, Protocol

import torch

from grpoflow.data.batch import Batch
from grpoflow.trajectories.loop import Played, RolloutItem
from grpoflow.trajectories.trajectory import to_batch
from grpoflow.engines.batcher import RequestBatcher
from grpoflow.engines.protocol import RolloutEngine, SamplingParams


class Kind(Protocol):
    multi_turn: bool
    agent: bool
    # rollout.partial, declared by the kind (the start-up check reads it, plan/checks.py): its trajectories can pause
    # and go on in a later rollout; on resume it replays what a paused one recorded (a conversation on a fresh
    # environment), so the engine must continue a paused request exactly (`exact_resume`, engines/factory.py)
    can_pause: bool
    replays_on_resume: bool

    @property
    def admission_wait_s(self) -> float | None:
        """The batcher's `max_wait_s`: None, or short for agents (their time between calls is their own)."""
        ...

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None, quota: int | None = None) -> Played: ...

    def close(self) -> None: ...


def run_rollout(kind: Kind, engine: RolloutEngine, items: list[RolloutItem], params: SamplingParams,
                seed: int | None, *, quota: int | None = None, deterministic: bool = True, pad_token_id: int = 0,
                decode: Callable[[list[int]], str] | None = None) -> Batch:
    """`params.n` trajectories of each item, played over `engine` (prompt-major; an agent episode may give
    several samples). Items may carry their samples so far, and with `quota` the rollout pauses once that many
    items are complete (rollout.partial, loop.py). `decode(ids)`: prompt texts of multi-turn samples."""
    async def main() -> Played:
        batcher = RequestBatcher(engine, version=lambda: engine.version, deterministic=deterministic,
                                 max_wait_s=kind.admission_wait_s)
        server = asyncio.ensure_future(batcher.serve())
        try:
            played = await kind.play(batcher, items, params, seed, quota)
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
        engine.end_rollout()
    return played_batch(played, kind.multi_turn, pad_token_id=pad_token_id, decode=decode)


def played_batch(played: Played, multi_turn: bool, *, pad_token_id: int,
                 decode: Callable[[list[int]], str] | None) -> Batch:
    """The samples as a Batch: group ids from their items' positions, facts in `infos`, what each carries in
    `carried`; a multi-turn sample's prompt text is its opening, rendered."""
    trajectories = [t for _, t, _, _ in played]
    texts = [decode(t.prompt_ids) if decode is not None else "" for t in trajectories] if multi_turn else []
    batch = to_batch(trajectories, pad_token_id=pad_token_id, prompt_texts=texts, rows=[], multi_turn=multi_turn)
    assert batch.policy_version is not None
    newest = max(int(batch.policy_version.max()) if len(batch) else 0, 0)  # a sample with no model turn
    return batch.replace(group_ids=torch.tensor([g for g, _, _, _ in played], dtype=torch.long),
                         policy_version=torch.where(batch.policy_version < 0, newest, batch.policy_version),
                         infos=[info for _, _, info, _ in played], carried=[c for _, _, _, c in played])

