"""Weight sync, streamed: colocated one tensor at a time, split in buckets through the controller."""

import threading
import time
from functools import partial

import pytest
import torch

from grpoflow.config import ActorConfig, Config, RolloutConfig
from grpoflow.controller.weight_sync import WeightSync
from grpoflow.distributed.host import LocalPool
from grpoflow.distributed.worker_group import WorkerError, WorkerGroup
from grpoflow.engines.external import WeightSyncTimeout
from grpoflow.engines.pushed_weights import PushedWeights
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.rollout import RolloutWorker


def groups(model_path: str, *, colocated: bool):
    train = LocalPool(1)
    rollout_pool = train if colocated else LocalPool(1, name="rollout")
    actor = WorkerGroup("actor", partial(ActorWorker, model_path=model_path, cfg=ActorConfig(lr=0.05), temperature=1.0,
                                         horizon=4, seed=0), pool=train)
    rollout = WorkerGroup("rollout", partial(RolloutWorker, model_path=model_path,
                                             cfg=Config(rollout=RolloutConfig(sync_timeout_s=30))),
                          pool=rollout_pool)
    return actor, rollout


def engine_of(group: WorkerGroup):
    return group.pool.hosts[0].roles[group.role].engine


def perturb(actor: WorkerGroup) -> dict:
    """Change the actor's weights in place (as an update would); its new state."""
    model = actor.pool.hosts[0].roles["actor"].engine.model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("colocated, bucket_bytes", [(True, 1 << 20), (False, 1 << 20), (False, 64 << 10)])
def test_the_engine_ends_with_the_actors_weights_and_version(tiny_model_path, colocated, bucket_bytes):
    actor, rollout = groups(tiny_model_path, colocated=colocated)
    sync = WeightSync(actor, rollout, queued=False, bucket_bytes=bucket_bytes)
    expected = perturb(actor)
    sync.push(3)
    engine = engine_of(rollout)
    assert engine.version == 3
    got = engine.model.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0)


def test_colocated_sync_streams_one_tensor_at_a_time(tiny_model_path):
    # the engine loads the first tensor when the actor's model has handed out only that one: no list anywhere
    # between the actor's parameters and the engine (actor stream, the pool's pipe, the rollout worker)
    actor, rollout = groups(tiny_model_path, colocated=True)
    model, engine = actor.pool.hosts[0].roles["actor"].engine.model, engine_of(rollout)
    produced: list[str] = []
    at_first_load: list[int] = []
    real_parameters, real_update = model.named_parameters, engine.update_weights

    def recorded_parameters(*args, **kwargs):
        for name, p in real_parameters(*args, **kwargs):
            produced.append(name)
            yield name, p

    def loads(stream):
        for item in stream:
            if not at_first_load:
                at_first_load.append(len(produced))
            yield item

    model.named_parameters = recorded_parameters
    engine.update_weights = lambda stream, version: real_update(loads(stream), version)
    WeightSync(actor, rollout, queued=False).push(1)
    assert at_first_load == [1] and len(produced) == len(dict(real_parameters())) > 1 and engine.version == 1


def test_split_sync_sends_the_weights_in_buckets_never_as_one_list(tiny_model_path):
    actor, rollout = groups(tiny_model_path, colocated=False)
    seen: list[int] = []
    worker = rollout.pool.hosts[0].roles["rollout"]
    push = worker.push_weights
    worker.push_weights = lambda bucket: (seen.append(len(bucket)), push(bucket))[1]
    params = sum(1 for _ in engine_of(rollout).model.parameters())
    WeightSync(actor, rollout, queued=False, bucket_bytes=64 << 10).push(1)
    assert len(seen) > 2 and sum(seen) == params   # several buckets, every tensor once


def test_queued_sync_runs_behind_and_is_checked_later(tiny_model_path):
    actor, rollout = groups(tiny_model_path, colocated=False)
    sync = WeightSync(actor, rollout, queued=True, bucket_bytes=1 << 20)
    sync.push(5)
    sync.wait()
    assert engine_of(rollout).version == 5 and sync.pending == []


