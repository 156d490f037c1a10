"""Findings 2-5: the run folder. A garbage `latest`, a fresh run in a used folder, two runs in one folder and a
changed config on resume must each lose nothing and mix nothing, and say what happened."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpoflow.config import ConfigError
from grpoflow.controller.checkpoint import CheckpointManager, save_state
from grpoflow.commands.export import export
from hostile_runs import ARGS, checkpoints, metrics, run


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-step run: checkpoints step_000002 and step_000003, latest = step_000003."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run(out)
    assert checkpoints(out) == ["step_000002", "step_000003"]
    return out


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(out)], check=True)
    return out


# ---------------------------------------------------------------- finding 2: a garbage `latest`


@pytest.mark.parametrize("content", [b"", b"hello\n", b"\xff\xfe\x00garbage"], ids=["empty", "text", "binary"])
def test_a_garbage_latest_pointer_falls_back_to_the_newest_checkpoint(finished, tmp_path, content, caplog):
    out = copy_of(finished, tmp_path)
    before = metrics(out)
    (out / "checkpoints" / "latest").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="grpoflow.checkpoint"):
        run(out, steps=3)  # nothing left to train if step 3 is found; a restart from 0 would redo 3 steps
    assert metrics(out) == before, "the run started over instead of resuming from step_000003"
    assert checkpoints(out) == ["step_000002", "step_000003"]
    warned = [r.getMessage() for r in caplog.records if "which is not a checkpoint folder" in r.getMessage()]
    assert warned and "taking the newest valid checkpoint" in warned[0]


# ---------------------------------------------------------------- finding 3: resume=never and keep_last


def test_a_fresh_run_in_a_used_folder_keeps_its_own_checkpoints_and_moves_the_old_aside(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    run(out, "trainer.resume=never", steps=1)
    assert checkpoints(out) == ["step_000001"], "the new run's checkpoint was pruned (or old ones remain)"
    assert (out / "checkpoints" / "latest").read_text() == "step_000001"
    assert [r["step"] for r in metrics(out)] == [1]
    (previous,) = (out / "previous").iterdir()  # the old run, moved aside whole
    assert checkpoints(previous) == ["step_000002", "step_000003"] and metrics(previous) == metrics(finished)
    assert (export(out, tmp_path / "exported") / "config.json").exists()


def test_pruning_counts_steps_and_never_removes_the_checkpoint_just_written(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    write = lambda step: lambda folder: (folder.mkdir(), save_state({"step": step}, folder / "controller.pt"))  # noqa: E731
    manager.save(999999, write(999999))
    manager.save(1000000, write(1000000))  # 7 digits: sorts before step_999999 by name
    assert checkpoints(tmp_path) == ["step_1000000"]


# ---------------------------------------------------------------- finding 4: two runs in one folder

SLOW_REWARD = textwrap.dedent('''
    import time
    def slow(prompt, completion, **row):
        time.sleep(0.2)
        return 0.0
''')


def test_a_second_run_in_the_same_folder_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "run"
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    log = open(tmp_path / "first.log", "wb")
    first = subprocess.Popen([sys.executable, "-m", "grpoflow.cli", "train", f"trainer.output_dir={out}",
                              "trainer.total_steps=200", *ARGS, f"reward.function={reward}:slow"],
                             stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.2)
        with pytest.raises(ConfigError, match=f"is in use by another run \\(pid {first.pid} on "):
            run(out, f"reward.function={reward}:slow", steps=2)
    finally:
        first.kill()
        first.wait()
        log.close()
    steps = [r["step"] for r in metrics(out)]
    assert steps == sorted(set(steps)), f"two runs interleaved their metrics: {steps}"


def test_checkpoint_temporary_names_are_unique_to_the_writer(tmp_path):
    """Two writers of the same step (two processes, or a stale folder) never share a temporary folder."""
    manager, other = CheckpointManager(tmp_path), CheckpointManager(tmp_path)

    def write(folder):
        folder.mkdir()
        other.save(1, lambda f: (f.mkdir(), save_state({"step": 1}, f / "controller.pt")))  # the other writer
        save_state({"step": 1}, folder / "controller.pt")  # must still find its own folder

    manager.save(1, write)
    assert checkpoints(tmp_path) == ["step_000001"] and not list((tmp_path / "checkpoints").glob(".tmp-*"))


# ---------------------------------------------------------------- finding 5: a changed config on resume


def test_resuming_with_changed_training_settings_is_refused_listing_them(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    config_before = (out / "config.yaml").read_bytes()
    base_before = (out / "base_model" / "config.json").stat().st_mtime_ns
    with pytest.raises(ConfigError) as refused:
        run(out, "rollout.n=4", "actor.lr=0.5", "algorithm.adv_estimator=rloo", "model.path=builtin:tiny-4m",
            steps=4)
    message = str(refused.value)
    for change in ("rollout.n: 2 -> 4", "actor.lr:", "algorithm.adv_estimator: 'grpo' -> 'rloo'",
                   "model.path: 'builtin:tiny-0.5m' -> 'builtin:tiny-4m'", "trainer.resume_config_changes=allow"):
        assert change in message, message
    assert (out / "config.yaml").read_bytes() == config_before, "config.yaml was overwritten"
    assert (out / "base_model" / "config.json").stat().st_mtime_ns == base_before, "base_model/ was rebuilt"
    assert checkpoints(out) == ["step_000002", "step_000003"]


def test_an_explicit_override_resumes_and_keeps_the_original_config(finished, tmp_path, caplog):
    out = copy_of(finished, tmp_path)
    config_before = (out / "config.yaml").read_bytes()
    with caplog.at_level(logging.WARNING, logger="grpoflow.run_folder"):
        run(out, "actor.lr=0.0001", "trainer.resume_config_changes=allow", steps=4)
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
    assert (out / "config.yaml").read_bytes() == config_before
    assert any("actor.lr:" in r.getMessage() for r in caplog.records)
    assert "lr: 0.0001" in (out / "checkpoints" / "step_000004" / "config.yaml").read_text()


def test_a_run_that_fails_its_input_checks_writes_no_config(tmp_path):
    out = tmp_path / "run"
    with pytest.raises((ConfigError, FileNotFoundError, ValueError)):
        run(out, f"data.train_files=[{tmp_path / 'missing.jsonl'}]")
    assert not (out / "config.yaml").exists()
