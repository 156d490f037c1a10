"""CurriculumSampler: pools by recent pass rate, shares, retirement, exact resume (grpoflow/data/curriculum.py)."""

import pytest
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
    out = group_feedback(s, items, scores, scores, torch.tensor([0, 0, 1, 1]), 1.0)
    assert out["groups/zero_advantage_share"] == 0.5
    assert list(s.history[2]) == [1.0] and list(s.history[0]) == [0.5]


def test_group_feedback_on_agent_groups_of_any_size():
    """Issue 36: in agent runs a prompt's episodes give any number of samples (several, one, none), so groups are
    not n samples; each prompt's pass rate comes from its own samples, found by group id (it used to observe
    nothing: a curriculum in an agent run learned nothing)."""
    s = CurriculumSampler(5, seed=0, easy_above=0.8, hard_below=0.2)
    items = [PromptItem([1], "a", {}, "d", index=i) for i in (4, 1, 3, 0)]
    # item 4 (group 0): 3 samples, 2 solved; item 1 (group 1): 1 sample, solved; item 3 (group 2): no sample at all;
    # item 0 (group 3): 2 samples, none solved. Interleaved, as an agent's samples may come back.
    group_ids = torch.tensor([0, 1, 3, 0, 0, 3])
    raw = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    out = group_feedback(s, items, raw, raw, group_ids, 1.0)
    assert list(s.history[4]) == [pytest.approx(2 / 3)] and list(s.history[1]) == [1.0] and list(s.history[0]) == [0.0]
    assert 3 not in s.history  # no sample: nothing observed
    assert s.pools() == {"easy": [1], "learnable": [2, 3, 4], "hard": [0]}
    # groups 1 (a single sample) and 3 (all 0) carry no signal; group 0 does: 2 of the 3 present groups are flat
    assert out["groups/zero_advantage_share"] == pytest.approx(2 / 3)
    assert out["curriculum/easy"] == 1.0 and out["curriculum/hard"] == 1.0


def test_group_feedback_counts_an_agent_episode_once():
    """An agent episode whose context was reset gives several samples, all with the episode's reward; its pass
    rate counts episodes (the sample marked final), not samples."""
    s = CurriculumSampler(2, seed=0)
    items = [PromptItem([1], "a", {}, "d", index=i) for i in (0, 1)]
    # prompt 0: episode A (3 samples, solved) and episode B (1 sample, failed) -> 1 of 2 episodes: 0.5, not 0.75
    group_ids = torch.tensor([0, 0, 0, 0, 1])
    raw = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    group_feedback(s, items, raw, raw, group_ids, 1.0, final=[False, False, True, True, True])
    assert list(s.history[0]) == [0.5] and list(s.history[1]) == [1.0]
