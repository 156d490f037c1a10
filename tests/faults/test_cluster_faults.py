"""Ray across nodes, and nodes and workers that die: on Ray's own multi-node test cluster on one machine
(`ray.cluster_utils.Cluster`: a head without CPUs and three raylets of one CPU each, so every rank lands on a
node of its own).

- FSDP2 ranks on two nodes (gloo between them), and a rollout engine on another node than the trainer,
  give the first step of the one-process run.
- trainer.max_restarts: a node removed mid-run, or the rollout engine's process killed while it works,
  rebuilds the workers on the nodes still alive and continues from the last checkpoint; the finished
  run's metrics equal the uninterrupted run's. With 0 the run stops naming the rollout worker, keeping
  its checkpoint and metrics.
- An async run (split engines, max_staleness 1, dynamic sampling) SIGKILLed at a random step resumes
  bit-exactly: the checkpoint holds the samples of the steps in flight.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

import grpoflow.controller.trainer as trainer_module
from fault_runs import REWARDS, TIMEOUT_S, comparable, last_step, report
from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager, problem
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import sft_stage, train
from grpoflow.distributed.worker_group import WorkerError

pytestmark = pytest.mark.faults

SAVE_EVERY, TOTAL = 2, 6
ARGS = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=8",
        f"reward.function={REWARDS}:slow_length", f"trainer.total_steps={TOTAL}", f"trainer.save_every={SAVE_EVERY}",
        "trainer.keep_last=0", "trainer.val_every=0", "trainer.log_every=1", "trainer.resume=auto",
        "model.compute_dtype=float32", "resources.cpus_per_rank=1", "ray.start_timeout_s=60"]
FIRST_STEP_KEYS = ["critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy"]
TWO_NODES = ["backend=ray", "resources.nodes=2"]
SPLIT = ["backend=ray", "placement=split", "rollout.workers=1"]


@pytest.fixture(scope="module")
def cluster():
    """Head (no CPUs: nothing of a run lands there, so removing a node never takes the GCS) + 3 one-CPU nodes."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("this test process already runs another Ray instance")
    tmp = tempfile.mkdtemp(prefix="gf-rc-")  # short: Ray's socket paths must stay under 108 bytes
    (Path(tmp) / "ray").mkdir()
    old_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    began = time.perf_counter()
    # Fast health checks: a removed node is known dead in about 1.5 s (the default takes tens of seconds).
    head = {"num_cpus": 0, "temp_dir": tmp, "include_dashboard": False,
            "_system_config": {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                               "health_check_failure_threshold": 3}}
    c = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(3):
        c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    c.wait_for_nodes()
    report(f"ray test cluster: head + 3 one-CPU nodes up in {time.perf_counter() - began:.1f} s")
    yield c
    ray.shutdown()
    c.shutdown()
    if old_tmpdir is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = old_tmpdir
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> str:
    run = tmp_path_factory.mktemp("warm")
    return sft_stage(load_config(None, ARGS + ["sft.steps=30", f"trainer.output_dir={run}"]))


def recording_placements(mp: pytest.MonkeyPatch) -> list:
    """Every Placement the controller builds from now on (the first, then one per restart): where ranks ran."""
    built: list = []
    real = trainer_module.build_placement

    def recording(cfg):
        built.append(real(cfg))
        return built[-1]

    mp.setattr(trainer_module, "build_placement", recording)
    return built


@pytest.fixture
def placements(monkeypatch) -> list:
    return recording_placements(monkeypatch)


def config(out: Path, warm_model: str, *extra: str):
    return load_config("builtin", ARGS + [f"model.path={warm_model}", "sft.steps=0", f"trainer.output_dir={out}",
                                          *extra])


def run(out: Path, warm_model: str, *extra: str) -> list[dict]:
    train(config(out, warm_model, *extra))
    return read_metrics(out)


def without_restarts(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "restarts"} for r in records]


def first_step(records: list[dict]) -> dict:
    return {k: records[0][k] for k in FIRST_STEP_KEYS}


