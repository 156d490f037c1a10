"""grpoflow.distributed.worker_group: one dispatch rule (split by DP rank, gather from replica leaders)."""

import pytest
import torch

from grpoflow.data.batch import Batch
from grpoflow.distributed.host import LocalPool
from grpoflow.distributed.worker_group import WorkerError, WorkerGroup, broadcast


def make_batch(n: int) -> Batch:
    """n rows; row i has a prompt of 1 + i % 3 tokens and a response of 1 + i % 4 tokens."""
    P, R = 3, 4
    prompt_mask = torch.zeros(n, P, dtype=torch.long)
    response_mask = torch.zeros(n, R, dtype=torch.long)
    for i in range(n):
        prompt_mask[i, P - 1 - i % 3:] = 1
        response_mask[i, : 1 + i % 4] = 1
    return Batch(
        prompt_ids=(torch.arange(n * P).view(n, P) + 1) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=(torch.arange(n * R).view(n, R) + 1) * response_mask,
        response_mask=response_mask,
        group_ids=torch.arange(n) // 2,
        scores=torch.arange(n, dtype=torch.float32),
        prompts=[f"p{i}" for i in range(n)],
    )


def workers(group: WorkerGroup) -> list:
    """The role objects of a local group, in rank order."""
    return [host.roles[group.role] for host in group.pool.hosts]


