import pytest
import torch

from grpoflow.algorithms import groups_with_signal, overlong_penalty


def test_overlong_penalty_hand_computed():
    # max_length 10, buffer 4: the ramp starts after 10 - 4 = 6 tokens
    # L = 5, 6 -> 0;  L = 7 -> (6 - 7) / 4 = -0.25;  L = 8 -> -0.5;  L = 10 -> (6 - 10) / 4 = -1
    # L = 11 (over the maximum) -> -1
    lengths = torch.tensor([5, 6, 7, 8, 10, 11])
    out = overlong_penalty(lengths, max_length=10, buffer=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    assert out.dtype == torch.float32
    # penalty_factor 2 scales every value: 0, 0, -0.5, -1, -2, -2
    scaled = overlong_penalty(lengths, max_length=10, buffer=4, penalty_factor=2.0)
    torch.testing.assert_close(scaled, torch.tensor([0.0, 0.0, -0.5, -1.0, -2.0, -2.0]))


@pytest.mark.parametrize("buffer", [0, 11, -1])
def test_overlong_penalty_rejects_bad_buffer(buffer):
    with pytest.raises(ValueError, match="0 < buffer <= max_length"):
        overlong_penalty(torch.tensor([3]), max_length=10, buffer=buffer)


def test_groups_with_signal_hand_computed():
    # group 4: 1, 1      -> all equal, no signal
    # group 9: 0, 1      -> signal
    # group 2: 0.5, 0.5  -> no signal
    # group 7: 3 alone   -> no signal (nothing to compare with)
    # group 5: 0, 0, 1   -> signal for all three
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.5, 3.0, 0.0, 0.0, 1.0])
    group_ids = torch.tensor([4, 9, 2, 4, 9, 2, 7, 5, 5, 5])
    keep = groups_with_signal(scores, group_ids)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, False, False, True, False, False, True, True, True]


def test_groups_with_signal_rejects_bad_shapes():
    with pytest.raises(ValueError, match="same length"):
        groups_with_signal(torch.zeros(3), torch.zeros(2, dtype=torch.long))
