"""Partial rollout, the controller's side (`rollout.partial`): the pool policy. The rollout is the ordinary one
(`Rollouts.submit` with the pool's samples so far and a pause quota; trajectories/loop.py resumes each from its own
previous output).

`PartialQueue` stands in for `RolloutQueue` (sync mode). It keeps a pool of groups in flight across steps:

1. New prompts top the pool up to ceil(rollout.partial.oversample x data.prompts_per_step) groups, after the
   carried-over ones (which the batcher therefore admits first).
2. A group is *due* when its oldest token is `rollout.partial.max_staleness` versions behind the weights the
   engines hold (those step t trains; with staleness 0, every group): one more step would make it too stale.
3. The rollout workers play every unfinished sample and pause once data.prompts_per_step groups are complete and
   every due group is (none is played when that is already so). So a long sample is never starved: it finishes
   within rollout.partial.max_staleness + 1 rollouts of its start, and the data keeps its long answers.
4. The step trains data.prompts_per_step complete groups: the due ones first, then in the order they completed
   (step, batcher tick, pool position); every other group, finished samples included, stays for step t+1.
5. A group still too stale at the next step (more due groups were complete than a step trains) is restarted:
   its samples are dropped and it starts again from its prompt, with the same random streams. (Restarted, not
   redrawn: a redraw would drop the prompts whose samples run long and bias the data towards short answers.)

Every token keeps the weight version that sampled it (Batch.token_versions); the actor's token-level importance
weights (actor.rollout_is=token, on by default with rollout.partial) correct for the older ones. A checkpoint saves
the pool (as the async queue saves its steps in flight), so a resumed run continues the same samples. Each saved group
holds a digest of its prompt's token ids: a resume whose training data changed under the checkpoint (a group's index
now holds another prompt, or no prompt) drops those groups with one warning, and the pool tops up with new prompts,
rather than continue samples on a prompt they were not sampled for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor
from tqdm import tqdm

from grpoflow.controller.rollouts import PendingRollout, Rollouts, attach, metrics_of
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import PromptSampler
from grpoflow.trajectories.rollout import progress_batch
from grpoflow.trajectories.trajectory import Progress
from grpoflow.engines.protocol import SamplingParams


@dataclass
class Group:
    """A prompt's n samples in flight: `item` indexes the run's training items; `done_at` = (step, tick) at which
    its last sample finished (None while some still run)."""
    item: int
    samples: list[Progress]
    done_at: tuple[int, int] | None = None

    @property
    def oldest(self) -> int | None:
        """The weight version of its oldest token (None: nothing sampled yet)."""
        return min((v for v in (p.oldest for p in self.samples) if v is not None), default=None)

    def due(self, version: int, max_staleness: int) -> bool:
        """Whether it must finish in a rollout at `version`: its oldest token (or, with none yet, the ones it is about
        to sample) would be more than `max_staleness` versions old one step later."""
        oldest = self.oldest
        return version - (version if oldest is None else oldest) >= max_staleness


def prompt_digest(prompt_ids: list[int]) -> str:
    """A short digest of a prompt's token ids: what a checkpoint's carried group was sampled for."""
    return hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()[:16]


def warn(text: str) -> None:
    tqdm.write(f"WARNING: {text}")


def partial_metrics(token_versions: Tensor, mask: Tensor, version: int) -> dict[str, float]:
    """Token staleness of a step's samples: token t of sample b is `version - token_versions[b, t]` versions old.

    token_versions, mask: [B, R] (mask 1 on the sampled tokens); version: the weights the step trains.
    staleness/max: the worst token of any sample; staleness/sample_max_mean: the mean over samples of each sample's
    worst token; staleness/mean: the mean over samples of each sample's mean token staleness; multi_version_frac:
    the fraction of samples whose tokens come from more than one version.
    """
    m = mask.bool()
    stale = (version - token_versions).float()
    count = m.sum(-1).clamp(min=1)
    worst = torch.where(m, stale, torch.zeros_like(stale)).amax(-1)
    mean = torch.where(m, stale, torch.zeros_like(stale)).sum(-1) / count
    big = torch.iinfo(torch.long).max
    newest = torch.where(m, token_versions, torch.full_like(token_versions, -big)).amax(-1)
    oldest = torch.where(m, token_versions, torch.full_like(token_versions, big)).amin(-1)
    return {"rollout/partial/staleness/max": worst.max().item(), "rollout/partial/staleness/sample_max_mean":
            worst.mean().item(), "rollout/partial/staleness/mean": mean.mean().item(),
            "rollout/partial/multi_version_frac": (newest > oldest).float().mean().item()}


class PartialQueue:
    """Each step's generation with rollout.partial (the module docstring); the interface of `RolloutQueue`."""

    def __init__(self, rollouts: Rollouts, items: list[PromptItem], sampler: PromptSampler, *, prompts_per_step: int,
                 params: SamplingParams, oversample: float, max_staleness: int, seed_of: Callable[[int], int],
                 version: Callable[[], int], pad_token_id: int,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        """`seed_of(step)`: the seed of the streams (and environments) of the prompts drawn at `step`; `version()`:
        the weights the engines hold (those the step trains, sync mode); `decode(ids)`: multi-turn samples' prompt
        texts (their rendered openings)."""
        self.rollouts, self.items, self.sampler, self.pad_token_id = rollouts, items, sampler, pad_token_id
        self.multi_turn, self.decode = rollouts.kind[0], decode
        self.prompts_per_step, self.params = prompts_per_step, params
        self.in_flight_groups = max(prompts_per_step, math.ceil(oversample * prompts_per_step))
        self.max_staleness, self.seed_of, self.version = max_staleness, seed_of, version
        self.pool: list[Group] = []
        self._position = {id(item): i for i, item in enumerate(items)}

    def draw(self, count: int) -> list[PromptItem]:
        return [self.items[i] for i in self.sampler.next_indices(count)]

    def take(self, step: int) -> PendingRollout:
        """Step `step`'s samples: restart stale groups, top the pool up, play it until enough groups are complete,
        take the first that completed."""
        version, n = self.version(), self.params.n
        restarted = 0
        for g in self.pool:
            if g.oldest is not None and version - g.oldest > self.max_staleness:
                g.samples, g.done_at = [Progress(p.seed) for p in g.samples], None
                restarted += 1
        new = self.draw(max(self.in_flight_groups - len(self.pool), 0))
        self.pool += [Group(self._position[id(it)], [Progress(self.seed_of(step)) for _ in range(n)]) for it in new]
        due = [g.due(version, self.max_staleness) for g in self.pool]
        busy = self.play(step, due)
        order = sorted((not due[k], g.done_at, k) for k, g in enumerate(self.pool) if g.done_at is not None)
        picked = {k for _, _, k in order[:self.prompts_per_step]}
        if len(picked) < self.prompts_per_step:
            raise RuntimeError(f"partial rollout: {len(picked)} groups complete after the rollout, "
                               f"{self.prompts_per_step} needed; the rollout workers stopped early.")
        chosen = [self.pool[k] for _, _, k in order[:self.prompts_per_step]]
        self.pool = [g for k, g in enumerate(self.pool) if k not in picked]
        items = [self.items[g.item] for g in chosen]
        batch = attach(progress_batch([it.prompt_ids for it in items], [g.samples for g in chosen], self.multi_turn,
                                      pad_token_id=self.pad_token_id, decode=self.decode), items)
        assert batch.token_versions is not None
        metrics = {**metrics_of(batch, self.multi_turn, False, episodes=len(batch)),
                   **partial_metrics(batch.token_versions, batch.response_mask, version),
                   "rollout/partial/new_groups": float(len(new)), "rollout/partial/restarted_groups": float(restarted),
                   "rollout/partial/due_groups": float(sum(due)),
                   "rollout/partial/carried_groups": float(len(self.pool)),
                   "rollout/partial/carried_samples": float(sum(not p.finish for g in self.pool for p in g.samples))}
        return PendingRollout(items, None, n=n, done=(batch, busy), metrics=metrics)

    def play(self, step: int, due: list[bool]) -> float:
        """Play the pool's unfinished samples until data.prompts_per_step groups and the `due` ones are complete;
        the engines' time."""
        unfinished_due = any(d and g.done_at is None for g, d in zip(self.pool, due))
        if sum(g.done_at is not None for g in self.pool) >= self.prompts_per_step and not unfinished_due:
            return 0.0
        pending = self.rollouts.submit([self.items[g.item] for g in self.pool], self.params, None,
                                       carried=[g.samples for g in self.pool], must_finish=due,
                                       complete=self.prompts_per_step)
        batch, busy = pending.result()
        n = self.params.n
        for r, info in enumerate(batch.carried):
            self.pool[int(batch.group_ids[r])].samples[r % n] = info.progress
        for k, g in enumerate(self.pool):
            ticks = [info.finished_at for info in batch.carried[k * n:(k + 1) * n]]
            if g.done_at is None and all(p.finish for p in g.samples):
                g.done_at = (step, max(ticks))
        return busy

    def state_dict(self) -> dict[str, Any]:
        """{"sampler": its position, "in_flight": the pool (every group's samples so far)}."""
        groups = [{"item": g.item, "prompt": prompt_digest(self.items[g.item].prompt_ids),
                   "done_at": list(g.done_at) if g.done_at else None,
                   "samples": [dataclasses.asdict(p) for p in g.samples]} for g in self.pool]
        return {"sampler": self.sampler.state_dict(), "in_flight": {"partial_pool": groups}}

    def load_state_dict(self, sampler: dict[str, Any], step: int, in_flight: Any = None) -> None:
        """Continue after checkpoint step `step` with the sampler at `sampler` and the saved pool. A saved group
        whose prompt is not the one now at its index (the training data changed since the checkpoint; its digest
        differs, or the index is past the end) is dropped, with one warning; a checkpoint written before the
        digests were saved is taken as it is."""
        self.sampler.load_state_dict(sampler)
        saved = in_flight.get("partial_pool", []) if isinstance(in_flight, dict) else []
        same = [self.same_prompt(g) for g in saved]
        kept = [g for g, ok in zip(saved, same) if ok]
        if len(kept) < len(saved):
            dropped = [g for g, ok in zip(saved, same) if not ok]
            begun = sum(bool(p.get("ids") or p.get("past")) for g in dropped for p in g["samples"])
            warn(f"rollout.partial: dropped {len(dropped)} of the {len(saved)} groups in flight in the checkpoint "
                 f"({begun} samples begun): the prompt now at their index is not the one they were sampled for, so "
                 "the training data (data.train_files) changed since the checkpoint was written; new prompts take "
                 "their places. Resume with the unchanged data to continue them.")
        self.pool = [Group(g["item"], [Progress.from_data(p) for p in g["samples"]],
                           tuple(g["done_at"]) if g["done_at"] else None) for g in kept]

    def same_prompt(self, saved: dict[str, Any]) -> bool:
        """Whether a saved group's prompt is the one now at its index (no digest saved: taken as the same)."""
        index = saved["item"]
        if not 0 <= index < len(self.items):
            return False
        return "prompt" not in saved or saved["prompt"] == prompt_digest(self.items[index].prompt_ids)

    def drain(self) -> None:
        """Nothing runs between steps (each step's rollout is over when `take` returns)."""
