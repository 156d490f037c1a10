"""Where the roles run: the pools of ranks a config asks for.

- `backend=local`: one rank in the controller's process; every role on it.
- `backend=ray`, `placement=colocated`: one Ray actor per device (nodes x devices_per_node
  ranks, one torch.distributed group); actor, reference, critic, reward model and rollout
  engine all live on those ranks.
- `backend=ray`, `placement=split`: the training roles as above, and `rollout.workers` rollout
  engines in their own Ray actors (no process group), fed weights after each update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpoflow.config import Config, world_size
from grpoflow.distributed.host import LocalPool, Pool


@dataclass
class Placement:
    train: Pool
    rollout: Pool
    started_ray: bool = False

    @property
    def colocated(self) -> bool:
        return self.train is self.rollout

    def close(self) -> None:
        """Stop every rank (and Ray, if it was started for this run)."""
        for pool in {id(self.train): self.train, id(self.rollout): self.rollout}.values():
            pool.close()
        if self.started_ray:
            import ray
            ray.shutdown()


def build_placement(cfg: Config) -> Placement:
    if cfg.backend == "local":
        pool = LocalPool(1)
        return Placement(pool, pool)
    from grpoflow.distributed.ray_pool import ClusterError, RayPool, cluster_gpus, start_ray

    r, ray_cfg = cfg.resources, cfg.ray
    started = start_ray(ray_cfg.address, ray_cfg.num_cpus, ray_cfg.tmpdir)
    placement = None
    try:
        world = world_size(cfg)
        split = cfg.placement == "split"
        gpus = cluster_gpus()
        need = world + (cfg.rollout.workers * cfg.rollout.tensor_parallel_size if split else 0)
        if 0 < gpus < need:
            raise ClusterError(f"the config asks for {need} GPUs ({world} training ranks = resources.nodes x "
                               f"resources.devices_per_node" + (f", {cfg.rollout.workers} rollout workers" if split
                                                                else "") + f") but the Ray cluster has {gpus}.")
        common: dict[str, Any] = dict(cpus_per_rank=r.cpus_per_rank, use_gpu=gpus > 0,
                                      start_timeout_s=ray_cfg.start_timeout_s)
        train = RayPool(world, name="train", distributed=True, **common)
        placement = Placement(train, train, started_ray=started)
        if split:
            placement.rollout = RayPool(cfg.rollout.workers, name="rollout", distributed=False, **common)
        return placement
    except BaseException:
        if placement is not None:
            placement.close()
        elif started:
            import ray
            ray.shutdown()
        raise
