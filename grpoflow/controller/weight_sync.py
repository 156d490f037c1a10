"""Weight sync: the actor's weights into the rollout engines after each update, versioned.

- Colocated (actor and engine in one process per rank): `transfer` pipes the actor's
  `named_weights` stream into the engine's `update_weights`, one tensor at a time; under FSDP each
  tensor is gathered just before the engine loads it, so no rank holds a second full copy.
- Split (engines in their own processes): the actor streams buckets of about `bucket_bytes`
  (`open_weight_stream` / `next_weight_bucket`, rank 0's kept) in the engines' `dtype` (bfloat16
  when computing in bf16: half the bytes of the fp32 masters), and the controller pushes each
  to every engine (`begin_weight_update` / `push_weights` / `end_weight_update`). `last_bytes`
  is what the last sync sent to each engine (the step logs it as `perf/weight_sync_bytes`).
- Queued (async mode): the engine-side calls are submitted without waiting, so they run behind
  the generations already in flight; `check` raises a sync that failed, `wait` waits for all.
"""

from __future__ import annotations

from grpoflow.distributed.worker_group import GroupCall, WorkerGroup, broadcast
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.rollout import RolloutWorker


class WeightSync:
    def __init__(self, actor: WorkerGroup[ActorWorker], rollout: WorkerGroup[RolloutWorker], *, queued: bool,
                 bucket_bytes: int = 256 << 20, dtype: str = "float32") -> None:
        self.actor, self.rollout, self.queued, self.bucket_bytes = actor, rollout, queued, bucket_bytes
        self.dtype = dtype            # what the buckets carry: the rollout engines' dtype
        self.pending: list[GroupCall[None]] = []
        self.last_bytes: int | None = None  # sent per engine by the last bucketed sync (None: colocated stream)

    def push(self, version: int) -> None:
        """Send the actor's current weights to every engine as `version`."""
        self.check()
        if self.actor.colocated_with(self.rollout) and not self.queued:
            self.actor.transfer(ActorWorker.named_weights, self.rollout, RolloutWorker.update_weights, version)
            return
        # Engine-side calls are submitted in order without waiting (Ray runs them in order per engine):
        # the next bucket is gathered while the engines load this one.
        calls = [self.rollout.submit_overlapped(RolloutWorker.begin_weight_update, version)]
        self.actor.call(ActorWorker.open_weight_stream)
        sent = 0
        while bucket := self.actor.call(ActorWorker.next_weight_bucket, self.bucket_bytes, self.dtype):
            sent += sum(t.numel() * t.element_size() for _, t in bucket)
            calls.append(self.rollout.submit_overlapped(RolloutWorker.push_weights, broadcast(bucket)))
        self.last_bytes = sent
        calls.append(self.rollout.submit_overlapped(RolloutWorker.end_weight_update))
        self.pending += calls
        if not self.queued:
            self.wait()

    def check(self) -> None:
        """Raise the error of a queued sync that has failed; forget the ones that finished."""
        for call in [c for c in self.pending if c.done()]:
            call.result()
            self.pending.remove(call)

    def wait(self) -> None:
        """Wait for every queued engine-side call (raising the first failure)."""
        pending, self.pending = self.pending, []
        for call in pending:
            call.result()
