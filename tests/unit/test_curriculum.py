"""CurriculumSampler: pools by recent pass rate, shares, retirement, exact resume (grpoflow/data/curriculum.py)."""

import torch

from grpoflow.controller.curriculum import group_feedback
from grpoflow.data.curriculum import CurriculumSampler, split_counts
from grpoflow.data.dataset import PromptItem


def test_split_counts_hand_values():
    assert split_counts(10, [0.1, 0.8, 0.1], [5, 20, 5]) == [1, 8, 1]
    assert split_counts(10, [0.1, 0.8, 0.1], [5, 20, 0]) == [1, 9, 0]   # hard's 1 goes to learnable
    assert split_counts(10, [0.1, 0.8, 0.1], [5, 3, 5]) == [5, 3, 2]    # learnable short: 5 more from easy, then hard
    # 7 x (0.25, 0.5, 0.25) = 1.75, 3.5, 1.75 -> floors 1, 3, 1 + the 2 largest remainders (easy, hard): 2, 3, 2
    assert split_counts(7, [0.25, 0.5, 0.25], [9, 9, 9]) == [2, 3, 2]


def test_pools_follow_the_recent_pass_rate_and_solved_prompts_retire():
    s = CurriculumSampler(6, seed=0, window=2, easy_above=0.8, hard_below=0.2, retire_after=2)
    s.observe([0, 1, 2, 3], [1.0, 0.0, 0.5, 1.0])
    assert s.pools() == {"easy": [0, 3], "learnable": [2, 4, 5], "hard": [1]}
    s.observe([0, 1, 3], [1.0, 0.5, 0.75])  # 0: solved twice in a row -> retired; 1: (0 + 0.5) / 2 -> learnable
    assert s.retired == {0}
    assert s.pools() == {"easy": [3], "learnable": [1, 2, 4, 5], "hard": []}  # 3: (1 + 0.75) / 2 = 0.875
    s.observe([1, 1], [0.0, 0.0])  # the window keeps the last 2 only: 1 becomes hard
    assert s.pool_of(1) == "hard"
    assert s.metrics() == {"curriculum/easy": 1.0, "curriculum/learnable": 3.0, "curriculum/hard": 1.0,
                           "curriculum/retired": 1.0}


def test_draws_take_pool_shares_distinct_and_never_retired():
    s = CurriculumSampler(40, seed=1, shares=[0.25, 0.5, 0.25], retire_after=1)
    s.observe(list(range(10)), [1.0] * 10)    # 0-9 retired
    s.observe(list(range(10, 20)), [0.9] * 10)  # easy
    s.observe(list(range(20, 30)), [0.0] * 10)  # hard; 30-39 unseen: learnable
    drawn = s.next_indices(8)
    assert len(set(drawn)) == 8 and not set(drawn) & set(range(10))
    assert [sum(lo <= i < lo + 10 for i in drawn) for lo in (10, 30, 20)] == [2, 4, 2]


def test_resume_from_state_equals_uninterrupted():
    def feed(s, step):  # deterministic fake outcomes of a step
        idx = s.next_indices(5)
        s.observe(idx, [((i * 7 + step) % 5) / 4 for i in idx])
        return idx

    full = CurriculumSampler(30, seed=3, retire_after=2)
    stream = [feed(full, t) for t in range(12)]
    first = CurriculumSampler(30, seed=3, retire_after=2)
    head = [feed(first, t) for t in range(5)]
    resumed = CurriculumSampler(30, seed=3, retire_after=2)
    resumed.load_state_dict(torch.load(_saved(first.state_dict()), weights_only=False))
    assert head + [feed(resumed, t) for t in range(5, 12)] == stream


def _saved(state):
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_group_feedback_pass_rates_and_zero_advantage_share():
    s = CurriculumSampler(3, seed=0)
    items = [PromptItem([1], "a", {}, "d", index=i) for i in (2, 0)]
    # item 2: scores 1, 1 (all solved, zero advantage); item 0: 1, 0 (pass rate 0.5, signal)
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0])
    out = group_feedback(s, items, scores, scores, 2, 1.0)
    assert out["groups/zero_advantage_share"] == 0.5
    assert list(s.history[2]) == [1.0] and list(s.history[0]) == [0.5]
