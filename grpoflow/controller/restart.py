"""Automatic restart (`trainer.max_restarts`): which faults a restart can cure, and what is said about one.

A restart is for faults of the cluster, not of the run: a rank's process that died (killed, out of
memory, its node gone) or a call that did not answer in time (a weight sync past
`rollout.sync_timeout_s`). An exception raised by the code on a live rank (a bad reward function,
a NaN loss, a shape error) would only happen again, so it stops the run as before.

The run loop (fit.py) then has the controller tear every worker group down, builds them again on the Ray nodes
still alive, loads the newest checkpoint this run wrote (or starts over if there is none) and goes
on; resume is exact, so the steps after that checkpoint are redone identically. Each restart prints
one line with its cause and appends it to `<run folder>/restarts.jsonl`; every later step logs the
count as the metric `restarts`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm import tqdm

from grpoflow.distributed.host import CallTimeout, WorkerDied
from grpoflow.distributed.worker_group import WorkerError

RESTARTS_FILE = "restarts.jsonl"
_TRACEBACK = "\n--- original traceback ---"


def restartable(error: WorkerError) -> bool:
    """Whether rebuilding the workers can cure `error`: a dead process or a call that timed out."""
    return isinstance(error.original, (WorkerDied, CallTimeout))


def cause(error: WorkerError) -> str:
    """The error's first line (which worker, which call, what happened), without the traceback."""
    return str(error).split(_TRACEBACK, 1)[0].splitlines()[0]


def with_restart_advice(error: WorkerError, max_restarts: int, checkpoint: Path | None) -> WorkerError:
    """`error`, its message extended with what a rerun resumes from and, for a fault a restart would cure,
    that trainer.max_restarts does it automatically."""
    if not restartable(error):
        return error
    head, sep, tail = str(error).partition(_TRACEBACK)
    kept = (f"the same command resumes from the last checkpoint, {checkpoint}" if checkpoint else
            "no checkpoint was written yet, so the same command starts over")
    if max_restarts:
        advice = f". Stopped after trainer.max_restarts={max_restarts} automatic restarts; {kept}."
    else:
        advice = (f". {kept[0].upper()}{kept[1:]}; set trainer.max_restarts=N (e.g. 2) to rebuild the workers and "
                  "continue from the last checkpoint automatically.")
    return WorkerError(head + advice + sep + tail, role=error.role, rank=error.rank, original=error.original)


def record_restart(run_dir: Path, count: int, max_restarts: int, step: int, error: WorkerError,
                   checkpoint: Path | None) -> None:
    """Say that restart `count` begins, and why, on the console and in `<run_dir>/restarts.jsonl`."""
    where = f"the checkpoint {checkpoint}" if checkpoint else "step 0 (no checkpoint yet)"
    tqdm.write(f"restart {count} of trainer.max_restarts={max_restarts} during step {step}: {cause(error)}; "
               f"rebuilding the workers and resuming from {where}")
    with open(Path(run_dir) / RESTARTS_FILE, "a") as f:
        f.write(json.dumps({"restart": count, "time": time.time(), "during_step": step, "role": error.role,
                            "rank": error.rank, "cause": cause(error),
                            "checkpoint": str(checkpoint) if checkpoint else None}) + "\n")
