"""Step metrics: a logger to the console and `metrics.jsonl` (the stage timer is grpoflow/training/timing.py).

Each record is appended and fsynced before the step's checkpoint can be written, so a crash can tear
only a line that no checkpoint is behind: `read_metrics` drops a torn last line with a warning, and
names the file and line of any other line that is not a JSON object.
"""

from __future__ import annotations

import json
import logging
import math
import re
import os
from pathlib import Path

from tqdm import tqdm

from grpoflow.errors import UserError

log = logging.getLogger("grpoflow.metrics")


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


def _behind(run_dir: Path, torn: str) -> str:
    """What stands behind a torn metrics line: whether the checkpoint of its step exists."""
    step = re.match(r'\s*\{\s*"step"\s*:\s*(\d+)', torn)
    if step is None:
        return "its step cannot be read; a resume starts from the newest checkpoint"
    folder = run_dir / "checkpoints" / f"step_{int(step.group(1)):06d}"
    if folder.is_dir():
        return (f"but the checkpoint of its step, {folder.name}, was written: that step's metrics are lost and a "
                "resume starts after it")
    return "no checkpoint is behind it: a resume runs that step again"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of `run_dir/metrics.jsonl`; a torn last line (a crash mid-append) is dropped with a warning.

    Raises ValueError naming the file and line for any other line that is not a JSON object with a "step"."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a metrics file.") from None
    lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    records = []
    for i, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("not a JSON object with a \"step\"")
        except ValueError as e:
            if i == len(lines) - 1 and not text.endswith("\n"):
                log.warning("%s: its last line (line %d) is cut short, as by a crash while it was written; dropped "
                            "(%s).", path, number, _behind(path.parent, line))
                break
            raise UserError(f"{path}, line {number}, is not a metrics record ({e}): {line[:120]!r}. Delete or fix "
                            f"that line.") from None
        records.append(record)
    return records
