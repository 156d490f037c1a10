import math

import pytest
import torch

from grpoflow.algorithms import (
    ADVANTAGE_ESTIMATORS,
    group_mean_std,
    grpo_advantage,
    grpo_passk_advantage,
    reinforce_plus_plus_baseline_advantage,
    remax_advantage,
    rloo_advantage,
    whiten,
)


def _random_groups(seed, size=120):
    """Random scores with ties, on sparse non-contiguous group ids, plus one singleton group."""
    gen = torch.Generator().manual_seed(seed)
    ids_pool = torch.tensor([0, 3, 17, 100, 4242, 99999])
    group_ids = ids_pool[torch.randint(0, len(ids_pool), (size,), generator=gen)]
    group_ids[0] = 12345
    scores = torch.randint(0, 4, (size,), generator=gen).float() / 2  # 0, 0.5, 1, 1.5: ties
    return scores, group_ids


def test_group_mean_std_hand_computed():
    # group 7: scores 1, 2, 3 -> mean 2, unbiased var ((1-2)^2 + 0 + (3-2)^2) / (3-1) = 1, std 1
    # group 2: single score 5  -> mean 5, std 0 by convention, count 1
    # group 9: scores 4, 6     -> mean 5, unbiased var (1 + 1) / (2-1) = 2, std sqrt(2)
    scores = torch.tensor([1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
    group_ids = torch.tensor([7, 9, 7, 2, 7, 9])
    mean, std, count = group_mean_std(scores, group_ids)
    torch.testing.assert_close(mean, torch.tensor([2.0, 5.0, 2.0, 5.0, 2.0, 5.0]))
    r2 = math.sqrt(2.0)
    torch.testing.assert_close(std, torch.tensor([1.0, r2, 1.0, 0.0, 1.0, r2]))
    assert count.tolist() == [3, 2, 3, 1, 3, 2]
    assert count.dtype == torch.int64 and mean.dtype == std.dtype == torch.float32


def test_group_mean_std_matches_python_loop():
    gen = torch.Generator().manual_seed(0)
    ids_pool = torch.tensor([0, 3, 17, 100, 4242, 99999])  # sparse, non-contiguous ids
    group_ids = ids_pool[torch.randint(0, len(ids_pool), (200,), generator=gen)]
    group_ids[0] = 12345  # guarantee one singleton group
    scores = torch.randn(200, generator=gen)

    mean, std, count = group_mean_std(scores, group_ids)

    for i in range(len(scores)):
        members = scores[group_ids == group_ids[i]]
        assert count[i] == len(members)
        torch.testing.assert_close(mean[i], members.mean())
        expected_std = members.std(unbiased=True) if len(members) > 1 else torch.tensor(0.0)
        torch.testing.assert_close(std[i], expected_std)
    assert std[0] == 0.0 and count[0] == 1


def test_group_mean_std_rejects_bad_shapes():
    with pytest.raises(ValueError, match="same length"):
        group_mean_std(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        group_mean_std(torch.zeros(3), torch.zeros(3))


def test_grpo_advantage_hand_computed():
    # group 0: scores 1, 0, 0, 1 -> mean 0.5; unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735
    #          A = +-0.5 / 0.57735 = +-0.866025 (epsilon 1e-6 changes the 6th digit only)
    # group 5: scores 0, 0, 3     -> mean 1; var (1 + 1 + 4) / 2 = 3, std 1.73205
    #          A = (-1, -1, 2) / 1.73205 = (-0.57735, -0.57735, 1.15470)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 3.0])
    group_ids = torch.tensor([0, 0, 0, 0, 5, 5, 5])
    mask = torch.ones(7, 3)
    mask[0, 2] = 0.0  # padding token: advantage 0 there
    adv = grpo_advantage(scores, mask, group_ids)
    s = 1 / math.sqrt(3)
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, -s, -s, 2 * s])
    torch.testing.assert_close(adv[:, 0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(adv[:, 1], expected, atol=1e-5, rtol=1e-5)
    assert adv[0, 2] == 0.0
    assert adv.shape == (7, 3) and adv.dtype == torch.float32


def test_grpo_advantage_epsilon_is_added_to_std():
    # scores 1, 2, 3: mean 2, std 1; A = (r - 2) / (1 + 0.5) = (-2/3, 0, 2/3)
    # (adding epsilon to the variance instead would give (r - 2) / sqrt(1.5) = +-0.8165)
    adv = grpo_advantage(torch.tensor([1.0, 2.0, 3.0]), torch.ones(3, 1),
                         torch.tensor([4, 4, 4]), epsilon=0.5)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-2 / 3, 0.0, 2 / 3]))


def test_dr_grpo_no_std_normalisation():
    # scores 0, 0, 3: mean 1 -> A = r - 1 = (-1, -1, 2), no division by std (1.732)
    adv = grpo_advantage(torch.tensor([0.0, 0.0, 3.0]), torch.ones(3, 2),
                         torch.tensor([1, 1, 1]), norm_adv_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [2.0, 2.0]]))


