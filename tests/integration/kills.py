"""SIGKILL a training subprocess once its metrics.jsonl has logged a step (the resume-equality tests)."""

import json
import signal
import subprocess
import time
from pathlib import Path


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
