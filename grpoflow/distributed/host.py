"""One rank's process and the pools of ranks that worker groups live on.

A `RankHost` is what runs in a rank's process: it joins the pool's torch.distributed group
(when the pool has one) and holds one object per role placed on it. Colocated roles (actor,
reference, critic, rollout) are simply several role objects on the same hosts; `pipe` hands
one role's result to another role on the same rank without leaving the process (weight sync).

A pool runs a host method on every rank and returns the results in rank order, raising
`RankFailure` for the first rank that fails. `LocalPool` keeps its hosts in this process;
`grpoflow.distributed.ray_pool.RayPool` keeps each host in a Ray actor.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Protocol

from grpoflow.data.batch import Batch


class RankFailure(Exception):
    """Rank `rank` failed with `original` (its traceback text kept); raised by pools."""

    def __init__(self, rank: int, original: BaseException, traceback_text: str) -> None:
        super().__init__(f"rank {rank}: {type(original).__name__}: {original}")
        self.rank, self.original, self.traceback_text = rank, original, traceback_text

    def __reduce__(self) -> tuple:  # crosses process boundaries (Ray)
        return RankFailure, (self.rank, self.original, self.traceback_text)


class WorkerDied(RuntimeError):
    """A rank's process ended (killed, out of memory, crashed) while the controller waited on it."""


class CallTimeout(TimeoutError):
    """A rank did not answer within the call's time limit."""


class RankHost:
    """The role objects of one rank, in one process."""

    def __init__(self, rank: int, world_size: int, threads: int = 0) -> None:
        self.rank, self.world_size = rank, world_size
        self.roles: dict[str, Any] = {}
        if threads > 0:
            import torch
            torch.set_num_threads(threads)

    def info(self) -> dict[str, Any]:
        """Where this rank runs: pid, host name, IP address and Ray node id, and a free TCP port there."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return {"pid": os.getpid(), "host": socket.gethostname(), "ip": _node_ip(), "port": port, "node": _node_id()}

    def init_process_group(self, master_addr: str, master_port: int, timeout_s: float) -> str:
        """Join the pool's process group (nccl with CUDA, else gloo); returns the backend used."""
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=os.environ.get("LOCAL_RANK", "0"))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=timeout_s))
        return backend

    def add_role(self, role: str, factory: Callable[[int, int], Any]) -> None:
        self.roles[role] = _on_rank(self.rank, factory, self.rank, self.world_size)

    def call(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        return _on_rank(self.rank, getattr(self.roles[role], method), *args, **kwargs)

    def timed_call(self, role: str, method: str, args: tuple, kwargs: dict) -> tuple[Any, float]:
        """`call`, and the seconds it took in this process (for the controller's wait metrics).

        The result goes back only if the controller gathers it (the dispatch rule: a Batch or tensor from every
        rank, anything else from rank 0), so e.g. metrics all-reduced on every rank cross the wire once."""
        import torch

        began = time.perf_counter()
        result = self.call(role, method, args, kwargs)
        kept = isinstance(result, (Batch, torch.Tensor)) or self.rank == 0
        return (result if kept else None), time.perf_counter() - began

    def pipe(self, src_role: str, src_method: str, dst_role: str, dst_method: str, args: tuple,
             kwargs: dict | None = None) -> Any:
        """dst_role.dst_method(src_role.src_method(), *args, **kwargs) on this rank (colocated weight sync:
        the source may be a generator, consumed one item at a time by the destination)."""
        value = self.call(src_role, src_method, (), {})
        return self.call(dst_role, dst_method, (value, *args), kwargs or {})

    def close(self) -> None:
        for obj in self.roles.values():
            if hasattr(obj, "close"):
                obj.close()
        self.roles.clear()


def _on_rank(rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except RankFailure:
        raise
    except Exception as e:  # re-raised with the rank and the traceback text attached
        raise RankFailure(rank, e, traceback.format_exc()) from e


def _node_ip() -> str:
    try:
        import ray
        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def _node_id() -> str:
    """The Ray node this process runs on ("" outside Ray): several raylets can share one host name."""
    try:
        import ray
        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return ""


class Pool(Protocol):
    world_size: int
    distributed: bool

    def run(self, host_method: str, per_rank_args: list[tuple], *, timeout_s: float | None = None) -> list[Any]: ...

    def submit(self, host_method: str, per_rank_args: list[tuple]) -> Any: ...

    def describe(self, rank: int) -> str: ...

    def close(self) -> None: ...


class LocalPool:
    """Ranks as objects in this process, called one after another (no process group)."""

    def __init__(self, world_size: int = 1, *, name: str = "local") -> None:
        self.world_size, self.name, self.distributed = world_size, name, False
        self.hosts = [RankHost(rank, world_size) for rank in range(world_size)]

    def run(self, host_method: str, per_rank_args: list[tuple], *, timeout_s: float | None = None) -> list[Any]:
        return [getattr(host, host_method)(*args) for host, args in zip(self.hosts, per_rank_args)]

    def submit(self, host_method: str, per_rank_args: list[tuple]) -> "DoneCall":
        """Runs the call now (this process has no one to overlap with); `.result()` returns or raises it."""
        try:
            return DoneCall(self.run(host_method, per_rank_args), None)
        except RankFailure as e:
            return DoneCall(None, e)

    def describe(self, rank: int) -> str:
        return f"rank {rank} (in the controller process)"

    def close(self) -> None:
        for host in self.hosts:
            host.close()


class DoneCall:
    """A finished call (LocalPool.submit)."""

    def __init__(self, results: list[Any] | None, error: RankFailure | None) -> None:
        self.results, self.error = results, error

    def done(self) -> bool:
        return True

    def result(self, timeout_s: float | None = None) -> list[Any]:
        if self.error is not None:
            raise self.error
        assert self.results is not None
        return self.results
