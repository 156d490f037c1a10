"""Worker classes for the Ray backend tests (importable by the Ray worker processes)."""

import os
import time

import torch
import torch.distributed as dist


class Toy:
    """Records what it was given; can fail, die or hang on request."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.seen = []

    def echo(self, value, *rest, **kwargs):
        self.seen.append(value)
        return value

    def where(self):
        return {"rank": self.rank, "world": self.world_size, "pid": os.getpid(),
                "dist_world": dist.get_world_size() if dist.is_initialized() else 0}

    def all_reduce(self, value: float) -> float:
        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t)

    def fail_on_rank_one(self, value):
        if self.rank == 1:
            raise ValueError(f"bad shard of {len(value)} rows")
        return value

    def die_on_rank_one(self):
        if self.rank == 1:
            os._exit(1)
        dist.barrier()  # rank 0 waits for its dead peer: the controller must not hang on it
        return self.rank

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def weights(self):
        return [("w", torch.full((2,), float(self.rank + 1)))]

    def load(self, named, version):
        self.loaded = (list(named), version)
        return self.loaded

    def loaded_weights(self):
        return self.loaded
