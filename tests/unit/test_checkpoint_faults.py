"""CheckpointManager against storage faults, on small fake checkpoints (tests/faults does it on real runs)."""

import errno
import logging

import pytest

from grpoflow.controller.checkpoint import CheckpointManager, CheckpointWriteError, save_state


def fake(step):
    def write(folder):
        (folder / "actor").mkdir(parents=True)
        (folder / "actor" / "model.safetensors").write_bytes(b"w" * 100)
        save_state({"step": step}, folder / "controller.pt")
    return write


def test_a_failed_write_removes_its_folder_and_keeps_latest(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, fake(1))

    def full_disk(folder):
        fake(2)(folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointWriteError) as info:
        manager.save(2, full_disk)
    message = str(info.value)
    assert f"could not write the checkpoint {manager.root / 'step_000002'}: OSError: [Errno 28]" in message
    assert " free of " in message and "free space (or lower trainer.keep_last)" in message
    assert f"the previous checkpoint {manager.root / 'step_000001'} and `latest` are unchanged" in message
    assert sorted(p.name for p in manager.root.iterdir()) == ["latest", "step_000001"]


def test_latest_skips_damaged_folders_and_ignores_folders_newer_than_the_pointer(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        manager.save(step, fake(step))
    (manager.root / "step_000003" / "actor" / "model.safetensors").write_bytes(b"w" * 50)
    (manager.root / "step_000002" / "controller.pt").unlink()
    (manager.root / "step_000009").mkdir()  # left by a run with trainer.resume=never: not the pointer's
    with caplog.at_level(logging.WARNING, logger="grpoflow.checkpoint"):
        assert manager.latest() == manager.root / "step_000001"
    messages = [r.getMessage() for r in caplog.records]
    assert "actor/model.safetensors holds 50 bytes, 100 were written" in messages[0]
    assert "step_000002: controller.pt is missing" in messages[1]


def test_export_beside_a_run_with_keep_last_1_takes_the_checkpoint_that_replaced_the_pruned_one(tmp_path, monkeypatch,
                                                                                                 caplog):
    """Issue 53 item 7: `grpoflow export` while a run with trainer.keep_last=1 saves found no checkpoint when the
    latest was pruned while it was verified (or copied). Both races, made to happen at once here: the run
    publishes a newer checkpoint and prunes the one export is reading. Export lists again and takes the new one."""
    import shutil

    import grpoflow.controller.checkpoint as checkpoint
    from grpoflow.commands.export import export, find_checkpoint

    run = CheckpointManager(tmp_path, keep_last=1)

    def weights(step):
        def write(folder):
            fake(step)(folder)
            (folder / "actor" / "model.safetensors").write_bytes(bytes([step]) * 100)
        return write
    run.save(1, weights(1))
    real_check, real_copy = checkpoint.against_manifest, shutil.copytree

    def check_while_the_run_saves(folder, verify=False):
        if folder.name == "step_000001":
            run.save(2, weights(2))                   # publishes step 2, prunes step 1 under the check
        return real_check(folder, verify=verify)
    monkeypatch.setattr(checkpoint, "against_manifest", check_while_the_run_saves)
    with caplog.at_level(logging.WARNING, logger="grpoflow.checkpoint"):
        assert find_checkpoint(tmp_path) == run.root / "step_000002"
    assert not [r for r in caplog.records if "skipping" in r.getMessage()]

    def copy_while_the_run_saves(src, dst, **kwargs):
        if "step_000002" in str(src):
            run.save(3, weights(3))                   # step 2 goes before it is copied
        return real_copy(src, dst, **kwargs)
    monkeypatch.setattr(shutil, "copytree", copy_while_the_run_saves)
    out = export(tmp_path, tmp_path / "exported")
    assert (out / "model.safetensors").read_bytes() == bytes([3]) * 100


def test_efbig_names_the_file_size_limit_or_the_file_system(tmp_path, monkeypatch):
    """The message of an EFBIG write (tests/hostile/test_file_size_limit.py makes the kernel's own): under a limit it
    names the limit and ulimit -f; without one, the file system; never 'free space'."""
    import grpoflow.controller.checkpoint as checkpoint

    def too_big(folder):
        fake(1)(folder)
        raise RuntimeError("Error while serializing: I/O error: File too large (os error 27)")  # safetensors' words
    for limit, expected in ((4096, "may write no file over 4096 bytes"), (None, "its file system takes no file")):
        monkeypatch.setattr(checkpoint, "file_size_limit", lambda limit=limit: limit)
        with pytest.raises(CheckpointWriteError) as info:
            CheckpointManager(tmp_path).save(1, too_big)
        assert expected in str(info.value) and "free space" not in str(info.value)
    with pytest.raises(CheckpointWriteError, match="free space"):
        CheckpointManager(tmp_path).save(1, lambda folder: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
