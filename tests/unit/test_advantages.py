import math

import pytest
import torch

from grpoflow.algorithms import group_mean_std, grpo_advantage


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
