"""Worker groups: SPMD ranks of one role, driven by the controller as one object.

`group.some_verb(batch, **kwargs)` is the only way the controller talks to workers, whatever
the backend. One dispatch rule for every verb:

- the first positional argument, if it is a `Batch` or a list, is split into one contiguous
  shard per data-parallel rank; every other argument goes to every rank unchanged;
- results are gathered from the ranks that hold one (the first rank of each data-parallel
  replica): `Batch` shards are concatenated back in rank order, anything else (metrics,
  which ranks have already all-reduced) is taken from rank 0.

A backend only knows how to create rank objects and call a method on all of them; `local`
calls them in this process. The Ray backend (a later issue) implements the same two methods.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable, Protocol

from grpoflow.data.batch import Batch, split_bounds


class WorkerError(RuntimeError):
    """A worker raised; the message names the role, the rank and the original traceback."""

    def __init__(self, message: str, *, role: str, rank: int | None, original: BaseException | None) -> None:
        super().__init__(message)
        self.role, self.rank, self.original = role, rank, original


class RankFailure(Exception):
    """Raised by a backend: rank `rank` failed with `original` (traceback text kept)."""

    def __init__(self, rank: int, original: BaseException, traceback_text: str) -> None:
        super().__init__(f"rank {rank}: {type(original).__name__}: {original}")
        self.rank, self.original, self.traceback_text = rank, original, traceback_text


class Backend(Protocol):
    def spawn(self, factory: Callable[[int, int], Any], world_size: int) -> list[Any]: ...

    def call(self, handles: list[Any], method: str, per_rank_args: list[tuple[tuple, dict]]) -> list[Any]: ...


class LocalBackend:
    """Every rank is an object in this process; calls run one after another."""

    def spawn(self, factory: Callable[[int, int], Any], world_size: int) -> list[Any]:
        return [_on_rank(rank, factory, rank, world_size) for rank in range(world_size)]

    def call(self, handles: list[Any], method: str, per_rank_args: list[tuple[tuple, dict]]) -> list[Any]:
        return [_on_rank(rank, getattr(h, method), *args, **kwargs)
                for rank, (h, (args, kwargs)) in enumerate(zip(handles, per_rank_args))]


def _on_rank(rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # re-raised with the rank attached
        raise RankFailure(rank, e, traceback.format_exc()) from e


BACKENDS: dict[str, Callable[[], Backend]] = {"local": LocalBackend}


class WorkerGroup:
    def __init__(self, role: str, factory: Callable[[int, int], Any], *, world_size: int = 1,
                 backend: str = "local", tensor_parallel: int = 1) -> None:
        if world_size % tensor_parallel:
            raise ValueError(f"{role}: world size {world_size} is not a multiple of tensor_parallel={tensor_parallel}.")
        self.role, self.world_size, self.tp = role, world_size, tensor_parallel
        self.dp_size = world_size // tensor_parallel
        self.backend = BACKENDS[backend]()
        self.handles = self._guard("__init__", lambda: self.backend.spawn(factory, world_size))

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.dispatch(method, *args, **kwargs)

    def dispatch(self, method: str, *args: Any, **kwargs: Any) -> Any:
        per_rank = [(args, kwargs)] * self.world_size
        sharded = bool(args) and isinstance(args[0], (Batch, list))
        if sharded:
            shards = _split(args[0], self.dp_size)
            per_rank = [((shards[rank // self.tp], *args[1:]), kwargs) for rank in range(self.world_size)]
        results = self._guard(method, lambda: self.backend.call(self.handles, method, per_rank))
        held = [results[rank] for rank in range(0, self.world_size, self.tp)]
        if all(isinstance(r, Batch) for r in held):
            return Batch.concat(held)
        return held[0]

    def _guard(self, method: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RankFailure as e:
            raise WorkerError(f"{self.role} worker rank {e.rank} failed in `{method}`: "
                              f"{type(e.original).__name__}: {e.original}\n--- original traceback ---\n"
                              f"{e.traceback_text}", role=self.role, rank=e.rank, original=e.original) from e


def _split(value: Batch | list, parts: int) -> list:
    if isinstance(value, Batch):
        return value.split(parts)
    bounds = split_bounds(len(value), parts)
    return [value[bounds[i]:bounds[i + 1]] for i in range(parts)]
