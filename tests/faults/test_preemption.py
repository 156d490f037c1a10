"""Preemption: SIGTERM, or one Ctrl-C, finishes the step, checkpoints, exits 0 and prints the command that
resumes; that command resumes exactly. A second Ctrl-C stops at once and loses only the unsaved steps."""

import os
import shutil
import signal
import tempfile
import time

import pytest

from fault_runs import report, SAVE_EVERY, TOTAL_STEPS, assert_same_run, comparable, last_step, signal_and_time, \
    start, step_folders, wait_for_checkpoint, wait_for_step
from grpoflow.controller.checkpoint import CheckpointManager, problem

pytestmark = pytest.mark.faults
SLEEP = 0.03  # per reward call: 16 calls make a step of about 0.5 s, long enough to signal inside it


@pytest.mark.parametrize("signum, group", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGTERM to the controller", "Ctrl-C to the process group"])
def test_signal_checkpoints_exits_0_and_the_same_command_resumes_exactly(tmp_path, uninterrupted, signum, group):
    run = start(tmp_path / "run", sleep=SLEEP, new_session=group)
    wait_for_step(run, 1)
    seconds = signal_and_time(run, signum, group=group)
    output = run.output()
    assert run.proc.returncode == 0, output[-3000:]
    stopped_at = last_step(run.out)
    assert 1 <= stopped_at < TOTAL_STEPS
    # The step under way was finished and saved, even off the save_every grid.
    assert CheckpointManager(run.out).latest().name == f"step_{stopped_at:06d}"
    assert problem(run.out / "checkpoints" / f"step_{stopped_at:06d}") is None
    assert f"stopped by {signal.Signals(signum).name} after step {stopped_at} of {TOTAL_STEPS}" in output
    resume_line = next(line for line in output.splitlines() if line.startswith("to resume: "))
    assert resume_line.startswith("to resume: grpoflow train trainer.output_dir=")
    # "within the step time plus the checkpoint time": a step here is ~0.5 s, a checkpoint ~0.1 s; the rest
    # is leaving the process (a validation step, tear-down).
    assert seconds < 20, f"{seconds:.1f} s from the signal to the exit"
    report(f"{signal.Signals(signum).name}: stopped after step {stopped_at}, exit 0 in {seconds:.1f} s")

    resumed = start(tmp_path / "run")  # the same command
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert f"resumed from {run.out / 'checkpoints' / f'step_{stopped_at:06d}'}" in resumed.output()
    assert_same_run(run.out, uninterrupted)


def test_a_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(tmp_path, uninterrupted):
    run = start(tmp_path / "run", sleep=0.1, new_session=True)  # steps of ~1.6 s: both Ctrl-Cs land in one
    wait_for_checkpoint(run, SAVE_EVERY)
    time.sleep(0.3)  # inside step 4 (a Ctrl-C right after the step-3 checkpoint stops cleanly there: nothing to do)
    os.killpg(run.proc.pid, signal.SIGINT)
    time.sleep(0.3)
    seconds = signal_and_time(run, signal.SIGINT, group=True)
    output = run.output()
    assert run.proc.returncode not in (0, None)
    assert "KeyboardInterrupt" in output
    assert seconds < 10, f"{seconds:.1f} s from the second Ctrl-C to the exit"
    # No checkpoint of the interrupted step: the newest is the last one on the save_every grid.
    latest = CheckpointManager(run.out).latest()
    assert latest is not None and int(latest.name.removeprefix("step_")) % SAVE_EVERY == 0, step_folders(run.out)
    stopped_at = last_step(run.out)
    report(f"second Ctrl-C: exit {run.proc.returncode} in {seconds:.1f} s; metrics to step {stopped_at}, "
          f"checkpoint {latest.name}")

    resumed = start(tmp_path / "run")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert_same_run(run.out, uninterrupted)


def test_ctrl_c_with_the_ray_backend_checkpoints_through_the_actors(tmp_path, request):
    """Ray starts its processes with SIGINT blocked, so a Ctrl-C to the whole process group reaches only the
    controller, which saves through the rank actors. (A SIGTERM to every process kills Ray's own GCS and
    raylet: docs/runs.md says to signal the controller alone.)"""
    pytest.importorskip("ray")
    ray_tmp = tempfile.mkdtemp(prefix="gf-ray-")  # short: Ray's socket paths must stay under 108 bytes
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    run = start(tmp_path / "run", "backend=ray", "ray.num_cpus=2", f"ray.tmpdir={ray_tmp}",
                "trainer.total_steps=400", "trainer.val_every=0", sleep=0.0, new_session=True)
    wait_for_step(run, 2)
    seconds = signal_and_time(run, signal.SIGINT, group=True)
    output = run.output()
    assert run.proc.returncode == 0, output[-3000:]
    stopped_at = last_step(run.out)
    assert CheckpointManager(run.out).latest().name == f"step_{stopped_at:06d}"
    assert "to resume: grpoflow train" in output
    report(f"ray, Ctrl-C: stopped after step {stopped_at}, exit 0 in {seconds:.1f} s")
    assert comparable(run.out)[-1]["step"] == stopped_at
