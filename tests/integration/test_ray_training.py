"""`backend=ray` runs the same controller code as `local`: same first step, same results for
colocated and split placement, async mode within its staleness bound, a dead worker named."""

import json
import os
import signal
import threading
import time

import pytest

from grpoflow.config import load_config
from grpoflow.commands.run import sft_stage, train
from plans import plan_of
from grpoflow.controller.fit import RunLoop
from grpoflow.controller.trainer import Controller
from grpoflow.data.dataset import prepare_prompts
from grpoflow.distributed.worker_group import WorkerError
from grpoflow.models.loading import load_tokenizer
from grpoflow.tasks.addition import addition_splits

pytestmark = pytest.mark.usefixtures("ray_cluster")

BASE = ["model.path=builtin:tiny-0.5m", "sft.steps=30", "reward.function=length", "data.prompts_per_step=8",
        "rollout.n=4", "trainer.total_steps=3", "trainer.val_every=0", "trainer.save_every=0", "trainer.resume=never",
        "trainer.log_every=100", "resources.cpus_per_rank=0.5"]
FIRST_STEP_KEYS = ["critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm",
                   "actor/entropy", "actor/pg_clipfrac"]


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> str:
    """The SFT warm start, made once (the runs below start from it)."""
    run = tmp_path_factory.mktemp("warm")
    return sft_stage(load_config(None, BASE + [f"trainer.output_dir={run}"]))


def run(tmp_path, warm_model: str, name: str, *overrides: str) -> list[dict]:
    out = tmp_path / name
    train(load_config("builtin", BASE + [f"model.path={warm_model}", "sft.steps=0", f"trainer.output_dir={out}",
                                     *overrides]))
    return [r for r in map(json.loads, open(out / "metrics.jsonl")) if "timing_s/step" in r]


def first_step(records: list[dict]) -> dict:
    return {k: records[0][k] for k in FIRST_STEP_KEYS if k in records[0]}


def assert_close(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= tol * max(1.0, abs(a[k])), (k, a[k], b[k])


# fp32 compute: with bf16 autocast, each rank's half-batch weight gradient is rounded to bf16
# before the ranks' sum, so 1e-5 only holds in fp32 (bf16 agrees to bf16 precision).
FP32 = "model.compute_dtype=float32"


@pytest.fixture(scope="module")
def colocated(tmp_path_factory, warm_model) -> list[dict]:
    """Two FSDP2 ranks, actor and rollout colocated: the run two tests compare with (made once, ~12 s)."""
    return run(tmp_path_factory.mktemp("ray"), warm_model, "colocated", FP32, "backend=ray",
               "resources.devices_per_node=2")


def test_two_fsdp_ranks_match_local_on_the_first_step(tmp_path, warm_model, colocated):
    local = run(tmp_path, warm_model, "local", FP32)
    assert first_step(local)["actor/grad_norm"] > 0.01  # a real update (score = response length varies)
    assert_close(first_step(local), first_step(colocated), 1e-5)
    assert len(colocated) == 3 and all(r["timing_s/dispatch"] >= 0 for r in colocated)


def test_colocated_and_split_placement_give_the_same_first_step(tmp_path, warm_model, colocated):
    split = run(tmp_path, warm_model, "split", FP32, "backend=ray", "resources.devices_per_node=2",
                "placement=split", "rollout.workers=2")
    assert_close(first_step(colocated), first_step(split), 1e-5)


def test_async_with_zero_staleness_equals_sync_and_staleness_stays_in_bound(tmp_path, warm_model):
    split = ["backend=ray", "placement=split"]
    sync = run(tmp_path, warm_model, "sync", *split)
    async0 = run(tmp_path, warm_model, "async0", *split, "trainer.mode=async", "rollout.max_staleness=0")
    # bit for bit, every step and every number (losses, gradient norms, rewards, lengths, mismatch): the same
    # samples go through the same operations in the same order, only on another clock
    assert len(sync) == len(async0) == 3
    for a, b in zip(sync, async0):
        numbers = [k for k in a if not k.startswith(("timing_s/", "perf/", "async/"))]
        assert {k: a[k] for k in numbers} == {k: b.get(k) for k in numbers}
    assert all(r["async/staleness/max"] == 0 for r in async0)
    async1 = run(tmp_path, warm_model, "async1", *split, "trainer.mode=async", "rollout.max_staleness=1",
                 "trainer.total_steps=4")
    assert [r["async/staleness/max"] for r in async1] == [0, 1, 1, 1]  # step 1's samples come from version 0
    assert all("timing_s/trainer_wait" in r and "timing_s/rollout_wait" in r for r in async1)
    assert all("actor/rollout_is/mean" in r for r in async1)  # stale samples are importance-weighted


def test_killing_a_worker_mid_run_stops_the_controller_naming_it(tmp_path, warm_model):
    cfg = load_config("builtin", BASE + [f"model.path={warm_model}", "sft.steps=0",
                                    f"trainer.output_dir={tmp_path / 'k'}", "backend=ray",
                                    "resources.devices_per_node=2", "trainer.total_steps=1000"])
    (tmp_path / "k").mkdir()
    tokenizer = load_tokenizer(warm_model)
    items = prepare_prompts(addition_splits()[0][:200], tokenizer)[0]
    controller = Controller(plan_of(cfg, model_path=warm_model, train_items=items, run_dir=tmp_path / "k",
                                    scorer=None))
    controller.rewards.scorer = _ConstantScorer()
    victim = controller.placement.train.infos[1]["pid"]
    threading.Timer(3.0, os.kill, (victim, signal.SIGKILL)).start()
    began = time.monotonic()
    try:
        with pytest.raises(WorkerError) as err:
            RunLoop(controller).fit()
    finally:
        controller.close()
    assert time.monotonic() - began < 3 + 20  # the kill comes 3 s in
    message = str(err.value)
    assert f"rank 1 (pid {victim}" in message and "process ended" in message


class _ConstantScorer:
    def score(self, prompts, completions, rows, contexts=None):
        from grpoflow.rewards.scoring import Scores
        return Scores([float(len(c) % 2) for c in completions])