@pytest.mark.parametrize("norm_adv_by_std", [True, False])
def test_singleton_group_gets_zero_advantage(norm_adv_by_std):
    # sample 2 is alone in group 8: no baseline, so A = 0 (not r - r = 0 by luck: r is 5 and
    # the other group's mean is 0.5, so a wrong baseline would show up)
    scores = torch.tensor([0.0, 1.0, 5.0])
    adv = grpo_advantage(scores, torch.ones(3, 2), torch.tensor([3, 3, 8]),
                         norm_adv_by_std=norm_adv_by_std)
    assert torch.all(adv[2] == 0.0)
    assert torch.all(adv[:2] != 0.0)


@pytest.mark.parametrize("norm_adv_by_std", [True, False])
def test_all_equal_group_gets_exactly_zero(norm_adv_by_std):
    # 0.1 is not exact in float32; sum / count may differ from 0.1 by an ulp, which 1/eps
    # would amplify. The advantage must still be exactly 0.
    scores = torch.tensor([0.1] * 7 + [0.3, 0.7])
    group_ids = torch.tensor([2] * 7 + [6, 6])
    adv = grpo_advantage(scores, torch.ones(9, 4), group_ids, norm_adv_by_std=norm_adv_by_std)
    assert torch.all(adv[:7] == 0.0)
    assert torch.all(adv[7:] != 0.0)


def test_grpo_output_is_float32_for_other_dtypes():
    scores = torch.tensor([1.0, 0.0], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = grpo_advantage(scores, mask, torch.tensor([0, 0]))
    assert adv.dtype == torch.float32
    # mean 0.5, std sqrt(0.5) = 0.7071 -> A = +-0.5 / 0.7071 = +-0.7071
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.707106, -0.707106]), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- whiten


def test_whiten_hand_computed():
    # valid values 1, 2, 3 (the 9 is padding): mean 2, unbiased var (1 + 0 + 1) / 2 = 1, std 1
    # epsilon 0.5: (x - 2) / 1.5 = (-2/3, 0, 2/3); padding -> 0
    values = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = whiten(values, mask, epsilon=0.5)
    torch.testing.assert_close(out, torch.tensor([[-2 / 3, 0.0], [2 / 3, 0.0]]))
    # default epsilon 1e-8: (-1, 0, 1)
    torch.testing.assert_close(whiten(values, mask), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))


def test_whiten_all_equal_or_single_value_is_exactly_zero():
    # 0.1 is not exact in float32: the mean may be off by an ulp, which 1/eps would amplify
    values = torch.full((3, 5), 0.1)
    values[2, 4] = 7.0  # padding only
    mask = torch.ones(3, 5)
    mask[2, 4] = 0.0
    assert torch.all(whiten(values, mask) == 0.0)
    assert torch.all(whiten(torch.tensor([[4.0, 1.0]]), torch.tensor([[1.0, 0.0]])) == 0.0)
    assert torch.all(whiten(torch.ones(2, 2), torch.zeros(2, 2)) == 0.0)


# ---------------------------------------------------------------- rloo


def test_rloo_hand_computed():
    # group 0: scores 1, 0, 0, 1 -> A_i = r_i - mean of the other three
    #          1 - (0 + 0 + 1)/3 = 2/3;  0 - (1 + 0 + 1)/3 = -2/3
    #          (= n/(n-1) * (r - mean) = 4/3 * +-0.5)
    # group 5: scores 0, 0, 3 -> 0 - (0 + 3)/2 = -1.5; 3 - (0 + 0)/2 = 3
    # group 9: singleton      -> 0
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 3.0, 4.0])
    group_ids = torch.tensor([0, 0, 0, 0, 5, 5, 5, 9])
    mask = torch.ones(8, 2)
    mask[0, 1] = 0.0
    adv = rloo_advantage(scores, mask, group_ids)
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -1.5, -1.5, 3.0, 0.0])
    torch.testing.assert_close(adv[:, 0], expected)
    torch.testing.assert_close(adv[1:, 1], expected[1:])
    assert adv[0, 1] == 0.0 and adv.dtype == torch.float32


def test_rloo_matches_leave_one_out_loop():
    scores, group_ids = _random_groups(seed=1)
    adv = rloo_advantage(scores, torch.ones(len(scores), 1), group_ids)[:, 0]
    for i in range(len(scores)):
        others = [scores[j] for j in range(len(scores)) if j != i and group_ids[j] == group_ids[i]]
        expected = scores[i] - torch.stack(others).mean() if others else torch.tensor(0.0)
        torch.testing.assert_close(adv[i], expected)
    assert adv[0] == 0.0


# ---------------------------------------------------------------- remax


def test_remax_hand_computed():
    # A = score - greedy baseline: 1 - 0.5 = 0.5, 0 - 0.5 = -0.5, 0.5 - 0.5 = 0; not whitened
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    adv = remax_advantage(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, 0.5, 0.5]), mask)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0]]))


def test_remax_rejects_misshapen_baselines():
    with pytest.raises(ValueError, match="baselines"):
        remax_advantage(torch.zeros(3), torch.zeros(2), torch.ones(3, 1))


