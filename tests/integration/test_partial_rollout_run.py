"""rollout.partial on a tiny run: two runs with the same config and seed give identical metrics, and a run SIGKILLed
anywhere and resumed from its last checkpoint (which holds the paused samples) equals the uninterrupted one."""

import random

import pytest

from grpoflow.commands.run import train
from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager, load_state
from kills import comparable, kill_at_step, train_process, train_to_end

ARGS = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=8", "trainer.total_steps=6", "trainer.save_every=2", "trainer.keep_last=0",
        "trainer.val_every=3", "data.val_max_prompts=8", "actor.minibatches=2", "trainer.log_every=1",
        "rollout.partial.enable=true", "rollout.partial.oversample=1.5", "rollout.partial.max_staleness=1"]


def start(out):
    """The run as its own process with one thread, as every run of this file is: the token-level IS metrics
    (mismatch/*, ~1e-7) differ in their last bits between thread counts, so runs compare in one setting."""
    return train_process([f"trainer.output_dir={out}", *ARGS])


def run(out):
    train_to_end([f"trainer.output_dir={out}", *ARGS], timeout_s=300)
    return comparable(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, run(out)


def test_partial_runs_carry_samples_across_versions_and_repeat_exactly(uninterrupted, tmp_path):
    out, metrics = uninterrupted
    steps = [m for m in metrics if "rollout/partial/staleness/max" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]
    # samples that spanned two versions were trained, none older than rollout.partial.max_staleness
    assert any(m["rollout/partial/multi_version_frac"] > 0 for m in steps)
    assert max(m["rollout/partial/staleness/max"] for m in steps) == 1
    assert all(m["rollout/partial/new_groups"] + m["rollout/partial/carried_groups"] >= 4 for m in steps)
    assert "actor/rollout_is/mean" in steps[0]  # token-level importance weights on
    assert run(tmp_path) == metrics


def test_sigkill_then_resume_with_paused_samples_equals_uninterrupted(uninterrupted, tmp_path):
    kill_after = random.Random().randint(3, 5)
    proc = start(tmp_path)
    kill_at_step(proc, tmp_path, kill_after)
    latest = CheckpointManager(tmp_path).latest()
    assert latest is not None, "no checkpoint was written before the kill"
    pool = load_state(latest / "controller.pt")["in_flight"]["partial_pool"]
    paused = [p["trajectory"] for g in pool for p in g["samples"] if p is not None and "trajectory" in p]
    paused = [t for t in paused if t["open"]["ids"]]
    assert paused, "the checkpoint holds no paused sample"
    assert run(tmp_path) == uninterrupted[1]  # trainer.resume=auto


def test_two_rollout_workers_on_ray_each_pause_on_their_share(ray_cluster, tmp_path):
    # placement=split with two engines: the pool is split over them, each pauses once its share of the step's
    # groups is complete; the step still trains whole groups within the staleness bound
    args = [a for a in ARGS if not a.startswith(("trainer.total_steps", "trainer.save_every", "trainer.val_every"))]
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *args, "trainer.total_steps=4", "trainer.save_every=0",
                             "trainer.val_every=0", "backend=ray", "placement=split", "rollout.workers=2",
                             "resources.cpus_per_rank=0.5"]))
    steps = [m for m in comparable(tmp_path) if "rollout/partial/staleness/max" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert all(m["rollout/partial/staleness/max"] <= 1 for m in steps)
    assert steps[0]["rollout/partial/new_groups"] == 6 and all(m["rollout/partial/carried_groups"] == 2 for m in steps)
    assert any(m["rollout/partial/carried_samples"] > 0 for m in steps)
