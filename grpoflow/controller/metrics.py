"""Step metrics: a logger to the console and `metrics.jsonl` (the stage timer is grpoflow/training/timing.py).

Each record is appended and fsynced before the step's checkpoint can be written, so a crash can tear
only a line that no checkpoint is behind. Reading the file back (`read_metrics`: a torn last line dropped, any
other damaged line skipped, each with a warning naming the line) is grpoflow/metrics_file.py's, the one reader
the viewer uses too.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tqdm import tqdm

from grpoflow.metrics_file import METRICS, read_metrics


# the columns of the console line, in order, with their short labels
CONSOLE = [("critic/score/mean", "reward"), ("actor/pg_loss", "pg"), ("actor/kl_loss", "kl"),
           ("actor/entropy", "ent"), ("response_length/mean", "len"), ("timing_s/step", "s/step"),
           ("perf/throughput", "tok/s")]


class MetricsLogger:
    """Appends one JSON object per step to `run_dir/metrics.jsonl`; prints a line every `every` steps."""

    def __init__(self, run_dir: str | Path, every: int = 10) -> None:
        self.path = Path(run_dir) / METRICS
        self.every = max(every, 1)

    def start(self, resume_step: int = 0) -> list[dict]:
        """Keep the records of steps <= resume_step (all of a fresh run's are dropped); return them.

        A run resumed from step k redoes the steps after k, so their old records go."""
        kept = [r for r in read_metrics(self.path.parent) if 0 < resume_step and r["step"] <= resume_step] \
            if self.path.exists() else []
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        with open(tmp, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in kept))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        return kept

    def log(self, step: int, metrics: dict[str, float], *, force_print: bool = False) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())  # on disk before this step's checkpoint: a torn line has no checkpoint behind it
        vals = [k for k in metrics if k.startswith("val/")]
        if force_print or vals or step % self.every == 0:
            parts = [f"{label} {metrics[k]:.4g}" for k, label in CONSOLE if k in metrics]
            parts += [f"{k} {metrics[k]:.4f}" for k in sorted(vals)]
            tqdm.write(f"step {step:>4} | " + " | ".join(parts))


def _clean(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None
