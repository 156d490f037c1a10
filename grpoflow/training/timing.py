"""Seconds per stage: the controller's step stages and a worker's own model math, as `timing_s/<stage>` metrics."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class StageTimer:
    """`with timer("gen"): ...` records `timing_s/gen` (seconds, summed if a stage repeats)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}
