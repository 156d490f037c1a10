"""Training subprocesses for the resume-equality tests: start one (one thread unless told, so that runs compare in
one setting: float sums differ in their last bits between thread counts), SIGKILL it once its metrics.jsonl has
logged a step, run one to its end, and compare runs by their metrics without the timings."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpoflow.controller.metrics import read_metrics


def comparable(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl records without the timing and throughput keys (they differ between equal runs)."""
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s", "perf"))} for r in read_metrics(run_dir)]


def train_process(args: list[str], *, threads: int = 1, script: str | None = None) -> subprocess.Popen:
    """`grpoflow train *args` as its own process with `threads` torch threads (`script`: `python -c script train
    *args` in place of the CLI module); stdout dropped, stderr kept for the failure message."""
    cmd = [sys.executable, "-c", script] if script else [sys.executable, "-m", "grpoflow.cli"]
    return subprocess.Popen([*cmd, "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads)})


def train_to_end(args: list[str], timeout_s: float) -> None:
    """`grpoflow train *args` in a one-thread process, which must finish within `timeout_s` and exit 0."""
    proc = train_process(args)
    _, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err.decode()[-2000:]


def kill_at_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout_s: float = 300.0) -> None:
    """Wait until `run_dir/metrics.jsonl` holds a record of `step` or later (or the process ended, or `timeout_s`
    passed), then SIGKILL `proc` and reap it."""
    deadline = time.time() + timeout_s
    path = Path(run_dir) / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        lines = path.read_text().splitlines() if path.exists() else []
        if any(json.loads(line)["step"] >= step for line in lines if line):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
