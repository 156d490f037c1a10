"""EpochSampler: deterministic, reshuffles per epoch, resumes exactly from its state."""

import pytest

from grpoflow.data.sampler import EpochSampler


def test_same_seed_same_indices_and_epochs_cover_everything():
    a, b = EpochSampler(10, seed=5), EpochSampler(10, seed=5)
    first = a.next_indices(10)
    assert first == b.next_indices(10)
    assert sorted(first) == list(range(10))
    assert a.epoch == 1
    second = a.next_indices(10)
    assert sorted(second) == list(range(10))
    assert first != second  # a new permutation each epoch
    assert EpochSampler(10, seed=6).next_indices(10) != first


def test_batches_straddle_epoch_boundary():
    s = EpochSampler(7, seed=0)
    ref = EpochSampler(7, seed=0)
    stream = ref.next_indices(7) + ref.next_indices(7) + ref.next_indices(7)
    got = s.next_indices(3) + s.next_indices(5) + s.next_indices(13)
    assert got == stream
    assert s.epoch == 3


def test_state_round_trip_continues_identically():
    s = EpochSampler(9, seed=11)
    s.next_indices(13)  # one full epoch and 4 into the second
    state = s.state_dict()
    assert state == {"epoch": 1, "position": 4}
    expected = s.next_indices(20)
    restored = EpochSampler(9, seed=11)
    restored.load_state_dict(state)
    assert restored.epoch == 1
    assert restored.next_indices(20) == expected


def test_errors():
    with pytest.raises(ValueError, match="num_items=0"):
        EpochSampler(0, seed=0)
    with pytest.raises(ValueError, match="changed size"):
        EpochSampler(3, seed=0).load_state_dict({"epoch": 0, "position": 5})
