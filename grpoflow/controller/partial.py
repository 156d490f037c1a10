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

The pool holds each sample as the rollout workers gave it back: a paused one as its `Trajectory` (sent back to go
on), a finished one as the batch row the step trains on (rendered by the worker that played it; the controller
renders nothing and needs no tokenizer for it). Every token keeps the weight version that sampled it
(Batch.token_versions); the actor's token-level importance weights (actor.rollout_is=token, on by default with
rollout.partial) correct for the older ones. A checkpoint saves the pool (as the async queue saves its steps in
flight: rows as plain tensors, trajectories as `Trajectory.as_data`), so a resumed run continues the same samples.
Each saved group holds a digest of its prompt's token ids: a resume whose training data changed under the
checkpoint (a group's index now holds another prompt, or no prompt) drops those groups with one warning, and the
pool tops up with new prompts, rather than continue samples on a prompt they were not sampled for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import torch
from torch import Tensor
from tqdm import tqdm

from grpoflow.controller.rollouts import PendingRollout, Rollouts, attach, group_ids, metrics_of
from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import PromptSampler
from grpoflow.errors import UserError
from grpoflow.models.nucleus import NO_CUT
from grpoflow.trajectories.trajectory import Trajectory
from grpoflow.trajectories.turns import Carried, info_as_data, info_from_data
from grpoflow.engines.protocol import SamplingParams

Sample = Union[Trajectory, Batch, None]  # a sample in the pool: paused (its trajectory), finished (its row), not begun


def finished(sample: Sample) -> bool:
    return isinstance(sample, Batch)


def oldest_of(sample: Sample) -> int | None:
    """The weight version of a sample's oldest token (None: nothing sampled yet)."""
    if isinstance(sample, Batch):
        assert sample.token_versions is not None
        sampled = sample.token_versions[sample.response_mask.bool()]
        return int(sampled.min()) if sampled.numel() else None
    return sample.oldest if sample is not None else None


@dataclass
class Group:
    """A prompt's n samples in flight: `item` indexes the run's training items; `seed` is the seed of the rollout
    they started in (their streams and environment seed); `done_at` = (step, tick) at which its last sample
    finished (None while some still run)."""
    item: int
    seed: int
    samples: list[Sample]
    done_at: tuple[int, int] | None = None

    @property
    def oldest(self) -> int | None:
        """The weight version of its oldest token (None: nothing sampled yet)."""
        return min((v for v in map(oldest_of, self.samples) if v is not None), default=None)

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
                 version: Callable[[], int], pad_token_id: int) -> None:
        """`seed_of(step)`: the seed of the streams (and environments) of the prompts drawn at `step`; `version()`:
        the weights the engines hold (those the step trains, sync mode)."""
        self.rollouts, self.items, self.sampler, self.pad_token_id = rollouts, items, sampler, pad_token_id
        self.multi_turn = rollouts.kind[0]
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
                g.samples, g.done_at = [None] * n, None
                restarted += 1
        new = self.draw(max(self.in_flight_groups - len(self.pool), 0))
        self.pool += [Group(self._position[id(it)], self.seed_of(step), [None] * n) for it in new]
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
        batch = attach(self.rows_of(chosen), items)
        assert batch.token_versions is not None
        metrics = {**metrics_of(batch, self.multi_turn, False, episodes=len(batch)),
                   **partial_metrics(batch.token_versions, batch.response_mask, version),
                   "rollout/partial/new_groups": float(len(new)), "rollout/partial/restarted_groups": float(restarted),
                   "rollout/partial/due_groups": float(sum(due)),
                   "rollout/partial/carried_groups": float(len(self.pool)),
                   "rollout/partial/carried_samples": float(sum(not finished(p) for g in self.pool for p in g.samples))}
        return PendingRollout(items, None, n=n, done=(batch, busy), metrics=metrics)

    def rows_of(self, groups: list[Group]) -> Batch:
        """The finished samples of `groups` as the step's batch: their rows (from the rollouts that finished them),
        group k's n samples in order, group ids 0.. and episodes numbered as one rollout's. A row without nucleus
        floors among rows with some (top-p cut nothing in its rollout) gets the no-cut floor."""
        rows = [s for g in groups for s in g.samples]
        assert all(isinstance(r, Batch) for r in rows), "a step trains complete groups only"
        parts: list[Batch] = [r for r in rows if isinstance(r, Batch)]
        width = max(p.response_ids.shape[1] for p in parts)
        floors = torch.full((len(parts), width), NO_CUT, dtype=torch.float32)
        for i, p in enumerate(parts):
            if p.sampling_floors is not None:
                floors[i, :p.sampling_floors.shape[1]] = p.sampling_floors[0]
        batch = Batch.concat([p.replace(sampling_floors=None) for p in parts], pad_token_id=self.pad_token_id)
        # the floors only where top-p cut something, as one rollout's batch has them (trajectory.to_batch)
        return batch.replace(group_ids=group_ids(len(groups), self.params.n),
                             sampling_floors=floors if bool((floors > NO_CUT).any()) else None,
                             carried=[Carried(episode=i) for i in range(len(batch))])

    def play(self, step: int, due: list[bool]) -> float:
        """Play the pool's unfinished samples until data.prompts_per_step groups and the `due` ones are complete;
        the engines' time."""
        unfinished_due = any(d and g.done_at is None for g, d in zip(self.pool, due))
        if sum(g.done_at is not None for g in self.pool) >= self.prompts_per_step and not unfinished_due:
            return 0.0
        pending = self.rollouts.submit(
            [self.items[g.item] for g in self.pool], self.params, None, seeds=[g.seed for g in self.pool],
            carried=[[s if isinstance(s, Trajectory) else None for s in g.samples] for g in self.pool],
            finished=[tuple(j for j, s in enumerate(g.samples) if finished(s)) for g in self.pool],
            must_finish=due, complete=self.prompts_per_step)
        batch, busy = pending.result()
        n, ticks = self.params.n, [-1] * len(self.pool)
        for r, c in enumerate(batch.carried):
            k = int(batch.group_ids[r])
            self.pool[k].samples[c.episode % n] = c.trajectory if c.paused else batch.select([r]).trimmed()
            ticks[k] = max(ticks[k], c.finished_at)
        for k, g in enumerate(self.pool):
            if g.done_at is None and all(map(finished, g.samples)):
                g.done_at = (step, ticks[k])
        return busy

    def state_dict(self) -> dict[str, Any]:
        """{"sampler": its position, "in_flight": the pool (every group's samples so far: a finished one's row as
        plain values, a paused one's trajectory as `Trajectory.as_data`, None for one not begun)}."""
        groups = [{"item": g.item, "seed": g.seed, "prompt": prompt_digest(self.items[g.item].prompt_ids),
                   "done_at": list(g.done_at) if g.done_at else None,
                   "samples": [sample_as_data(s) for s in g.samples]} for g in self.pool]
        return {"sampler": self.sampler.state_dict(), "in_flight": {"partial_pool": groups}}

    def load_state_dict(self, sampler: dict[str, Any], step: int, in_flight: Any = None) -> None:
        """Continue after checkpoint step `step` with the sampler at `sampler` and the saved pool. A saved group
        whose prompt is not the one now at its index (the training data changed since the checkpoint; its digest
        differs, or the index is past the end) is dropped, with one warning; a checkpoint written before the
        digests were saved is taken as it is; one written before the pool held trajectories and rows is refused."""
        self.sampler.load_state_dict(sampler)
        saved = in_flight.get("partial_pool", []) if isinstance(in_flight, dict) else []
        if any(isinstance(g, dict) and "seed" not in g for g in saved):
            raise UserError(
                "this checkpoint's rollout.partial pool was written by an older grpoflow (its samples as Progress, "
                "re-rendered by the controller), which this version cannot continue: resume it with the grpoflow "
                "that wrote it, or start over from its weights (trainer.resume=never, model.path=<its actor folder>).")
        same = [self.same_prompt(g) for g in saved]
        kept = [g for g, ok in zip(saved, same) if ok]
        if len(kept) < len(saved):
            dropped = [g for g, ok in zip(saved, same) if not ok]
            begun = sum(p is not None for g in dropped for p in g["samples"])
            warn(f"rollout.partial: dropped {len(dropped)} of the {len(saved)} groups in flight in the checkpoint "
                 f"({begun} samples begun): the prompt now at their index is not the one they were sampled for, so "
                 "the training data (data.train_files) changed since the checkpoint was written; new prompts take "
                 "their places. Resume with the unchanged data to continue them.")
        self.pool = [Group(g["item"], g["seed"], [sample_from_data(p, self.items[g["item"]]) for p in g["samples"]],
                           tuple(g["done_at"]) if g["done_at"] else None) for g in kept]

    def same_prompt(self, saved: dict[str, Any]) -> bool:
        """Whether a saved group's prompt is the one now at its index (no digest saved: taken as the same)."""
        index = saved["item"]
        if not 0 <= index < len(self.items):
            return False
        return "prompt" not in saved or saved["prompt"] == prompt_digest(self.items[index].prompt_ids)

    def drain(self) -> None:
        """Nothing runs between steps (each step's rollout is over when `take` returns)."""


def sample_as_data(sample: Sample) -> dict | None:
    """A pool's sample as plain values a weights-only checkpoint holds: {"row": the Batch's fields} (finished; no
    dataset row, its facts as `info_as_data`), {"trajectory": `Trajectory.as_data`} (paused), or None."""
    if isinstance(sample, Trajectory):
        return {"trajectory": sample.as_data()}
    if sample is None:
        return None
    row = sample.replace(rows=[], infos=[info_as_data(i, c) for i, c in zip(sample.infos, sample.carried)], carried=[])
    return {"row": {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}}


def sample_from_data(data: dict | None, item: PromptItem) -> Sample:
    """`sample_as_data`'s output back as a pool's sample (a row gets its dataset row from `item`)."""
    if data is None:
        return None
    (kind, value), = data.items()  # one key: anything else was edited
    if kind == "trajectory":
        return Trajectory.from_data(value)
    if kind != "row":
        raise KeyError(kind)
    fields = dict(value)
    read = [info_from_data(i) for i in fields["infos"]]
    fields["infos"], fields["carried"], fields["rows"] = [i for i, _ in read], [c for _, c in read], [item.row]
    return Batch(**fields)
