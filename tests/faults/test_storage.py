"""Storage faults: a checkpoint write that fails stops with an error naming the path and the free space and
leaves the previous checkpoint and `latest` as they were; a damaged checkpoint is skipped at resume.

The failures are the operating system's own, brought about at the moment the step-6 checkpoint is written
by a wrapper that runs the CLI (like tests/integration/test_resume.py's crash-in-save wrapper):

- Disk full: a full disk cannot be made without mount rights, so after the step-3 checkpoint the wrapper
  lowers RLIMIT_FSIZE to 1 MiB; the kernel then refuses the write of the 2 MB weights file (EFBIG, "File
  too large") exactly where a full disk refuses it (ENOSPC), in the same write call of the same library.
- No permission: after the step-3 checkpoint the wrapper makes checkpoints/ read-only (chmod 555). Root
  ignores file modes, so as root the run starts under `setpriv` with CAP_DAC_OVERRIDE and
  CAP_DAC_READ_SEARCH dropped from its capability sets, which makes the mode bind (skipped if setpriv
  cannot do that here).
"""

import logging
import os
import shutil
import subprocess

import pytest

from fault_runs import report, ARGS, SAVE_EVERY, TOTAL_STEPS, assert_same_run, last_step, start, step_folders
from grpoflow.config import load_config
from grpoflow.controller.checkpoint import problem
from grpoflow.commands.run import train

pytestmark = pytest.mark.faults

AFTER_FIRST_CHECKPOINT = """
import os, resource, signal, sys
import grpoflow.controller.checkpoint as ckpt
real_save = ckpt.CheckpointManager.save
def save(self, step, write):
    path = real_save(self, step, write)
    if step == {step}:
        {fault}
    return path
ckpt.CheckpointManager.save = save
from grpoflow.cli import main
sys.exit(main(sys.argv[1:]))
"""
DISK_FULL = ("signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "  # else the kernel kills the writer instead of failing
             "resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))")
READ_ONLY = "os.chmod(self.root, 0o555)"
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


def permission_prefix() -> list[str]:
    """How to run a process that file modes bind: as is unless root; as root, under setpriv without DAC override."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: chmod cannot stop root's writes")
    try:
        ok = subprocess.run([*DROP_DAC, "true"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        ok = False
    if not ok:
        pytest.skip("running as root and setpriv cannot drop CAP_DAC_OVERRIDE here: chmod cannot stop root's writes")
    return DROP_DAC


@pytest.mark.parametrize("fault, cause", [(DISK_FULL, "File too large"), (READ_ONLY, "Permission denied")],
                         ids=["disk full", "permission denied"])
def test_a_failed_checkpoint_write_stops_clearly_and_keeps_the_previous_one(tmp_path, uninterrupted, fault, cause):
    prefix = permission_prefix() if fault == READ_ONLY else []
    run = start(tmp_path / "run", script=AFTER_FIRST_CHECKPOINT.format(step=SAVE_EVERY, fault=fault),
                prefix=tuple(prefix))
    code = run.wait()
    output = run.output()
    os.chmod(run.out / "checkpoints", 0o755)
    assert code == 2, output[-3000:]
    error = next(line for line in output.splitlines() if line.startswith("grpoflow train: error:"))
    assert f"could not write the checkpoint {run.out / 'checkpoints' / 'step_000006'}" in error
    assert cause in error and " free of " in error
    assert f"the previous checkpoint {run.out / 'checkpoints' / 'step_000003'} and `latest` are unchanged" in error
    assert (run.out / "checkpoints" / "latest").read_text() == "step_000003"
    assert step_folders(run.out) == ["step_000003"]  # and no .tmp- folder holds the disk's space
    assert not list((run.out / "checkpoints").glob(".tmp-*"))
    assert problem(run.out / "checkpoints" / "step_000003") is None
    report(f"{cause}: exit 2 after step {last_step(run.out)}; checkpoint step_000003 kept, "
          f"{last_step(run.out) - SAVE_EVERY} steps to redo")

    resumed = start(tmp_path / "run")  # the same command, the fault gone
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert_same_run(run.out, uninterrupted)


def truncate_weights(folder):
    path = folder / "actor" / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def remove_optimizer(folder):
    (folder / "actor" / "optimizer.pt").unlink()


def scramble_controller_state(folder):
    path = folder / "controller.pt"
    path.write_bytes(b"\0" * path.stat().st_size)  # same size: only reading it can tell


@pytest.mark.parametrize("damage", [truncate_weights, remove_optimizer, scramble_controller_state],
                         ids=["truncated safetensors", "missing optimizer.pt", "unreadable controller.pt"])
def test_a_damaged_latest_checkpoint_is_skipped_and_the_one_before_resumes(tmp_path, uninterrupted, damage, caplog):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted.out, out)  # a finished run: checkpoints 3, 6, 8
    damage(out / "checkpoints" / f"step_{TOTAL_STEPS:06d}")
    with caplog.at_level(logging.WARNING, logger="grpoflow.checkpoint"):
        train(load_config(None, [f"trainer.output_dir={out}", *ARGS]))
    skipped = [r.getMessage() for r in caplog.records if "skipping the checkpoint" in r.getMessage()]
    assert skipped and f"step_{TOTAL_STEPS:06d}" in skipped[0] and "falling back to the one before" in skipped[0]
    report(skipped[0])
    assert_same_run(out, uninterrupted)  # steps 7 and 8 redone from step 6, identically


def test_resuming_from_a_named_damaged_checkpoint_is_an_error(tmp_path, uninterrupted):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted.out, out)
    folder = out / "checkpoints" / "step_000006"
    truncate_weights(folder)
    with pytest.raises(ValueError, match="the checkpoint is damaged .actor/model.safetensors holds"):
        train(load_config(None, [f"trainer.output_dir={out}", *ARGS, f"trainer.resume={folder}"]))
