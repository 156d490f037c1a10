"""grpoflow.training.microbatch: token-budget micro-batches cover every row once and respect the budget."""

import random

import pytest
import torch

from grpoflow.data.batch import Batch
from grpoflow.training.microbatch import plan_microbatches, split_by_tokens


def padded_cost(plan, prompt_lengths, response_lengths) -> int:
    return len(plan) * (max(prompt_lengths[i] for i in plan) + max(response_lengths[i] for i in plan))


def random_lengths(n, seed, max_p=20, max_r=30):
    rng = random.Random(seed)
    return [rng.randint(1, max_p) for _ in range(n)], [rng.randint(1, max_r) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [40, 64, 200, 1000])
def test_plan_covers_every_index_once_within_budget(seed, budget):
    prompt_lengths, response_lengths = random_lengths(37, seed)
    plans = plan_microbatches(prompt_lengths, response_lengths, budget)
    flat = [i for plan in plans for i in plan]
    assert sorted(flat) == list(range(37))  # every index, exactly once
    assert all(plans), "no empty micro-batch"
    for plan in plans:
        if len(plan) > 1:
            assert padded_cost(plan, prompt_lengths, response_lengths) <= budget, plan


def test_equal_lengths_are_packed_greedily():
    # 10 rows of 3 + 5 = 8 tokens, budget 32: four rows per micro-batch
    plans = plan_microbatches([3] * 10, [5] * 10, 32)
    assert plans == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_budget_counts_max_prompt_plus_max_response_not_max_total():
    # both rows total 10 tokens, but padded together they cost 2 * (10 + 10) = 40 > 30
    assert plan_microbatches([10, 0], [0, 10], 30) in ([[0], [1]], [[1], [0]])
    assert plan_microbatches([10, 0], [0, 10], 40) in ([[0, 1]], [[1, 0]])


def test_row_longer_than_budget_gets_its_own_microbatch():
    prompt_lengths = [2, 2, 50, 2, 2]
    response_lengths = [3, 3, 60, 3, 3]
    plans = plan_microbatches(prompt_lengths, response_lengths, 20)
    assert [2] in plans
    assert sorted(i for plan in plans for i in plan) == [0, 1, 2, 3, 4]
    for plan in plans:
        if plan != [2]:
            assert 2 not in plan
            assert padded_cost(plan, prompt_lengths, response_lengths) <= 20


def test_several_oversized_rows_each_alone():
    plans = plan_microbatches([30, 1, 40, 1], [30, 1, 40, 1], 10)
    assert [0] in plans and [2] in plans
    assert sorted(i for plan in plans for i in plan) == [0, 1, 2, 3]


def test_plan_is_deterministic_and_a_pure_function_of_the_lengths():
    prompt_lengths, response_lengths = random_lengths(50, seed=7)
    first = plan_microbatches(prompt_lengths, response_lengths, 120)
    assert plan_microbatches(list(prompt_lengths), list(response_lengths), 120) == first
    # ties are broken by index, so equal-length rows keep their order
    assert plan_microbatches([4] * 6, [4] * 6, 16) == [[0, 1], [2, 3], [4, 5]]


def test_empty_input_gives_no_plans():
    assert plan_microbatches([], [], 100) == []


