"""Partial rollout (`rollout.partial`, APRIL-style): single-turn samples that may pause and continue in a later
rollout, with the weights of that later step.

A step's rollout gets more groups than the step trains (carried-over ones first, then new prompts), each sample
with its `Progress` so far. `PartialSingleTurn` plays the unfinished samples over the request batcher and counts
the groups whose samples have all finished; once `quota` groups are complete, and every group marked
`must_finish` (one whose oldest token would otherwise grow too stale) is too, it pauses the batcher
(`RequestBatcher.pause`): at that point, set by token counts, every sample still running is handed back with
the tokens it sampled so far, their log-probs and the weight version of each. A paused sample's next request
is its prompt plus those tokens (re-prefilled under the new weights) with the budget left, drawing from its own
random stream at its token offset (`Request.position`), so its tokens do not depend on where the pause fell
beyond the weights that sampled them.

The controller's side (which groups a step trains, staleness, checkpoints) is controller/partial.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from grpoflow.multiturn.loop import Played, RolloutItem
from grpoflow.multiturn.trajectory import Segment, Trajectory
from grpoflow.multiturn.turns import SampleInfo
from grpoflow.rollout.batcher import RequestBatcher
from grpoflow.rollout.protocol import Completion, Request, SamplingParams


@dataclass
class Progress:
    """One sample of a partial rollout so far: its random stream and what earlier rollouts sampled."""
    stream: int
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weight version that sampled each token
    finish: str = ""      # "stop" | "length" once finished; "" while it has more to sample
    text: str = ""        # the decoded completion, once finished

    def continued(self, c: Completion, text: str) -> "Progress":
        """This sample after a request that went on from it returned `c` (finish "paused": not finished yet)."""
        return Progress(self.stream, self.ids + list(c.ids), self.log_probs + list(c.log_probs),
                        self.versions + list(c.versions), "" if c.finish == "paused" else c.finish, text)


def trajectory_of(prompt_ids: list[int], p: Progress) -> Trajectory:
    """A sample's progress as the one-segment trajectory of a single-turn sample (per-token versions kept)."""
    t = Trajectory(list(prompt_ids), [{"role": "assistant", "content": p.text}], turns=1,
                   truncated=p.finish == "length")
    if p.ids:
        t.segments.append(Segment(list(p.ids), list(p.log_probs), min(p.versions), list(p.versions)))
    return t


class PartialSingleTurn:
    """Single-turn samples that go on from their `RolloutItem.carried` progress and pause once `quota` groups and every
    `must_finish` one are complete (the module docstring). Each sample's `SampleInfo` says whether it paused and, if
    it finished in this rollout, at which batcher tick (`finished_at`: which groups completed first)."""
    multi_turn = False
    agent = False

    def __init__(self, tokenizer: Any, quota: int) -> None:
        self.tokenizer, self.quota = tokenizer, quota

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None) -> Played:
        n = params.n
        for item in items:
            if item.carried is None or len(item.carried) != n:
                raise ValueError(f"a partial rollout's item needs the progress of its {n} samples (RolloutItem."
                                 "carried); the controller's PartialQueue sends them.")
        left = [sum(not p.finish for p in item.carried or []) for item in items]  # samples still to finish
        complete = sum(count == 0 for count in left)
        due = sum(count > 0 and item.must_finish for item, count in zip(items, left))  # must finish first
        if complete >= self.quota and not due:
            batcher.pause()
        infos: dict[tuple[int, int], SampleInfo] = {}
        clients = [batcher.client(k) for k in range(len(items) * n)]  # all open before the first tick

        async def sample(k: int, j: int) -> Progress:
            nonlocal complete, due
            item, client = items[k], clients[k * n + j]
            p = (item.carried or [])[j]
            try:
                if p.finish:  # finished in an earlier rollout: it only counts
                    infos[k, j] = SampleInfo()
                    return p
                c = await client.generate(Request(tuple(item.ids + p.ids), params.max_new_tokens - len(p.ids),
                                                  p.stream, tuple(params.stop_token_ids), params.temperature,
                                                  params.top_p, position=len(p.ids)))
            finally:
                client.done()
            paused = c.finish == "paused"
            infos[k, j] = SampleInfo(prefilled=c.prefilled, context=len(item.ids) + len(p.ids), paused=paused,
                                     finished_at=-1 if paused else batcher.ticks)
            p = p.continued(c, "" if paused else self.tokenizer.decode(p.ids + c.ids, skip_special_tokens=True))
            if not paused:
                left[k] -= 1
                complete += left[k] == 0
                due -= left[k] == 0 and item.must_finish
                if complete >= self.quota and not due:
                    batcher.pause()
            return p

        done = await asyncio.gather(*(sample(k, j) for k in range(len(items)) for j in range(n)))
        return [(item.position, trajectory_of(item.ids, done[k * n + j]), infos[k, j])
                for k, item in enumerate(items) for j in range(n)]

    def close(self) -> None:
        pass