class Toy:
    """A worker whose verbs record what they were given."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.seen: list = []

    def double_scores(self, batch: Batch, factor: float = 2.0) -> Batch:
        """Row-wise: the result for a row depends on that row only."""
        self.seen.append(batch)
        return batch.replace(scores=batch.scores * factor, advantages=batch.response_mask * factor)

    def stamp_rank(self, batch: Batch) -> Batch:
        self.seen.append(batch)
        return batch.replace(scores=torch.full((len(batch),), float(self.rank)))

    def stats(self, batch: Batch, extra: object = None, *, tag: object = None) -> dict:
        self.seen.append((batch, extra, tag))
        return {"rank": self.rank, "rows": len(batch)}

    def take_list(self, items: list, extra: object) -> dict:
        self.seen.append((items, extra))
        return {"rank": self.rank, "items": list(items)}

    def no_args(self) -> int:
        return 100 + self.rank

    def row_values(self, batch: Batch) -> torch.Tensor:
        return self.rank * 10.0 + torch.arange(len(batch), dtype=torch.float32)

    def rank_tensor(self) -> torch.Tensor:
        return torch.tensor([float(self.rank)])

    def stream(self):
        yield from (self.rank, self.rank + 1)  # a generator: consumed inside the rank's process

    def consume(self, items, version: int, tag: str = "") -> None:
        self.seen.append((list(items), version, tag))

    def _private(self) -> None:
        pass

    def fail_on_rank_one(self, batch: Batch) -> Batch:
        if self.rank == 1:
            raise ValueError(f"bad shard of {len(batch)} rows")
        return batch


class Other:
    def double_scores(self, batch: Batch) -> Batch:
        return batch


def assert_batches_equal(a: Batch, b: Batch) -> None:
    for name in a.__dataclass_fields__:
        va, vb = getattr(a, name), getattr(b, name)
        if isinstance(va, torch.Tensor):
            assert isinstance(vb, torch.Tensor) and torch.equal(va, vb), name
        else:
            assert va == vb, name


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_batch_is_split_into_contiguous_shards_and_gathered_in_order(world_size):
    group = WorkerGroup("actor", Toy, world_size=world_size)
    batch = make_batch(11)
    out = group.call(Toy.double_scores, batch, factor=3.0)
    # the same as calling the row-wise verb on the whole batch (as the ranks get it: without its texts)
    assert_batches_equal(out, Toy(0, 1).double_scores(batch.tensors(), factor=3.0))
    shards = [h.seen[-1] for h in workers(group)]
    sizes = [len(s) for s in shards]
    assert sum(sizes) == 11 and max(sizes) - min(sizes) <= 1
    # contiguous and in rank order
    assert torch.equal(torch.cat([s.prompt_ids for s in shards]), batch.prompt_ids)
    start = 0
    for s in shards:
        assert s.scores.tolist() == list(range(start, start + len(s)))
        start += len(s)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_list_argument_is_split_and_other_args_broadcast(world_size):
    group = WorkerGroup("reward", Toy, world_size=world_size)
    items = list(range(10))
    extra = object()
    out = group.call(Toy.take_list, items, extra)
    received = [h.seen[-1] for h in workers(group)]
    assert [x for got, _ in received for x in got] == items
    assert max(len(g) for g, _ in received) - min(len(g) for g, _ in received) <= 1
    assert all(e is extra for _, e in received)  # broadcast unchanged, not copied
    # a non-Batch result comes from rank 0
    assert out == {"rank": 0, "items": received[0][0]}


def test_a_broadcast_list_reaches_every_rank_whole():
    group = WorkerGroup("rollout", Toy, world_size=3)
    items = list(range(5))
    group.call(Toy.take_list, broadcast(items), None)
    assert all(h.seen[-1][0] == items for h in workers(group))


def test_non_first_positional_and_keyword_args_go_to_every_rank():
    group = WorkerGroup("actor", Toy, world_size=4)
    extra, tag = {"lr": 0.1}, object()
    out = group.call(Toy.stats, make_batch(8), extra, tag=tag)
    for h in workers(group):
        _, e, t = h.seen[-1]
        assert e is extra and t is tag
    assert out == {"rank": 0, "rows": 2}


def test_verb_without_arguments_runs_on_every_rank_and_returns_rank_zero():
    group = WorkerGroup("rollout", Toy, world_size=4)
    assert group.call(Toy.no_args) == 100


def test_ranks_are_constructed_with_rank_and_world_size():
    group = WorkerGroup("actor", Toy, world_size=4)
    assert [(h.rank, h.world_size) for h in workers(group)] == [(0, 4), (1, 4), (2, 4), (3, 4)]


def with_texts(batch: Batch) -> Batch:
    """`batch` with every text and row field set, as a scored rollout batch has them."""
    n = len(batch)
    return batch.replace(completions=[f"c{i}" for i in range(n)], rows=[{"answer": str(i)} for i in range(n)],
                         conversations=[[{"role": "user", "content": "hi"}]] * n, infos=[object()] * n,
                         reward_parts=[{"score": 1.0}] * n)


def test_a_batch_argument_reaches_the_ranks_without_texts_and_rows():
    """The group strips texts and dataset rows from every Batch argument (split, broadcast or keyword), so no call
    site can forget to and send every row to every rank; the tensors arrive whole."""
    group = WorkerGroup("actor", Toy, world_size=2)
    batch = with_texts(make_batch(6))
    texts = ("prompts", "completions", "rows", "conversations", "infos", "reward_parts")
    assert all(getattr(batch, name) for name in texts)
    group.call(Toy.stamp_rank, batch)
    shards = [h.seen[-1] for h in workers(group)]
    assert all(getattr(s, name) == [] for s in shards for name in texts)
    assert torch.equal(torch.cat([s.response_ids for s in shards]), batch.response_ids)
    group.call(Toy.stats, broadcast(batch), batch, tag=batch)
    for h in workers(group):
        whole, extra, tag = h.seen[-1]
        for b in (whole, extra, tag):
            assert len(b) == 6 and all(getattr(b, name) == [] for name in texts)
    assert batch.prompts and batch.rows  # the controller's batch keeps them


def test_worker_exception_becomes_worker_error_naming_role_rank_and_cause():
    group = WorkerGroup("critic", Toy, world_size=2)
    with pytest.raises(WorkerError) as err:
        group.call(Toy.fail_on_rank_one, make_batch(6))
    e = err.value
    message = str(e)
    assert "critic" in message
    assert "rank 1" in message
    assert "fail_on_rank_one" in message
    assert "ValueError: bad shard of 3 rows" in message
    assert "Traceback" in message and "raise ValueError" in message  # the original traceback
    assert e.role == "critic" and e.rank == 1
    assert isinstance(e.original, ValueError) and str(e.original) == "bad shard of 3 rows"


def test_constructor_exception_is_reported_the_same_way():
    def factory(rank: int, world_size: int) -> Toy:
        if rank == 2:
            raise RuntimeError("out of memory on purpose")
        return Toy(rank, world_size)

    with pytest.raises(WorkerError) as err:
        WorkerGroup("reference", factory, world_size=4)
    e = err.value
    message = str(e)
    assert "reference" in message and "rank 2" in message and "__init__" in message
    assert "RuntimeError: out of memory on purpose" in message
    assert "Traceback" in message
    assert e.rank == 2 and isinstance(e.original, RuntimeError)


def test_a_verb_is_a_method_of_the_worker_class_checked_in_the_controller():
    group = WorkerGroup("actor", Toy, world_size=2)
    with pytest.raises(TypeError, match="not a public method of Toy"):
        group.call(Other.double_scores, make_batch(2))   # same name, another class
    with pytest.raises(TypeError, match="not a public method of Toy"):
        group.call(Toy._private)
    with pytest.raises(AttributeError):
        _ = group.double_scores  # no verbs by attribute name: every call names its method
    assert all(not h.seen for h in workers(group))  # nothing reached a rank


def test_tensor_results_are_concatenated_in_rank_order():
    group = WorkerGroup("actor", Toy, world_size=3)
    out = group.call(Toy.row_values, make_batch(7))
    # each rank returns rank * 10 + row index within its shard (3, 2, 2 rows)
    assert out.tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 20.0, 21.0]
    # a call that was not split returns rank 0's tensor, whatever the other ranks hold
    assert group.call(Toy.rank_tensor).tolist() == [0.0]


def test_transfer_needs_colocated_groups_and_pipes_within_each_rank():
    pool = LocalPool(2)
    src, dst = WorkerGroup("src", Toy, pool=pool), WorkerGroup("dst", Toy, pool=pool)
    src.transfer(Toy.stream, dst, Toy.consume, 5, tag="t")
    assert [h.roles["dst"].seen[-1] for h in pool.hosts] == [([0, 1], 5, "t"), ([1, 2], 5, "t")]
    elsewhere = WorkerGroup("dst2", Toy, world_size=2)
    with pytest.raises(ValueError, match="not colocated"):
        src.transfer(Toy.stream, elsewhere, Toy.consume, 5)
