"""Faults inside a run: rewards that are not numbers, a loss that overflows, a reward worker killed from
outside, the dataset file deleted. Each ends in a finished run or a clear error, with nothing saved lost."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from fault_runs import report, ARGS, REWARDS, SAVE_EVERY, TOTAL_STEPS, Run, last_step, start, wait_for_step
from grpoflow.cli import main
from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager, problem
from grpoflow.controller.metrics import read_metrics
from grpoflow.controller.reward_health import RewardFailure
from grpoflow.commands.run import train
from grpoflow.tasks.addition import addition_splits

pytestmark = pytest.mark.faults


def test_rewards_of_nan_and_inf_on_every_sample_stop_the_run_before_it_trains(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RewardFailure, match=r"(?s)not_finite failed on all 16 samples of step 1.*returned (nan|inf)"):
        train(load_config(None, [f"trainer.output_dir={out}", *ARGS, "trainer.total_steps=2", "trainer.val_every=0",
                                 f"reward.function={REWARDS}:not_finite", "reward.error_score=-1"]))
    assert read_metrics(out) == []  # no step trained on error scores alone
    report("NaN/inf rewards on every sample: stopped before step 1 trained, naming the function and the value")


def test_a_loss_that_overflows_stops_clearly_and_keeps_the_last_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    first = [f"trainer.output_dir={out}", *ARGS, f"trainer.total_steps={SAVE_EVERY}"]
    assert main(["train", *first]) == 0
    capsys.readouterr()
    kept = read_metrics(out)
    # The same run continued with a reward near float32's limit and no std normalisation: step 4's loss is not finite.
    # (A resume that changes training settings is refused unless allowed: this one means to.)
    code = main(["train", f"trainer.output_dir={out}", *ARGS, f"reward.function={REWARDS}:huge",
                 "algorithm.norm_adv_by_std=false", "trainer.resume_config_changes=allow"])
    error = capsys.readouterr().err
    assert code == 2
    assert f"Stopped at step {SAVE_EVERY + 1}: the loss became nan" in error
    assert "Lower actor.lr, check that rewards are finite" in error
    checkpoint = out / "checkpoints" / f"step_{SAVE_EVERY:06d}"
    assert f"the last checkpoint, {checkpoint}, is where a rerun resumes" in error
    assert CheckpointManager(out).latest() == checkpoint and problem(checkpoint) is None
    assert read_metrics(out) == kept  # the failed step wrote nothing
    report(f"loss overflow: exit 2 at step {SAVE_EVERY + 1}, checkpoint step_{SAVE_EVERY:06d} and metrics of steps "
           f"1-{SAVE_EVERY} kept")


def reward_workers(parent: int) -> set[int]:
    """PIDs of the reward worker processes `parent` started (children running grpoflow.user_code_child)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"grpoflow.user_code_child" in cmdline:
            pids.add(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the worker processes through /proc")
def test_a_reward_worker_killed_mid_call_is_replaced_and_the_run_finishes(tmp_path):
    busy = tmp_path / "busy"  # the reward function marks a call in progress with a file named after its pid
    busy.mkdir()
    run = start(tmp_path / "run", "reward.workers=2", sleep=0.05, env={"GRPOFLOW_FAULTS_BUSY_DIR": str(busy)})
    wait_for_step(run, 1)
    before = reward_workers(run.proc.pid)
    assert len(before) == 2
    victim = wait_for_busy_worker(run, busy, before)
    os.kill(victim, signal.SIGKILL)
    replaced = wait_for_replacement(run, before)
    assert run.wait() == 0, run.output()[-3000:]
    assert last_step(run.out) == TOTAL_STEPS
    assert replaced - before, "no new reward worker was started"
    errors = sum(r.get("reward/errors", 0) for r in read_metrics(run.out))
    assert errors >= 1  # the sample it held scored reward.error_score
    assert "worker process died (signal SIGKILL) during this call" in run.output()
    report(f"reward worker {victim} killed mid-call: replaced by {sorted(replaced - before)}, {errors:.0f} "
          f"sample(s) scored reward.error_score, run finished")


def wait_for_busy_worker(run: Run, busy: Path, workers: set[int]) -> int:
    deadline = time.time() + 120
    while time.time() < deadline and run.proc.poll() is None:
        inside = {int(p.name) for p in busy.iterdir()} & workers
        if inside:
            return min(inside)
        time.sleep(0.005)
    raise AssertionError("no reward worker was seen inside a call")


def wait_for_replacement(run: Run, before: set[int]) -> set[int]:
    deadline = time.time() + 120
    while time.time() < deadline and run.proc.poll() is None:
        now = reward_workers(run.proc.pid)
        if now - before:
            return now
        time.sleep(0.02)
    return set()


def test_a_dataset_file_deleted_mid_run_does_not_stop_it(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in addition_splits()[0][:200]))
    run = start(tmp_path / "run", f"data.train_files={data}", "data.val_files=[builtin:addition/val]")
    wait_for_step(run, 1)
    data.unlink()  # the rows were read at start: the run does not need the file
    assert run.wait() == 0, run.output()[-3000:]
    assert last_step(run.out) == TOTAL_STEPS
    # Running it again needs the file, and says so before any model loads.
    again = start(tmp_path / "run", f"data.train_files={data}", "data.val_files=[builtin:addition/val]")
    assert again.wait() == 2
    error = next(line for line in again.output().splitlines() if "error:" in line)
    assert str(data) in error
    report(f"dataset deleted mid-run: finished all {TOTAL_STEPS} steps; rerun: exit 2, {error.strip()}")