def assert_close(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= tol * max(1.0, abs(a[k])), (k, a[k], b[k])


@pytest.fixture(scope="module")
def references(cluster, warm_model, tmp_path_factory) -> dict:
    """Uninterrupted runs, made once: one process (local), two FSDP2 ranks on two nodes, split placement; and the
    Ray nodes their ranks ran on."""
    root = tmp_path_factory.mktemp("references")
    runs = {"local": [], "two_nodes": TWO_NODES, "split": SPLIT}
    out: dict = {}
    for name, extra in runs.items():
        began = time.perf_counter()
        with pytest.MonkeyPatch.context() as mp:
            built = recording_placements(mp)
            run(root / name, warm_model, *extra)
        out[name], out[f"{name} placement"] = root / name, built[0]
        report(f"reference run {name}: {TOTAL} steps in {time.perf_counter() - began:.1f} s")
    return out


def nodes_of(pool) -> list[str]:
    return [info["node"] for info in pool.infos]


def test_fsdp_ranks_on_two_nodes_and_an_engine_on_another_node_match_one_process(references):
    local = read_metrics(references["local"])
    assert first_step(local)["actor/grad_norm"] > 0.01  # a real update (the score is the response length)
    assert_close(first_step(local), first_step(read_metrics(references["two_nodes"])))
    assert_close(first_step(local), first_step(read_metrics(references["split"])))
    two, split = references["two_nodes placement"], references["split placement"]
    assert len(set(nodes_of(two.train))) == 2
    assert nodes_of(split.train)[0] != nodes_of(split.rollout)[0]
    report("multi-node: 2 FSDP2 ranks on 2 nodes, and split placement with the engine on another node than the "
           "trainer, give the one-process first step (within 1e-5)")


def in_background(fn) -> threading.Thread:
    errors: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread by `joined`
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def joined(thread: threading.Thread) -> None:
    thread.join(timeout=TIMEOUT_S)
    if thread.errors:  # type: ignore[attr-defined]
        raise thread.errors[0]  # type: ignore[attr-defined]


def wait_until(condition, what: str) -> None:
    deadline = time.time() + TIMEOUT_S
    while not condition():
        assert time.time() < deadline, f"no {what} within {TIMEOUT_S} s"
        time.sleep(0.01)


def checkpoint_written(out: Path, step: int):
    latest = out / "checkpoints" / "latest"
    return lambda: latest.exists() and latest.read_text().strip() >= f"step_{step:06d}"


def test_a_node_removed_mid_run_restarts_on_the_nodes_left_and_finishes(cluster, references, placements, tmp_path,
                                                                         warm_model, monkeypatch):
    monkeypatch.setenv("GRPOFLOW_FAULTS_REWARD_SLEEP", "0.01")  # steps long enough to remove a node inside one
    out = tmp_path / "run"
    removed: dict = {}

    def remove_rank_1s_node():
        wait_until(checkpoint_written(out, SAVE_EVERY), f"checkpoint {SAVE_EVERY}")
        victim = nodes_of(placements[0].train)[1]
        node = next(n for n in cluster.list_all_nodes() if n.node_id == victim)
        removed.update(node=victim, step=last_step(out) + 1, at=time.perf_counter())
        cluster.remove_node(node, allow_graceful=False)

    killer = in_background(remove_rank_1s_node)
    began = time.perf_counter()
    records = run(out, warm_model, *TWO_NODES, "trainer.max_restarts=1")
    seconds = time.perf_counter() - began
    joined(killer)
    try:
        assert without_restarts(comparable(out)) == comparable(references["two_nodes"])
        restarted = [r["step"] for r in records if r.get("restarts") == 1]
        assert restarted == list(range(SAVE_EVERY + 1, TOTAL + 1))  # every step after the checkpoint, redone
        log = [json.loads(line) for line in (out / "restarts.jsonl").read_text().splitlines()]
        assert len(log) == 1 and "WorkerDied" in log[0]["cause"] and log[0]["checkpoint"].endswith("step_000002")
        assert len(placements) == 2 and removed["node"] not in nodes_of(placements[1].train)
        assert len(set(nodes_of(placements[1].train))) == 2
    finally:
        cluster.add_node(num_cpus=1)  # back to three nodes for the tests after this one
        cluster.wait_for_nodes()
    lost = removed["step"] - 1 - SAVE_EVERY
    report(f"node of FSDP rank 1 removed during step {removed['step']}: restarted on the 2 nodes left, finished "
           f"all {TOTAL} steps equal to the uninterrupted run; {lost} finished step(s) after the checkpoint redone "
           f"(0 lost); run {seconds:.1f} s ({log[0]['cause'][:90]}...)")


def busy(pid: int) -> bool:
    """Whether the Ray actor process `pid` is running a call (Ray titles it `ray::RankHost.timed_call` then)."""
    try:
        return b"timed_call" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_engine_while_it_works(out: Path, placements: list, killed: dict):
    def kill():
        wait_until(checkpoint_written(out, SAVE_EVERY), f"checkpoint {SAVE_EVERY}")
        pid = placements[0].rollout.infos[0]["pid"]
        wait_until(lambda: busy(pid), "call on the rollout engine")
        os.kill(pid, signal.SIGKILL)
        killed.update(pid=pid, step=last_step(out) + 1)
    return kill


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="sees the engine at work through /proc")
def test_a_rollout_engine_killed_while_generating_restarts_and_finishes(references, placements, tmp_path,
                                                                        warm_model, monkeypatch):
    monkeypatch.setenv("GRPOFLOW_FAULTS_REWARD_SLEEP", "0.01")
    out, killed = tmp_path / "run", {}
    killer = in_background(kill_engine_while_it_works(out, placements, killed))
    began = time.perf_counter()
    run(out, warm_model, *SPLIT, "trainer.max_restarts=2")
    seconds = time.perf_counter() - began
    joined(killer)
    assert without_restarts(comparable(out)) == comparable(references["split"])
    log = [json.loads(line) for line in (out / "restarts.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["role"] == "rollout" and f"pid {killed['pid']}" in log[0]["cause"]
    report(f"rollout engine (pid {killed['pid']}) SIGKILLed during step {killed['step']}: restarted, finished all "
           f"{TOTAL} steps equal to the uninterrupted run, 0 steps lost; run {seconds:.1f} s "
           f"({log[0]['cause'][:80]}...)")


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="sees the engine at work through /proc")
def test_a_rollout_engine_killed_without_restarts_stops_naming_it(references, placements, tmp_path, warm_model,
                                                                  monkeypatch):
    monkeypatch.setenv("GRPOFLOW_FAULTS_REWARD_SLEEP", "0.01")
    out, killed = tmp_path / "run", {}
    killer = in_background(kill_engine_while_it_works(out, placements, killed))
    with pytest.raises(WorkerError) as err:
        train(config(out, warm_model, *SPLIT))
    joined(killer)
    message = str(err.value).split("\n--- original traceback ---")[0]
    assert f"rollout worker rank 0 (pid {killed['pid']}" in message and "process ended" in message
    assert "set trainer.max_restarts=N" in message and "step_000002" in message
    latest = CheckpointManager(out).latest()
    assert latest is not None and latest.name >= "step_000002" and problem(latest) is None
    kept = comparable(out)
    assert kept and kept == comparable(references["split"])[:len(kept)]  # every finished step kept, unchanged
    # The same command resumes from that checkpoint and ends with the uninterrupted run's metrics.
    train(config(out, warm_model, *SPLIT))
    assert comparable(out) == comparable(references["split"])
    report(f"rollout engine killed during step {killed['step']}, trainer.max_restarts=0: stopped with "
           f"\"{message[:110]}...\"; {latest.name} and {len(kept)} steps of metrics kept; the same command "
           "then finished equal to the uninterrupted run")


ASYNC = [*SPLIT, "trainer.mode=async", "rollout.max_staleness=1", "algorithm.filter_groups.enable=true",
         "algorithm.filter_groups.max_draws=2"]


def test_an_async_run_sigkilled_at_a_random_step_resumes_exactly(cluster, warm_model, tmp_path):
    reference = tmp_path / "uninterrupted"
    began = time.perf_counter()
    run(reference, warm_model, *ASYNC)
    reference_s = time.perf_counter() - began
    assert [r["async/staleness/max"] for r in read_metrics(reference)][:2] == [0, 1]
    out = tmp_path / "killed"
    kill_after = random.Random().randint(SAVE_EVERY + 1, TOTAL - 1)
    overrides = [f"model.path={warm_model}", "sft.steps=0", f"trainer.output_dir={out}",
                 f"ray.address={cluster.address}"]
    # The controller's float sums depend on its thread count: the same as this process's reference run.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    log = tmp_path / "killed.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "grpoflow.cli", "train", "builtin", *ARGS, *overrides, *ASYNC],
                                stdout=sink, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + TIMEOUT_S
    while last_step(out) < kill_after:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    checkpoint = CheckpointManager(out).latest()
    assert checkpoint is not None
    began = time.perf_counter()
    run(out, warm_model, *ASYNC)  # trainer.resume=auto; Ray ends the killed driver's actors
    assert comparable(out) == comparable(reference)
    report(f"async run (max_staleness 1, dynamic sampling) SIGKILLed after step {kill_after}: resumed from "
           f"{checkpoint.name} with its in-flight samples, metrics identical to the uninterrupted run "
           f"(reference {reference_s:.1f} s, resume {time.perf_counter() - began:.1f} s)")
