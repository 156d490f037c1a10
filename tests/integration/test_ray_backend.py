"""The Ray pool under one dispatch rule: same results as local, clear errors, no hangs."""

import time

import pytest
import torch

from grpoflow.data.batch import Batch
from grpoflow.distributed.host import LocalPool
from grpoflow.distributed.ray_pool import ClusterError, RayPool
from grpoflow.distributed.worker_group import WorkerError, WorkerGroup, broadcast

import ray_toys
from ray_toys import Toy

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(ray_toys)  # the worker processes need not import tests/

pytestmark = pytest.mark.usefixtures("ray_cluster")


def make_batch(n: int) -> Batch:
    mask = torch.ones(n, 2, dtype=torch.long)
    return Batch(prompt_ids=torch.arange(2 * n).view(n, 2), prompt_mask=mask,
                 response_ids=torch.arange(2 * n).view(n, 2), response_mask=mask, group_ids=torch.arange(n),
                 scores=torch.arange(n, dtype=torch.float32))


@pytest.fixture(scope="module")
def pool():
    pool = RayPool(2, name="test", cpus_per_rank=1, start_timeout_s=60)
    yield pool
    pool.close()


def test_ranks_are_ray_actors_in_one_process_group(pool):
    group = WorkerGroup("actor", Toy, pool=pool)
    where = [pool.run("call", [("actor", "where", (), {})] * 2)][0]
    assert [w["rank"] for w in where] == [0, 1]
    assert all(w["world"] == 2 and w["dist_world"] == 2 for w in where)
    assert len({w["pid"] for w in where}) == 2
    assert group.call(Toy.all_reduce, 1.5) == 3.0  # a gloo collective across the two actors


def test_dispatch_matches_the_local_backend(pool):
    ray_group, local_group = WorkerGroup("echo", Toy, pool=pool), WorkerGroup("echo", Toy, world_size=2)
    batch = make_batch(5)
    for group in (ray_group, local_group):
        out = group.call(Toy.echo, batch, "extra", key=1)
        assert torch.equal(out.scores, batch.scores) and torch.equal(out.response_ids, batch.response_ids)
        assert torch.equal(group.call(Toy.echo, batch.scores), batch.scores)  # not split: rank 0's result
        assert group.call(Toy.echo, [1, 2, 3, 4, 5]) == [1, 2, 3]  # rank 0's shard of a list; metrics come from rank 0
        assert group.call(Toy.echo, broadcast([1, 2, 3])) == [1, 2, 3]  # sent whole to every rank


def test_colocated_transfer_stays_in_each_rank_process(pool):
    src, dst = WorkerGroup("src", Toy, pool=pool), WorkerGroup("dst", Toy, pool=pool)
    src.transfer(Toy.weights, dst, Toy.load, 7)
    got = pool.run("call", [("dst", "loaded_weights", (), {})] * 2)
    assert [float(named[0][1][0]) for named, _ in got] == [1.0, 2.0]  # each rank got its own process's tensor
    assert all(version == 7 for _, version in got)


def test_worker_exception_names_role_rank_and_original_traceback(pool):
    group = WorkerGroup("critic", Toy, pool=pool)
    with pytest.raises(WorkerError) as err:
        group.call(Toy.fail_on_rank_one, make_batch(6))
    message = str(err.value)
    assert "critic worker rank 1 (pid" in message and "fail_on_rank_one" in message
    assert "ValueError: bad shard of 3 rows" in message and "raise ValueError" in message
    assert err.value.rank == 1 and isinstance(err.value.original, ValueError)


def test_a_dead_worker_stops_the_call_in_seconds_while_its_peer_waits_in_a_collective():
    pool = RayPool(2, name="doomed", cpus_per_rank=1, start_timeout_s=60)
    try:
        group = WorkerGroup("actor", Toy, pool=pool)
        began = time.monotonic()
        with pytest.raises(WorkerError) as err:
            group.call(Toy.die_on_rank_one)
        assert time.monotonic() - began < 30
        message = str(err.value)
        assert "actor worker rank 1" in message and "WorkerDied" in message and "process ended" in message
    finally:
        pool.close()


def test_a_call_past_its_timeout_is_an_error_not_a_hang(pool):
    group = WorkerGroup("slow", Toy, pool=pool, timeouts={Toy.sleep: 1.0})
    began = time.monotonic()
    timed_out = r"failed in `sleep`: CallTimeout: no answer from rank\(s\) \[0, 1\] within 1s"
    with pytest.raises(WorkerError, match=timed_out):
        group.call(Toy.sleep, 5.0)
    assert time.monotonic() - began < 4


def test_too_few_resources_is_a_clear_error():
    with pytest.raises(ClusterError, match=r"asked Ray for 8 x \{'CPU': 1\.0\}.*cluster has \{CPU: 4"):
        RayPool(8, name="greedy", cpus_per_rank=1.0, start_timeout_s=1)


def test_local_pool_has_the_same_interface():
    pool = LocalPool(2)
    group = WorkerGroup("echo", Toy, pool=pool)
    assert group.call(Toy.echo, [1, 2, 3, 4]) == [1, 2]
    pool.close()
