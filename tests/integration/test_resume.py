"""Kill a run anywhere (SIGKILL at a step, or in the middle of writing a checkpoint), resume, get the same run."""

import json
import random
import signal

import pytest

from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager, save_state
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from kills import comparable, kill_at_step, train_process

ARGS = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=6", "trainer.save_every=2", "trainer.keep_last=0",
        "trainer.val_every=3", "data.val_max_prompts=8", "actor.minibatches=2", "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive", "trainer.log_every=1"]
# In the middle of writing the step-4 checkpoint (all files written, folder not yet renamed): die.
CRASH_IN_SAVE = """
import os, signal, sys
import grpoflow.controller.checkpoint as ckpt
real = ckpt.fsync_tree
def fsync_then_die(folder):
    real(folder)
    if folder.name.startswith(".tmp-step_000004-"):  # the writer's own name: .tmp-step_000004-<pid>-<random>
        os.kill(os.getpid(), signal.SIGKILL)
ckpt.fsync_tree = fsync_then_die
from grpoflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


def train_groups(run_dir):
    """The training groups the run wrote (train_samples.jsonl), as parsed lines."""
    return [json.loads(line) for line in (run_dir / "train_samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    train(load_config(None, [f"trainer.output_dir={out}", *ARGS]))
    return comparable(out), train_groups(out)


def start(out, script=None):
    return train_process([f"trainer.output_dir={out}", *ARGS], script=script)


def test_sigkill_at_a_random_step_then_resume_equals_uninterrupted(tmp_path, uninterrupted):
    kill_after = random.Random().randint(3, 5)
    proc = start(tmp_path)
    kill_at_step(proc, tmp_path, kill_after)
    assert CheckpointManager(tmp_path).latest() is not None, "no checkpoint was written before the kill"
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS]))   # trainer.resume=auto
    metrics, groups = uninterrupted
    assert comparable(tmp_path) == metrics
    # the training groups too: those of steps up to the checkpoint kept once, the later ones written again
    assert train_groups(tmp_path) == groups and {g["step"] for g in groups} == set(range(1, 7))


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, uninterrupted):
    proc = start(tmp_path, CRASH_IN_SAVE)
    proc.wait(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert CheckpointManager(tmp_path).latest().name == "step_000002"    # step 4 never became visible
    assert list((tmp_path / "checkpoints").glob(".tmp-step_000004-*"))
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS]))
    assert comparable(tmp_path) == uninterrupted[0]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))  # the next run (holding the lock) removed it
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == \
        ["step_000002", "step_000004", "step_000006"]


def test_resume_of_a_finished_run_trains_nothing_and_never_starts_over(tmp_path, capsys):
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS, "trainer.total_steps=2"])
    train(cfg)
    before = comparable(tmp_path)
    train(cfg)
    assert comparable(tmp_path) == before
    assert "nothing left to train" in capsys.readouterr().out


def test_keep_last_prunes_and_resume_path_errors(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        manager.save(step, lambda folder, step=step: (folder.mkdir(),
                                                      save_state({"step": step}, folder / "controller.pt")))
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
    assert manager.latest().name == "step_000003" and manager.resolve("never") is None
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        manager.resolve(str(tmp_path / "nowhere"))


def test_resuming_with_another_total_steps_says_the_schedule_changed(tmp_path, capsys):
    # It used to continue silently on a different cosine schedule.
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS, "trainer.total_steps=2", "trainer.val_every=0",
                             "actor.lr_schedule=cosine"])
    train(cfg)
    capsys.readouterr()
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS, "trainer.total_steps=3", "trainer.val_every=0",
                             "actor.lr_schedule=cosine"]))
    out = capsys.readouterr().out
    assert "resuming with trainer.total_steps=3, but the checkpoint was written by a run with " \
           "trainer.total_steps=2: the cosine learning-rate schedule continues on the new horizon" in out
    assert "Set trainer.total_steps=2 to continue the original run exactly." in out
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


@pytest.mark.slow
def test_a_bf16_compute_copy_run_resumes_exactly(tmp_path):
    """model.compute_dtype=bfloat16 trains on a bf16 copy of the float32 masters (training/mixed_precision.py); the
    resumed run casts its copy from the loaded masters, so it equals the uninterrupted one (the KL reference, old
    log-probs of two mini-batches and the update all run on the copy)."""
    bf16 = [*ARGS, "model.compute_dtype=bfloat16"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    train(load_config(None, [f"trainer.output_dir={full}", *bf16]))
    proc = train_process([f"trainer.output_dir={killed}", *bf16])
    kill_at_step(proc, killed, 3)
    assert CheckpointManager(killed).latest() is not None, "no checkpoint was written before the kill"
    train(load_config(None, [f"trainer.output_dir={killed}", *bf16]))
    assert comparable(killed) == comparable(full)