class StuckEngine:
    """An engine whose update stops reading the stream after `reads` tensors (a hung load)."""

    def __init__(self, reads: int, error: Exception | None = None) -> None:
        self.reads, self.error, self.version, self.loaded = reads, error, 0, []
        self.release = threading.Event()

    def update_weights(self, named_tensors, version):
        for i, item in enumerate(named_tensors):
            self.loaded.append(item[0])
            if i + 1 == self.reads:
                if self.error is not None:
                    raise self.error
                self.release.wait(30)
        self.version = version


def test_pushed_weights_feed_the_engines_stream_in_order():
    engine = StuckEngine(reads=-1)
    update = PushedWeights(engine, 4, timeout_s=10)
    for bucket in ([("a", torch.zeros(1)), ("b", torch.zeros(1))], [("c", torch.zeros(1))]):
        update.push(bucket)
    update.finish()
    assert engine.loaded == ["a", "b", "c"] and engine.version == 4


def test_an_engine_error_reaches_the_caller():
    engine = StuckEngine(reads=2, error=KeyError("weight sync: no parameter 'b'"))
    update = PushedWeights(engine, 1, timeout_s=10)
    with pytest.raises(KeyError, match="no parameter 'b'"):
        for _ in range(5):
            update.push([("a", torch.zeros(1)), ("b", torch.zeros(1))])
        update.finish()
    assert engine.version == 0


def test_an_engine_that_stops_reading_times_out_instead_of_hanging():
    engine = StuckEngine(reads=1)
    update = PushedWeights(engine, 2, timeout_s=1.0)
    began = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match="version 2 did not complete within rollout.sync_timeout_s=1 s"):
        for _ in range(10):
            update.push([("a", torch.zeros(1))])
        update.finish()
    assert time.monotonic() - began < 5
    engine.release.set()


def test_a_bad_tensor_name_fails_the_split_sync_naming_the_rollout_worker(tiny_model_path):
    actor, rollout = groups(tiny_model_path, colocated=False)
    worker = actor.pool.hosts[0].roles["actor"]
    real = worker.engine.named_weights
    worker.engine.named_weights = lambda: (("renamed." + n, t) for n, t in real())
    with pytest.raises(WorkerError, match="rollout worker rank 0.*no parameter 'renamed"):
        WeightSync(actor, rollout, queued=False).push(1)
    worker.engine.named_weights = real  # the failed update is over: the next one starts and lands
    WeightSync(actor, rollout, queued=False).push(2)
    assert engine_of(rollout).version == 2


def test_split_sync_sends_buckets_in_the_engines_bf16_and_counts_their_bytes(tiny_model_path):
    train, engines = LocalPool(1), LocalPool(1, name="rollout")
    actor = WorkerGroup("actor", partial(ActorWorker, model_path=tiny_model_path, cfg=ActorConfig(lr=0.05),
                                         temperature=1.0, horizon=4, seed=0), pool=train)
    rollout = WorkerGroup("rollout", partial(RolloutWorker, model_path=tiny_model_path, cfg=Config(),
                                             dtype="bfloat16"), pool=engines)
    sync = WeightSync(actor, rollout, queued=False, bucket_bytes=64 << 10, dtype="bfloat16")
    expected = perturb(actor)
    sent: list[torch.dtype] = []
    worker = engines.hosts[0].roles["rollout"]
    push = worker.push_weights
    worker.push_weights = lambda bucket: (sent.extend(t.dtype for _, t in bucket), push(bucket))[1]
    sync.push(1)
    params = sum(t.numel() for t in expected.values())
    assert set(sent) == {torch.bfloat16} and sync.last_bytes == 2 * params  # half the fp32 masters' bytes
    got = engine_of(rollout).model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor.to(torch.bfloat16))
