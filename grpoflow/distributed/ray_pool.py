"""Ranks as Ray actors in a placement group (`backend=ray`).

Each rank's `RankHost` lives in its own Ray actor process, pinned to one bundle of a placement
group ({"GPU": 1, "CPU": c} on GPU clusters, {"CPU": c} otherwise). A pool with `distributed`
joins its ranks into one torch.distributed group; the rendezvous address is rank 0's node IP
and a free port found there, never a fixed one.

Calls wait on all ranks at once and report the first rank that fails, so a dead rank stops
the run in seconds even while its peers sit in a collective waiting for it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from grpoflow.distributed.host import CallTimeout, RankFailure, RankHost, WorkerDied


class ClusterError(RuntimeError):
    """Ray could not start, or the cluster cannot hold what the config asks for."""


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ClusterError("backend=ray needs Ray: pip install 'grpoflow[ray]'.") from e
    return ray


def start_ray(address: str | None = None, num_cpus: int | None = None, tmpdir: str | None = None) -> bool:
    """Connect to a cluster (`address`) or start Ray on this machine; returns whether it was started here.

    A running Ray (ray.init already called in this process) is reused.
    """
    ray = _ray()
    if ray.is_initialized():
        return False
    if tmpdir:
        os.environ["RAY_TMPDIR"] = tmpdir
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "runtime_env": {"env_vars": env}}
    if address is None:
        kwargs["num_cpus"] = num_cpus
    try:
        ray.init(address=address, **kwargs)
    except Exception as e:
        where = f"the cluster at ray.address={address}" if address else "a local Ray instance"
        hint = (" Start one with `ray start --head` on the head node (and `ray start --address=<head>:6379` on "
                "the others), or drop ray.address to start Ray on this machine." if address else "")
        raise ClusterError(f"could not start {where}: {type(e).__name__}: {e}.{hint}") from e
    return address is None


def cluster_gpus() -> int:
    return int(_ray().cluster_resources().get("GPU", 0))


class RayPool:
    """`world_size` RankHosts in Ray actors, one per placement-group bundle."""

    def __init__(self, world_size: int, *, name: str, cpus_per_rank: float = 1.0, use_gpu: bool = False,
                 distributed: bool = True, start_timeout_s: float = 120.0, threads: int = 0,
                 group_timeout_s: float = 1800.0) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world_size, self.name, self.distributed = world_size, name, distributed
        bundle = {"CPU": cpus_per_rank, **({"GPU": 1} if use_gpu else {})}
        self.pg = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK", name=f"grpoflow-{name}")
        ready, _ = ray.wait([self.pg.ready()], timeout=start_timeout_s)
        if not ready:
            remove_placement_group(self.pg)
            raise ClusterError(
                f"the {name} ranks asked Ray for {world_size} x {bundle} and got nothing within "
                f"{start_timeout_s:.0f}s; the cluster has {_resources(ray.cluster_resources())} in all, "
                f"{_resources(ray.available_resources())} free. Lower resources.devices_per_node / rollout.workers "
                f"or resources.cpus_per_rank, or add nodes.")
        actor_cls = ray.remote(RankHost)
        threads = threads or max(1, int(cpus_per_rank))
        self.hosts = [actor_cls.options(
            num_cpus=cpus_per_rank, num_gpus=1 if use_gpu else 0, max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=r),
        ).remote(r, world_size, threads) for r in range(world_size)]
        self.infos: list[dict] = [{} for _ in range(world_size)]
        self.infos = self.run("info", [()] * world_size, timeout_s=start_timeout_s)
        if distributed:
            master = self.infos[0]
            self.run("init_process_group", [(master["ip"], master["port"], group_timeout_s)] * world_size,
                     timeout_s=start_timeout_s)

    def run(self, host_method: str, per_rank_args: list[tuple], *, timeout_s: float | None = None) -> list[Any]:
        """Call `host_method` on every rank at once; results in rank order.

        Raises RankFailure for the first rank that fails (its exception, or WorkerDied if its
        process ended) and CallTimeout for the first rank still running after `timeout_s`.
        """
        return self.submit(host_method, per_rank_args).result(timeout_s)

    def submit(self, host_method: str, per_rank_args: list[tuple]) -> "RayCall":
        """Start the call and return at once; `.result()` waits for it. Calls to one rank run in the
        order they were submitted."""
        ray = _ray()
        ranks = list(range(self.world_size))
        shared = all(a is per_rank_args[0] for a in per_rank_args)
        if shared and len(ranks) > 1:  # one copy in the object store for all ranks (Ray resolves the refs)
            stored = tuple(ray.put(a) for a in per_rank_args[0])
            refs = [_remote_call(self.hosts[r], host_method, stored) for r in ranks]
        else:
            refs = [_remote_call(self.hosts[r], host_method, args) for r, args in zip(ranks, per_rank_args)]
        return RayCall(self, host_method, refs, ranks)

    def _get(self, ref: Any, rank: int, host_method: str) -> Any:
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            if isinstance(cause, RankFailure):
                raise cause from None
            raise RankFailure(rank, cause if cause is not None else e, str(e)) from None
        except ray.exceptions.RayActorError as e:
            node = self.infos[rank].get("node", "") if rank < len(self.infos) else ""
            raise RankFailure(rank, WorkerDied(
                "its process ended (killed, out of memory, or crashed, or its node left the cluster)"
                + (f"; it ran on Ray node {node[:12]}" if node else "")), str(e)) from None

    def describe(self, rank: int) -> str:
        info = self.infos[rank] if rank < len(self.infos) else {}
        return f"rank {rank} (pid {info.get('pid', '?')} on {info.get('host', '?')})" if info else f"rank {rank}"

    def close(self) -> None:
        ray = _ray()
        from ray.util.placement_group import remove_placement_group
        for host in getattr(self, "hosts", []):
            ray.kill(host, no_restart=True)
        self.hosts = []
        if getattr(self, "pg", None) is not None:
            remove_placement_group(self.pg)
            self.pg = None


class RayCall:
    """An in-flight call on some ranks of a RayPool."""

    def __init__(self, pool: RayPool, host_method: str, refs: list, ranks: list[int]) -> None:
        self.pool, self.host_method, self.refs, self.ranks = pool, host_method, refs, ranks

    def done(self) -> bool:
        ready, _ = _ray().wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self, timeout_s: float | None = None) -> list[Any]:
        ray = _ray()
        rank_of = {ref: r for ref, r in zip(self.refs, self.ranks)}
        pending, results = list(self.refs), {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
            if not done:
                late = sorted(rank_of[ref] for ref in pending)
                raise RankFailure(late[0], CallTimeout(
                    f"no answer from rank(s) {late} within {timeout_s:g}s"), "")
            ref = done[0]
            try:
                results[rank_of[ref]] = self.pool._get(ref, rank_of[ref], self.host_method)
            except RankFailure as failure:
                raise self._root_cause(failure, pending, rank_of) from None
        return [results[r] for r in self.ranks]

    def _root_cause(self, failure: RankFailure, pending: list, rank_of: dict, grace_s: float = 5.0) -> RankFailure:
        """A rank that raised may only be the peer of one whose process died (a collective that lost its
        partner): give the other ranks `grace_s` to report, and name a dead one first, since a restart
        (trainer.max_restarts) is for dead processes and never for errors in the code."""
        if isinstance(failure.original, WorkerDied) or not pending:
            return failure
        ready, _ = _ray().wait(pending, num_returns=len(pending), timeout=grace_s)
        for ref in ready:
            try:
                self.pool._get(ref, rank_of[ref], self.host_method)
            except RankFailure as other:
                if isinstance(other.original, WorkerDied):
                    return other
        return failure


def _remote_call(host: Any, host_method: str, args: tuple) -> Any:
    return getattr(host, host_method).remote(*args)


def _resources(res: dict) -> str:
    keys = [k for k in ("CPU", "GPU", "memory") if k in res]
    return "{" + ", ".join(f"{k}: {res[k] / 2**30:.1f} GiB" if k == "memory" else f"{k}: {res[k]:g}"
                           for k in keys) + "}"
