"""The controller's side of generation.

`Rollouts` turns prepared prompts into a sampled `Batch` through the rollout worker group: the
workers receive only token ids and prompt indices, and return tensors and decoded completions;
the prompt texts and dataset rows, which the controller already holds, are attached here.

`RolloutQueue` decides when each step's generation is submitted. Sync mode submits step t's
when step t asks for it; async mode keeps up to `ahead` later steps in flight, so they generate
while step t trains (each queued on the engines behind the weight update submitted before it).
It owns the prompt sampler's position, so a checkpoint saves the position before the oldest
step still in flight: its prompts are drawn again after a resume.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import EpochSampler
from grpoflow.distributed.worker_group import GroupCall, WorkerGroup
from grpoflow.multiturn.loop import AgentLoop
from grpoflow.rollout.protocol import PromptTokens, SamplingParams
from grpoflow.workers.rollout import RolloutWorker


@dataclass
class PendingRollout:
    """A generation call in flight for `items`, or (multi-turn) finished trajectories with their metrics."""
    items: list[PromptItem]
    call: GroupCall[Batch] | None
    done: tuple[Batch, float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def result(self) -> tuple[Batch, float]:
        """The samples (prompt-major, `n` per item, prompt texts and rows attached) and the longest time an
        engine spent generating them."""
        if self.done is not None:
            return self.done
        assert self.call is not None
        batch = self.call.result()
        n = len(batch) // max(len(self.items), 1)
        return batch.replace(prompts=[it.prompt_text for it in self.items for _ in range(n)],
                             rows=[it.row for it in self.items for _ in range(n)]), self.call.busy_s


class Rollouts:
    """Generation through the rollout worker group: one sample per call, or with an `agent` (multi-turn) whole
    trajectories, the agent loop calling the group once per turn."""

    def __init__(self, group: WorkerGroup[RolloutWorker], agent: AgentLoop | None = None) -> None:
        self.group, self.agent = group, agent
        self.turn_busy_s = 0.0  # the engines' time on the current multi-turn submit

    def submit(self, items: list[PromptItem], params: SamplingParams, seed: int | None) -> PendingRollout:
        """Start generating `params.n` samples for each item (at once with Ray; now with the local backend).
        Multi-turn trajectories are generated now, turn by turn."""
        if self.agent is not None:
            self.turn_busy_s = 0.0
            batch, metrics = self.agent.run(items, params, seed)
            return PendingRollout(items, None, done=(batch, self.turn_busy_s), metrics=metrics)
        prompts = [PromptTokens(it.prompt_ids, it.index) for it in items]
        return PendingRollout(items, self.group.submit_overlapped(RolloutWorker.generate, prompts, params, seed=seed))

    def generate_turn(self, prompts: list[PromptTokens], params: SamplingParams, seed: int | None) -> Batch:
        """One generate call over the group (the agent loop's turn)."""
        call = self.group.submit_overlapped(RolloutWorker.generate, prompts, params, seed=seed)
        batch = call.result()
        self.turn_busy_s += call.busy_s
        return batch

    def generate(self, items: list[PromptItem], params: SamplingParams, seed: int | None = None) -> Batch:
        return self.submit(items, params, seed).result()[0]


class RolloutQueue:
    """Each step's prompts and generation call, submitted up to `ahead` steps early (async mode)."""

    def __init__(self, rollouts: Rollouts, items: list[PromptItem], sampler: EpochSampler, *, prompts_per_step: int,
                 params: SamplingParams, ahead: int, last_step: int, seed_of: Callable[[int], int]) -> None:
        self.rollouts, self.items, self.sampler = rollouts, items, sampler
        self.prompts_per_step, self.params, self.ahead, self.last_step = prompts_per_step, params, ahead, last_step
        self.seed_of = seed_of  # step -> the seed of its generation
        self.next_step = 1      # the first step not yet submitted
        self.in_flight: deque[tuple[int, PendingRollout, dict[str, Any]]] = deque()  # (step, call, sampler state)

    def draw(self, count: int) -> list[PromptItem]:
        """The next `count` prompts of the sampler (also used for dynamic sampling's extra draws)."""
        return [self.items[i] for i in self.sampler.next_indices(count)]

    def take(self, step: int) -> PendingRollout:
        """Step `step`'s generation, after submitting every step up to `step + ahead` not yet submitted."""
        while self.next_step <= max(min(step + self.ahead, self.last_step), step):
            state = self.sampler.state_dict()
            pending = self.rollouts.submit(self.draw(self.prompts_per_step), self.params, self.seed_of(self.next_step))
            self.in_flight.append((self.next_step, pending, state))
            self.next_step += 1
        queued, pending, _ = self.in_flight.popleft()
        if queued != step:
            raise RuntimeError(f"rollout queue out of order: asked for step {step}, next in flight is {queued}.")
        return pending

    def state_dict(self) -> dict[str, Any]:
        """The sampler position before the oldest step in flight (so a resume draws those prompts again)."""
        return self.in_flight[0][2] if self.in_flight else self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Continue after checkpoint step `step` with the sampler at `state`."""
        self.sampler.load_state_dict(state)
        self.in_flight.clear()
        self.next_step = step + 1

    def drain(self) -> None:
        """Wait for the generations still in flight and drop them."""
        for _, pending, _ in self.in_flight:
            pending.result()
        self.in_flight.clear()


def group_ids(prompts: int, n: int) -> torch.Tensor:
    """[prompts * n] the group id of each sample of a step (prompt-major)."""
    return torch.arange(prompts).repeat_interleave(n)
