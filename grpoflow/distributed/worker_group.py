"""Worker groups: SPMD ranks of one role, driven by the controller as one object.

`group.some_verb(batch, **kwargs)` is the only way the controller talks to workers, whatever
the backend. One dispatch rule for every verb:

- the first positional argument, if it is a `Batch` or a list, is split into one contiguous
  shard per data-parallel rank (every rank of a tensor-parallel replica gets the same shard);
  `Broadcast(value)` sends `value` whole to every rank; every other argument goes to every rank
  unchanged;
- results are gathered from the ranks that hold one (the first rank of each data-parallel
  replica): `Batch` shards are concatenated back in rank order, anything else (metrics,
  which ranks have already all-reduced) is taken from rank 0.

A group lives on a pool of ranks (`grpoflow.distributed.host`): `LocalPool` in this process,
`RayPool` in Ray actors. Roles placed on the same pool are colocated: they share each rank's
process, and `transfer` between them never leaves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from grpoflow.data.batch import Batch, split_bounds
from grpoflow.distributed.host import LocalPool, Pool, RankFailure


class WorkerError(RuntimeError):
    """A worker raised; the message names the role, the rank and the original traceback."""

    def __init__(self, message: str, *, role: str, rank: int | None, original: BaseException | None) -> None:
        super().__init__(message)
        self.role, self.rank, self.original = role, rank, original


@dataclass(frozen=True)
class Broadcast:
    """An argument sent whole to every rank (a list would otherwise be split by rank)."""
    value: Any


class WorkerGroup:
    def __init__(self, role: str, factory: Callable[[int, int], Any], *, pool: Pool | None = None,
                 world_size: int = 1, tensor_parallel: int = 1, timeouts: dict[str, float] | None = None) -> None:
        self.pool = pool if pool is not None else LocalPool(world_size)
        world_size = self.pool.world_size
        if world_size % tensor_parallel:
            raise ValueError(f"{role}: world size {world_size} is not a multiple of tensor_parallel={tensor_parallel}.")
        self.role, self.world_size, self.tp = role, world_size, tensor_parallel
        self.dp_size = world_size // tensor_parallel
        self.timeouts = dict(timeouts or {})
        self.dispatch_s = 0.0
        self._guard("__init__", lambda: self.pool.run("add_role", [(role, factory)] * world_size))

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.dispatch(method, *args, **kwargs)

    def dispatch(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.submit(method, *args, **kwargs).result()

    def submit(self, method: str, *args: Any, **kwargs: Any) -> "GroupCall":
        """Start `method` on every rank and return at once (Ray overlaps it with whatever the controller
        does next; the local backend runs it now). `.result()` gathers it like `dispatch`."""
        return GroupCall(self, method, self._start("timed_call", method, args, kwargs))

    def timed_submit(self, method: str, *args: Any, **kwargs: Any) -> "GroupCall":
        """`submit`, whose `.result()` also returns the longest time a rank spent on the call; its wait is
        not counted as dispatch overhead (the controller may overlap it with other work)."""
        return GroupCall(self, method, self._start("timed_call", method, args, kwargs), timed=True)

    def take_dispatch_seconds(self) -> float:
        """Seconds the controller spent in this group's calls beyond the ranks' own time on them
        (serialisation, transfer, scheduling) since the last time this was taken."""
        seconds, self.dispatch_s = self.dispatch_s, 0.0
        return seconds

    def _start(self, host_method: str, method: str, args: tuple, kwargs: dict) -> Any:
        first = args[0] if args else None
        per_rank = [(self.role, method, args, kwargs, self.tp)] * self.world_size
        if isinstance(first, Broadcast):
            per_rank = [(self.role, method, (first.value, *args[1:]), kwargs, self.tp)] * self.world_size
        elif isinstance(first, (Batch, list)):
            shards = _split(first, self.dp_size)
            per_rank = [(self.role, method, (shards[rank // self.tp], *args[1:]), kwargs, self.tp)
                        for rank in range(self.world_size)]
        return self._guard(method, lambda: self.pool.submit(host_method, per_rank))

    def gather(self, results: list[Any]) -> Any:
        """Batch shards of the replica leaders concatenated in rank order; anything else from rank 0."""
        held = [results[rank] for rank in range(0, self.world_size, self.tp)]
        if all(isinstance(r, Batch) for r in held):
            return Batch.concat(held)
        return held[0]

    def colocated_with(self, other: "WorkerGroup") -> bool:
        return self.pool is other.pool

    def transfer(self, src_method: str, dst: "WorkerGroup", dst_method: str, *args: Any) -> None:
        """dst.dst_method(self.src_method(), *args): inside each rank's process when the groups are
        colocated; otherwise through the controller (rank 0's result broadcast to every dst rank)."""
        if self.colocated_with(dst):
            self._guard(f"{src_method} -> {dst.role}.{dst_method}", lambda: self.pool.run(
                "pipe", [(self.role, src_method, dst.role, dst_method, args)] * self.world_size,
                timeout_s=dst.timeouts.get(dst_method)))
        else:
            dst.dispatch(dst_method, Broadcast(self.dispatch(src_method)), *args)

    def _guard(self, method: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RankFailure as e:
            raise WorkerError(f"{self.role} worker {self.pool.describe(e.rank)} failed in `{method}`: "
                              f"{type(e.original).__name__}: {e.original}\n--- original traceback ---\n"
                              f"{e.traceback_text}", role=self.role, rank=e.rank, original=e.original) from e


class GroupCall:
    """A method call in flight on every rank of a group."""

    def __init__(self, group: WorkerGroup, method: str, call: Any, *, timed: bool = False) -> None:
        self.group, self.method, self.call, self.timed = group, method, call, timed
        self.started = time.perf_counter()

    def done(self) -> bool:
        return self.call.done()

    def result(self) -> Any:
        g = self.group
        results = g._guard(self.method, lambda: self.call.result(g.timeouts.get(self.method)))
        busy = max(seconds for _, seconds in results)
        value = g.gather([r for r, _ in results])
        if self.timed:
            return value, busy
        g.dispatch_s += max(0.0, time.perf_counter() - self.started - busy)
        return value


def _split(value: Batch | list, parts: int) -> list:
    if isinstance(value, Batch):
        return value.split(parts)
    bounds = split_bounds(len(value), parts)
    return [value[bounds[i]:bounds[i + 1]] for i in range(parts)]
