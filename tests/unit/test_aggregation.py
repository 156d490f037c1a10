import pytest
import torch

from grpoflow.algorithms import LOSS_AGGREGATIONS, aggregate_loss, masked_mean

# Masked-out positions hold 9s: any leak into a sum changes the result.
VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0],
                       [5.0, 6.0, 9.0, 9.0],
                       [7.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0],
                     [1.0, 1.0, 0.0, 0.0],
                     [1.0, 0.0, 0.0, 0.0]])
# row sums 10, 11, 7 (total 28); lengths 4, 2, 1 (total 7); 3 rows


def test_token_mean():
    # 28 / 7 = 4
    torch.testing.assert_close(aggregate_loss(VALUES, MASK, "token-mean"), torch.tensor(4.0))


def test_seq_mean_token_mean():
    # (10/4 + 11/2 + 7/1) / 3 = (2.5 + 5.5 + 7) / 3 = 5
    torch.testing.assert_close(aggregate_loss(VALUES, MASK, "seq-mean-token-mean"),
                               torch.tensor(5.0))


def test_seq_mean_token_sum():
    # (10 + 11 + 7) / 3 rows = 28 / 3 = 9.333333: longer rows weigh more
    torch.testing.assert_close(aggregate_loss(VALUES, MASK, "seq-mean-token-sum"),
                               torch.tensor(28 / 3))


def test_seq_mean_token_sum_norm():
    # 28 / (3 rows * horizon 8) = 28 / 24 = 1.166667
    torch.testing.assert_close(
        aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm", horizon=8), torch.tensor(28 / 24))


def test_seq_mean_token_sum_norm_needs_horizon():
    with pytest.raises(ValueError, match="`horizon`"):
        aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm")


def test_explicit_global_denominators_are_used():
    # token-mean 28 / 14 = 2; seq-mean-token-mean 15 / 6 = 2.5; sum-norm 28 / (6 * 4) = 1.166667
    torch.testing.assert_close(aggregate_loss(VALUES, MASK, "token-mean", num_tokens=14),
                               torch.tensor(2.0))
    torch.testing.assert_close(aggregate_loss(VALUES, MASK, "seq-mean-token-mean", num_seqs=6),
                               torch.tensor(2.5))
    # seq-mean-token-sum 28 / 6 = 4.666667
    torch.testing.assert_close(aggregate_loss(VALUES, MASK, "seq-mean-token-sum", num_seqs=6),
                               torch.tensor(28 / 6))
    torch.testing.assert_close(
        aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm", num_seqs=torch.tensor(6.0),
                       horizon=4),
        torch.tensor(28 / 24))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("bounds", [[0, 2, 7], [0, 1, 4, 7], [0, 5, 6, 7]])
def test_micro_batch_split_sums_to_whole_batch(mode, bounds):
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(7, 6, generator=gen)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 4])  # includes an empty row
    mask = (torch.arange(6) < lengths[:, None]).float()
    num_tokens, num_seqs = mask.sum(), mask.shape[0]

    whole = aggregate_loss(values, mask, mode, horizon=6)
    parts = [
        aggregate_loss(values[a:b], mask[a:b], mode, num_tokens=num_tokens,
                       num_seqs=num_seqs, horizon=6)
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    torch.testing.assert_close(sum(parts), whole)

    # Sanity: local denominators would NOT sum to the whole (the test can fail).
    local = sum(aggregate_loss(values[a:b], mask[a:b], mode, horizon=6)
                for a, b in zip(bounds[:-1], bounds[1:]))
    assert not torch.allclose(local, whole)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_empty_mask_gives_zero_not_nan(mode):
    out = aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode, horizon=3)
    assert out == 0.0


def test_unknown_mode_names_closest():
    with pytest.raises(ValueError, match="loss aggregation mode 'token_mean'.*'token-mean'"):
        aggregate_loss(VALUES, MASK, "token_mean")


def test_user_registered_mode_receives_filled_denominators():
    @LOSS_AGGREGATIONS.register("test-token-count", override=True)
    def token_count(values, mask, num_tokens, num_seqs, horizon):
        return torch.as_tensor(num_tokens * 100 + num_seqs, dtype=torch.float32)

    # 7 tokens, 3 rows -> 703
    assert aggregate_loss(VALUES, MASK, "test-token-count") == 703.0


def test_masked_mean():
    # all: 28 / 7 = 4; per row: 10/4, 11/2, 7/1; empty mask -> 0
    torch.testing.assert_close(masked_mean(VALUES, MASK), torch.tensor(4.0))
    torch.testing.assert_close(masked_mean(VALUES, MASK, dim=-1), torch.tensor([2.5, 5.5, 7.0]))
    assert masked_mean(VALUES, torch.zeros_like(MASK)) == 0.0
