"""Step metrics: a timer for stages, and a logger to the console and `metrics.jsonl`."""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tqdm import tqdm


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


# the columns of the console line, in order, with their short labels
CONSOLE = [("critic/score/mean", "reward"), ("actor/pg_loss", "pg"), ("actor/kl_loss", "kl"),
           ("actor/entropy", "ent"), ("response_length/mean", "len"), ("timing_s/step", "s/step"),
           ("perf/throughput", "tok/s")]


class MetricsLogger:
    """Appends one JSON object per step to `run_dir/metrics.jsonl`; prints a line every `every` steps."""

    def __init__(self, run_dir: str | Path, every: int = 10) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.every = max(every, 1)

    def start(self, resume_step: int = 0) -> list[dict]:
        """Keep the records of steps <= resume_step (all of a fresh run's are dropped); return them.

        A run resumed from step k redoes the steps after k, so their old records go."""
        kept = [r for r in read_metrics(self.path.parent) if 0 < resume_step and r["step"] <= resume_step] \
            if self.path.exists() else []
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)
        return kept

    def log(self, step: int, metrics: dict[str, float], *, force_print: bool = False) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        vals = [k for k in metrics if k.startswith("val/")]
        if force_print or vals or step % self.every == 0:
            parts = [f"{label} {metrics[k]:.4g}" for k, label in CONSOLE if k in metrics]
            parts += [f"{k} {metrics[k]:.4f}" for k in sorted(vals)]
            tqdm.write(f"step {step:>4} | " + " | ".join(parts))


def _clean(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