# ---------------------------------------------------------------- reinforce++ baseline


def test_reinforce_plus_plus_baseline_hand_computed():
    # group 4: 1, 0    -> r - 0.5 = 0.5, -0.5
    # group 1: 2, 2, 5 -> r - 3   = -1, -1, 2
    # group 9: 7 alone -> 0
    # tokens (sample 4 has two): 0.5, -0.5, -1, -1, 2, 2, 0 -> sum 2, n 7, mean 2/7 = 0.285714
    # sum of squares 10.5 - 7 * 0.285714^2 = 9.928571; unbiased var / 6 = 1.654762, std 1.286375
    # whitened (x - 0.285714) / 1.286375:
    #   0.5 -> 0.166581, -0.5 -> -0.610796, -1 -> -0.999486, 2 -> 1.332650, 0 -> -0.222108
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0, 5.0, 7.0])
    group_ids = torch.tensor([4, 4, 1, 1, 1, 9])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    adv = reinforce_plus_plus_baseline_advantage(scores, mask, group_ids)
    expected = torch.tensor([[0.166581, 0.0], [-0.610796, 0.0], [-0.999486, 0.0],
                             [-0.999486, 0.0], [1.332650, 1.332650], [-0.222108, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- pass@k GRPO


def test_grpo_passk_hand_computed():
    # group 3 (samples 0, 2, 4): scores 0, 1, 0.5 -> best sample 2, second best 0.5, margin 0.5
    #          mean 0.5, unbiased var (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5 -> A = 0.5 / 0.5 = 1
    # group 8 (samples 1, 3, 5): scores 1, 1, 0 -> tie: best is sample 1 (first), second 1
    #          -> margin 0, every A = 0
    # group 2 (sample 6): singleton -> 0
    scores = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 2.0])
    group_ids = torch.tensor([3, 8, 3, 8, 3, 8, 2])
    mask = torch.ones(7, 2)
    mask[2, 1] = 0.0
    adv = grpo_passk_advantage(scores, mask, group_ids)
    expected = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv[:, 0], expected, atol=1e-5, rtol=0)
    assert adv[2, 1] == 0.0
    # without the std: A = margin = 0.5
    raw = grpo_passk_advantage(scores, mask, group_ids, norm_adv_by_std=False)
    torch.testing.assert_close(raw[:, 0], expected * 0.5)


def test_grpo_passk_credits_the_first_argmax():
    # scores 0, 3, 1, 3 in one group: best is sample 1 (first of the two 3s), second best 3
    # -> margin 0. With 3 -> 2.5 at sample 3: best sample 1, second 2.5, margin 0.5, no std
    ids = torch.tensor([6, 6, 6, 6])
    tie = grpo_passk_advantage(torch.tensor([0.0, 3.0, 1.0, 3.0]), torch.ones(4, 1), ids,
                               norm_adv_by_std=False)
    assert torch.all(tie == 0.0)
    adv = grpo_passk_advantage(torch.tensor([0.0, 3.0, 1.0, 2.5]), torch.ones(4, 1), ids,
                               norm_adv_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, 0.5, 0.0, 0.0]))


@pytest.mark.parametrize("norm_adv_by_std", [True, False])
def test_grpo_passk_matches_per_group_loop(norm_adv_by_std):
    scores, group_ids = _random_groups(seed=2)
    scores = scores + torch.rand(len(scores), generator=torch.Generator().manual_seed(3)) * (
        torch.arange(len(scores)) % 3 == 0)  # break some ties, keep others
    adv = grpo_passk_advantage(scores, torch.ones(len(scores), 1), group_ids,
                               norm_adv_by_std=norm_adv_by_std, epsilon=1e-6)[:, 0]
    expected = torch.zeros_like(scores)
    for gid in group_ids.unique():
        members = (group_ids == gid).nonzero().flatten().tolist()
        if len(members) < 2:
            continue
        best = max(members, key=lambda j: (scores[j].item(), -j))  # first argmax
        second = max(scores[j].item() for j in members if j != best)
        margin = scores[best].item() - second
        if norm_adv_by_std:
            margin /= scores[members].std(unbiased=True).item() + 1e-6
        expected[best] = margin
    torch.testing.assert_close(adv, expected)
    assert (adv != 0).sum() > 3  # the check is not vacuous


# ---------------------------------------------------------------- registration


def test_outcome_estimators_are_registered_and_return_float32():
    scores = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    mask = torch.ones(3, 2, dtype=torch.bool)
    ids = torch.tensor([0, 0, 0])
    for name in ("rloo", "reinforce_plus_plus_baseline", "grpo_passk"):
        fn = ADVANTAGE_ESTIMATORS.get(name)
        out = fn(scores, mask, ids)
        assert out.shape == (3, 2) and out.dtype == torch.float32, name
        assert not ADVANTAGE_ESTIMATORS.meta(name).get("returns"), name
    assert ADVANTAGE_ESTIMATORS.get("remax") is remax_advantage
