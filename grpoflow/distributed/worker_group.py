"""Worker groups: SPMD ranks of one role, driven by the controller as one object.

The controller calls a verb by its method, never by a name in a string, so that readers, editors
and type checkers follow the call to the worker class, and a wrong verb fails in the controller:

    old = self.actor.call(ActorWorker.compute_log_prob, batch)      # -> Tensor [B, R]

One dispatch rule for every verb, whatever the backend:

- the first positional argument, if it is a `Batch` or a list, is split into one contiguous
  shard per rank; `broadcast(value)` sends `value` whole to every rank; every other argument goes
  to every rank unchanged;
- a `Batch` argument travels without its texts and dataset rows (`Batch.tensors()`): model workers
  read tensors only, so prompts, completions, rows and conversations never cross to a rank;
- results are gathered: when the call was split, `Batch` and tensor results are its shards'
  results and are concatenated back in rank order (dim 0); anything else (metrics, which ranks
  have already all-reduced), and every result of a call that was not split, is taken from rank 0.
  Verbs return only what they compute (a tensor of per-row values), not the batch they were given.

A group lives on a pool of ranks (`grpoflow.distributed.host`): `LocalPool` in this process,
`RayPool` in Ray actors. Roles placed on the same pool are colocated: they share each rank's
process, and `transfer` between them never leaves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Concatenate, Generic, ParamSpec, TypeVar, cast

import torch

from grpoflow.data.batch import Batch, split_bounds
from grpoflow.distributed.host import LocalPool, Pool, RankFailure

W = TypeVar("W")    # the worker class of a group
V = TypeVar("V")    # the worker class of a transfer's destination
R = TypeVar("R")    # what a verb returns
T = TypeVar("T")
P = ParamSpec("P")  # a verb's parameters after `self`


class WorkerError(RuntimeError):
    """A worker raised; the message names the role, the rank and the original traceback."""

    def __init__(self, message: str, *, role: str, rank: int | None, original: BaseException | None) -> None:
        super().__init__(message)
        self.role, self.rank, self.original = role, rank, original


@dataclass(frozen=True)
class Broadcast:
    """An argument sent whole to every rank (a list would otherwise be split by rank)."""
    value: Any


def broadcast(value: T) -> T:
    """`value` marked to be sent whole to every rank, typed as itself so that a typed call still checks it:
    `group.call(RolloutWorker.push_weights, broadcast(bucket))`."""
    return cast(T, Broadcast(value))


class WorkerGroup(Generic[W]):
    """`world_size` ranks (or the pool's), each holding one `W` built by `factory(rank, world_size)`.
    `pad_token_id` pads the prompt and response ids of Batch shards gathered back into one (`Batch.concat`)."""

    def __init__(self, role: str, factory: Callable[[int, int], W], *, pool: Pool | None = None,
                 world_size: int = 1, timeouts: dict[Callable[..., Any], float] | None = None,
                 pad_token_id: int = 0) -> None:
        self.pool = pool if pool is not None else LocalPool(world_size)
        self.role, self.world_size, self.pad_token_id = role, self.pool.world_size, pad_token_id
        self.worker_cls: type = factory.func if isinstance(factory, partial) else factory  # type: ignore[assignment]
        self.timeouts = {self._verb(m): t for m, t in (timeouts or {}).items()}
        self.dispatch_s = 0.0
        self._guard("__init__", lambda: self.pool.run("add_role", [(role, factory)] * self.world_size))

    def call(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run `method` (a method of the group's worker class) on every rank; the gathered result."""
        return self.submit(method, *args, **kwargs).result()

    def submit(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> "GroupCall[R]":
        """Start `method` on every rank and return at once (Ray overlaps it with whatever the controller
        does next; the local backend runs it now). `.result()` gathers it like `call`; the controller's
        wait on it counts as dispatch overhead (see `submit_overlapped` for calls it means to wait on)."""
        name = self._verb(method)
        return GroupCall(self, name, self._start(name, args, kwargs), sharded=_is_split(args))

    def submit_overlapped(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
                          ) -> "GroupCall[R]":
        """`submit` for a call that runs while the controller does other work (async generation, queued
        weight updates): its wait is not dispatch overhead, and `.busy_s` tells the ranks' own time."""
        name = self._verb(method)
        return GroupCall(self, name, self._start(name, args, kwargs), sharded=_is_split(args), overlapped=True)

    def take_dispatch_seconds(self) -> float:
        """Seconds the controller spent in this group's calls beyond the ranks' own time on them
        (serialisation, transfer, scheduling) since the last time this was taken."""
        seconds, self.dispatch_s = self.dispatch_s, 0.0
        return seconds

    def _verb(self, method: Callable[..., Any]) -> str:
        """The name of `method`, checked to be a verb of this group's worker class (here, not on a rank)."""
        name = getattr(method, "__name__", None)
        if name is None or name.startswith("_") or getattr(self.worker_cls, name, None) is not method:
            raise TypeError(f"{self.role}: {getattr(method, '__qualname__', method)!r} is not a public method of "
                            f"{self.worker_cls.__name__}; pass one, e.g. {self.worker_cls.__name__}.<verb>.")
        return name

    def _start(self, method: str, args: tuple, kwargs: dict) -> Any:
        args, kwargs = tuple(_tensors_only(a) for a in args), {k: _tensors_only(v) for k, v in kwargs.items()}
        first = args[0] if args else None
        per_rank = [(self.role, method, args, kwargs)] * self.world_size
        if isinstance(first, Broadcast):
            per_rank = [(self.role, method, (first.value, *args[1:]), kwargs)] * self.world_size
        elif isinstance(first, (Batch, list)):  # what _is_split(args) tells the gather
            shards = _split(first, self.world_size)
            per_rank = [(self.role, method, (shards[rank], *args[1:]), kwargs) for rank in range(self.world_size)]
        return self._guard(method, lambda: self.pool.submit("timed_call", per_rank))

    def gather(self, results: list[Any], *, sharded: bool) -> Any:
        """A split call's Batch or tensor shards concatenated in rank order; anything else from rank 0."""
        if sharded and all(isinstance(r, Batch) for r in results):
            return Batch.concat(results, pad_token_id=self.pad_token_id)
        if sharded and all(isinstance(r, torch.Tensor) for r in results):
            return torch.cat(results) if len(results) > 1 else results[0]
        return results[0]

    def colocated_with(self, other: "WorkerGroup[Any]") -> bool:
        return self.pool is other.pool

    def transfer(self, src_method: Callable[[W], Any], dst: "WorkerGroup[V]",
                 dst_method: Callable[Concatenate[V, Any, P], Any], *args: P.args, **kwargs: P.kwargs) -> None:
        """dst_method(src_method(), *args) inside each rank's process; the groups must be colocated
        (the value, e.g. a stream of weights, never leaves the process)."""
        if not self.colocated_with(dst):
            raise ValueError(f"transfer {self.role} -> {dst.role}: the groups are not colocated; send the value "
                             "through the controller instead (see controller.weight_sync).")
        src, dst_name = self._verb(src_method), dst._verb(dst_method)
        self._guard(f"{src} -> {dst.role}.{dst_name}", lambda: self.pool.run(
            "pipe", [(self.role, src, dst.role, dst_name, args, kwargs)] * self.world_size,
            timeout_s=dst.timeouts.get(dst_name)))

    def _guard(self, method: str, fn: Callable[[], R]) -> R:
        try:
            return fn()
        except RankFailure as e:
            raise WorkerError(f"{self.role} worker {self.pool.describe(e.rank)} failed in `{method}`: "
                              f"{type(e.original).__name__}: {e.original}\n--- original traceback ---\n"
                              f"{e.traceback_text}", role=self.role, rank=e.rank, original=e.original) from e


class GroupCall(Generic[R]):
    """A method call in flight on every rank of a group."""

    def __init__(self, group: WorkerGroup[Any], method: str, call: Any, *, sharded: bool,
                 overlapped: bool = False) -> None:
        self.group, self.method, self.call, self.sharded, self.overlapped = group, method, call, sharded, overlapped
        self.started = time.perf_counter()
        self.busy_s = 0.0  # the longest time a rank spent on the call (set by `result`)

    def done(self) -> bool:
        return self.call.done()

    def result(self) -> R:
        g = self.group
        results = g._guard(self.method, lambda: self.call.result(g.timeouts.get(self.method)))
        self.busy_s = max(seconds for _, seconds in results)
        value = g.gather([r for r, _ in results], sharded=self.sharded)
        if not self.overlapped:
            g.dispatch_s += max(0.0, time.perf_counter() - self.started - self.busy_s)
        return value


def _is_split(args: tuple) -> bool:
    """Whether a call's first argument is split by data-parallel rank (a Batch or a list, not broadcast)."""
    return bool(args) and isinstance(args[0], (Batch, list))


def _tensors_only(value: Any) -> Any:
    """A Batch argument (or a broadcast one) without its texts and dataset rows; anything else as it is."""
    if isinstance(value, Batch):
        return value.tensors()
    if isinstance(value, Broadcast) and isinstance(value.value, Batch):
        return Broadcast(value.value.tensors())
    return value


def _split(value: Batch | list, parts: int) -> list:
    if isinstance(value, Batch):
        return value.split(parts)
    bounds = split_bounds(len(value), parts)
    return [value[bounds[i]:bounds[i + 1]] for i in range(parts)]