def _batch_from_lengths(prompt_lengths, response_lengths, width_p, width_r) -> Batch:
    b = len(prompt_lengths)
    prompt_ids = torch.zeros(b, width_p, dtype=torch.long)
    prompt_mask = torch.zeros(b, width_p, dtype=torch.long)
    response_ids = torch.zeros(b, width_r, dtype=torch.long)
    response_mask = torch.zeros(b, width_r, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        prompt_ids[i, width_p - p:] = torch.arange(1, p + 1) + 100 * i
        prompt_mask[i, width_p - p:] = 1
        response_ids[i, :r] = torch.arange(1, r + 1) + 100 * i + 50
        response_mask[i, :r] = 1
    return Batch(prompt_ids, prompt_mask, response_ids, response_mask, group_ids=torch.arange(b),
                 old_log_probs=torch.randn(b, width_r) * response_mask,
                 scores=torch.arange(b, dtype=torch.float32), prompts=[f"p{i}" for i in range(b)])


def test_split_by_tokens_returns_trimmed_batches_matching_the_plan():
    prompt_lengths, response_lengths = random_lengths(23, seed=3, max_p=12, max_r=16)
    batch = _batch_from_lengths(prompt_lengths, response_lengths, width_p=15, width_r=20)
    budget = 60
    micro, plans = split_by_tokens(batch, budget)
    assert plans == plan_microbatches(prompt_lengths, response_lengths, budget)
    assert len(micro) == len(plans)
    for mb, plan in zip(micro, plans):
        assert len(mb) == len(plan)
        # trimmed to the plan's own longest prompt / response
        assert mb.prompt_ids.shape[1] == max(prompt_lengths[i] for i in plan)
        assert mb.response_ids.shape[1] == max(response_lengths[i] for i in plan)
        assert mb.old_log_probs.shape == mb.response_ids.shape
        if len(plan) > 1:
            assert mb.input_ids.numel() <= budget
        # the rows are the plan's rows, in plan order, with their real tokens intact
        assert mb.prompts == [f"p{i}" for i in plan]
        assert mb.scores.tolist() == [float(i) for i in plan]
        for k, i in enumerate(plan):
            p, r = prompt_lengths[i], response_lengths[i]
            assert torch.equal(mb.prompt_ids[k, mb.prompt_ids.shape[1] - p:], batch.prompt_ids[i, -p:])
            assert torch.equal(mb.response_ids[k, :r], batch.response_ids[i, :r])
            assert torch.equal(mb.old_log_probs[k, :r], batch.old_log_probs[i, :r])
    # together the micro-batches hold every row once
    assert sorted(s for mb in micro for s in mb.scores.tolist()) == [float(i) for i in range(23)]


# --- the same micro-batch count on every rank (FSDP: each forward/backward is a collective) ---

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("extra", [1, 3, 10])
def test_min_count_cuts_costliest_groups_and_keeps_the_budget(seed, extra):
    prompt_lengths, response_lengths = random_lengths(30, seed)
    greedy = plan_microbatches(prompt_lengths, response_lengths, 150)
    plans = plan_microbatches(prompt_lengths, response_lengths, 150, min_count=len(greedy) + extra)
    assert len(plans) == min(len(greedy) + extra, 30)
    assert sorted(i for plan in plans for i in plan) == list(range(30))
    assert all(plans)
    order = sorted(range(30), key=lambda i: (prompt_lengths[i] + response_lengths[i], i))
    assert [i for plan in plans for i in plan] == order  # cut, never reshuffled: still length-sorted
    for plan in plans:
        if len(plan) > 1:
            assert padded_cost(plan, prompt_lengths, response_lengths) <= 150


def test_min_count_cuts_the_costliest_group_first():
    # greedy: [0, 1, 2, 3] (4 x 4 = 16 tokens) and [4, 5] (2 x 8 = 16); a tie goes to the earlier group
    lengths = [2, 2, 2, 2, 4, 4]
    assert plan_microbatches(lengths, lengths, 16) == [[0, 1, 2, 3], [4, 5]]
    assert plan_microbatches(lengths, lengths, 16, min_count=3) == [[0, 1], [2, 3], [4, 5]]
    assert plan_microbatches(lengths, lengths, 16, min_count=4) == [[0, 1], [2, 3], [4], [5]]
    # no more groups than rows; a smaller min_count changes nothing
    assert plan_microbatches(lengths, lengths, 16, min_count=9) == [[i] for i in range(6)]
    assert plan_microbatches(lengths, lengths, 16, min_count=1) == [[0, 1, 2, 3], [4, 5]]


def test_split_by_tokens_pads_to_the_count_agreed_over_ranks(monkeypatch):
    from grpoflow.training import microbatch
    from grpoflow.training.microbatch import PaddingBatch

    batch = _batch_from_lengths([3, 5, 2], [4, 1, 6], width_p=6, width_r=7)
    monkeypatch.setattr(microbatch, "global_max", lambda count: 5)  # another rank planned 5 micro-batches
    micro, plans = split_by_tokens(batch, 1000)
    assert len(micro) == len(plans) == 5
    assert sorted(i for plan in plans for i in plan) == [0, 1, 2]  # three rows, one per micro-batch
    assert [isinstance(mb, PaddingBatch) for mb in micro] == [False, False, False, True, True]
    assert plans[3:] == [[], []]
    padding = micro[3]
    assert len(padding) == 1 and padding.prompts == ["p0"]  # a real row, computed and thrown away
    assert torch.equal(padding.response_ids[0, :4], batch.response_ids[0, :4])


def test_an_empty_shard_still_gets_padding_micro_batches(monkeypatch):
    from grpoflow.training import microbatch
    from grpoflow.training.microbatch import PaddingBatch

    empty = _batch_from_lengths([3, 5], [4, 1], width_p=6, width_r=7).select([])
    monkeypatch.setattr(microbatch, "global_max", lambda count: 2)
    micro, plans = split_by_tokens(empty, 1000)
    assert plans == [[], []]
    for mb in micro:
        assert isinstance(mb, PaddingBatch) and len(mb) == 1
        # one attended prompt token (a fully masked row would give NaN attention) and one response token
        assert mb.prompt_mask.tolist() == [[1]] and mb.response_mask.tolist() == [[1]]
        assert mb.old_log_probs.tolist() == [[0.0]] and mb.group_ids.tolist() == [0]


def test_no_process_group_means_no_padding():
    batch = _batch_from_lengths([3, 5, 2], [4, 1, 6], width_p=6, width_r=7)
    micro, plans = split_by_tokens(batch, 1000)
    assert plans == plan_microbatches([3, 5, 2], [4, 1, 6], 1000) and len(micro) == 1
