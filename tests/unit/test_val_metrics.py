"""pass@k, maj@k, mean@k, std@k against hand-computed values."""

import math

import pytest

from grpoflow.controller.val_metrics import extract_answer, group_metrics, majority_score, pass_at_k


def test_pass_at_k_hand_values():
    # n=4, c=1: pass@1 = 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0   # n - c < k: always a hit
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_at_k_matches_brute_force_over_subsets():
    from itertools import combinations

    correct = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        subsets = list(combinations(correct, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(6, 2, k) == pytest.approx(brute)


def test_majority_vote():
    # "7" appears twice, "8" once: the vote picks "7", whose score is 0
    assert majority_score(["7", "8", "7"], [0.0, 1.0, 0.0]) == 0.0
    # a tie goes to the answer seen first
    assert majority_score(["8", "7"], [1.0, 0.0]) == 1.0


def test_group_metrics_hand_values():
    scores = [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]]
    answers = [["5", "6", "5", "5"], ["2", "2", "3", "4"]]
    m = group_metrics(scores, answers)
    # mean@4 = (3/4 + 1/4) / 2 = 0.5
    assert m["mean@4"] == pytest.approx(0.5)
    # std@4: population std of [1,0,1,1] = sqrt(3/16) = 0.4330; of [0,0,0,1] the same -> 0.4330
    assert m["std@4"] == pytest.approx(math.sqrt(3 / 16))
    # pass@1 = mean of c/n = 0.5; pass@4 = 1 for both prompts (each has a correct sample)
    assert m["pass@1"] == pytest.approx(0.5) and m["pass@4"] == pytest.approx(1.0)
    # maj@4: prompt 1 votes "5" (score 1), prompt 2 votes "2" (score 0) -> 0.5
    assert m["maj@4"] == pytest.approx(0.5)
    assert set(group_metrics([[1.0], [0.0]], [["a"], ["b"]])) == {"mean@1"}


def test_extract_answer():
    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("5 + 3 = 8\n#### 8") == "8"
    assert extract_answer(" 85 ") == "85"


def test_conversation_means_by_hand():
    from grpoflow.controller.held_out import conversation_means

    assert conversation_means([(2, 1), (1, 0), (3, 2)]) == [("turns", 2.0), ("tool_calls", 1.0)]
    assert conversation_means([]) == []
