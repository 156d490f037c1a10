"""What the fault tests share: one short run, started as `grpoflow train` in a subprocess (so that it can
be signalled or killed), waiting for it to reach a step, and what makes two runs the same run.

The run: the 0.5M-parameter built-in model, 8 GRPO steps of 4 prompts x 4 samples, a checkpoint every
3 steps (and after the last), validation every 4, two mini-batches and an adaptive KL controller, so a
resumed run has optimizer, sampler, KL and RNG state to get right. The reward is exact_match behind
an optional sleep (GRPOFLOW_FAULTS_REWARD_SLEEP) that makes a step long enough to be interrupted
inside; the sleep changes no number, so every interrupted run is compared with one uninterrupted run
that does not sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpoflow.controller.checkpoint import CheckpointManager
from grpoflow.controller.metrics import read_metrics

HERE = Path(__file__).resolve().parent
REWARDS = HERE / "fault_rewards.py"
TOTAL_STEPS, SAVE_EVERY = 8, 3
ARGS = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", f"trainer.total_steps={TOTAL_STEPS}", f"trainer.save_every={SAVE_EVERY}",
        "trainer.keep_last=0", "trainer.val_every=4", "data.val_max_prompts=8", "actor.minibatches=2",
        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "trainer.log_every=1",
        f"reward.function={REWARDS}:slow_exact_match"]
TIMEOUT_S = 300


@dataclass
class Run:
    """A `grpoflow train` subprocess; stdout and stderr go to `log` (a pipe could fill and stall it)."""
    proc: subprocess.Popen
    out: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self) -> int:
        return self.proc.wait(timeout=TIMEOUT_S)


def start(out: Path, *extra: str, script: str | None = None, sleep: float = 0.0, prefix: tuple[str, ...] = (),
          new_session: bool = False, env: dict[str, str] | None = None) -> Run:
    """`grpoflow train trainer.output_dir=out *ARGS *extra` (or `python -c script train ...`, a wrapper that
    prepares a fault and then calls the CLI), each reward call sleeping `sleep` seconds."""
    cmd = [sys.executable, "-c", script] if script else [sys.executable, "-m", "grpoflow.cli"]
    log = out.parent / f"{out.name}.log"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPOFLOW_FAULTS_REWARD_SLEEP": str(sleep), **(env or {})}
    with open(log, "ab") as sink:
        proc = subprocess.Popen([*prefix, *cmd, "train", f"trainer.output_dir={out}", *ARGS, *extra],
                                stdout=sink, stderr=subprocess.STDOUT, env=full_env, start_new_session=new_session)
    return Run(proc, out, log)


def last_step(out: Path) -> int:
    """The newest step in metrics.jsonl (-1: none yet)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    return max(steps, default=-1)


def wait_for_step(run: Run, step: int) -> None:
    """Until metrics.jsonl holds `step` (the run is then inside step + 1); fails if the run ends first."""
    deadline = time.time() + TIMEOUT_S
    while last_step(run.out) < step:
        assert run.proc.poll() is None, f"the run ended before step {step}:\n{run.output()[-3000:]}"
        assert time.time() < deadline, f"no step {step} within {TIMEOUT_S} s"
        time.sleep(0.02)


def wait_for_checkpoint(run: Run, step: int) -> None:
    """Until the checkpoint of `step` is published (`latest` names it)."""
    deadline = time.time() + TIMEOUT_S
    latest = run.out / "checkpoints" / "latest"
    while not (latest.exists() and latest.read_text().strip() == f"step_{step:06d}"):
        assert run.proc.poll() is None, f"the run ended before checkpoint {step}:\n{run.output()[-3000:]}"
        assert time.time() < deadline, f"no checkpoint {step} within {TIMEOUT_S} s"
        time.sleep(0.02)


def signal_and_time(run: Run, signum: int, *, group: bool = False) -> float:
    """Send `signum` (to the run's whole process group, as a terminal's Ctrl-C does, with `group`); seconds to exit."""
    sent = time.perf_counter()
    if group:
        os.killpg(run.proc.pid, signum)
    else:
        run.proc.send_signal(signum)
    run.wait()
    return time.perf_counter() - sent


def comparable(out: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock values."""
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s", "perf"))} for r in read_metrics(out)]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    latest = CheckpointManager(out).latest()
    assert latest is not None, f"{out} has no checkpoint"
    return load_file(latest / "actor" / "model.safetensors")


@dataclass
class Reference:
    """The uninterrupted run: its folder, comparable metrics and final weights."""
    out: Path
    metrics: list[dict]
    weights: dict[str, torch.Tensor]


def assert_same_run(out: Path, reference: Reference) -> None:
    """Metrics (but wall-clock) and final policy weights identical, bit for bit."""
    assert comparable(out) == reference.metrics
    weights = final_weights(out)
    assert weights.keys() == reference.weights.keys()
    assert all(torch.equal(weights[k], reference.weights[k]) for k in weights)


def step_folders(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("step_*"))


def report(line: str) -> None:
    """One measured outcome: printed (pytest -s shows it) and appended to $GRPOFLOW_FAULTS_REPORT if set
    (.ci/faults_stage prints that file at the end)."""
    print(line)
    path = os.environ.get("GRPOFLOW_FAULTS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
