"""grpoflow.engines.random_streams: per-row counter-based streams and inverse-CDF sampling."""

import torch

from grpoflow.engines.random_streams import hash32, prompt_seeds, row_seeds, sample_from, uniforms


def rows(seed, indices, n):
    return row_seeds(prompt_seeds(seed, torch.tensor(indices)), n)


def pcg_rxs_m_xs(x: int) -> int:
    """The same hash with Python's unbounded ints, written out step by step."""
    state = (x * 747796405 + 2891336453) % 2**32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) % 2**32
    return ((word >> 22) ^ word) % 2**32


def test_hash32_equals_the_reference_on_edge_and_random_values():
    values = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1] + torch.randint(0, 2**32, (200,)).tolist()
    got = hash32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [pcg_rxs_m_xs(v) for v in values]
    assert pcg_rxs_m_xs(0) == 129708002  # pinned: the streams must not change between versions


def test_a_prompts_rows_do_not_depend_on_the_batch_it_is_in():
    together = rows(42, [5, 9, 11], 4)
    alone = torch.cat([rows(42, [i], 4) for i in (5, 9, 11)])
    assert torch.equal(together, alone)
    assert len(set(together.tolist())) == 12  # distinct rows
    assert not torch.equal(rows(43, [5], 4), rows(42, [5], 4))


def test_uniforms_are_in_range_and_roughly_uniform():
    u = uniforms(row_seeds(prompt_seeds(0, torch.arange(25_000)), 4), position=3)
    assert u.min() >= 0 and u.max() < 1
    counts = torch.histc(u, bins=10, min=0, max=1)
    expected = len(u) / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30  # 9 degrees of freedom: p ~ 4e-4
    assert not torch.equal(u, uniforms(row_seeds(prompt_seeds(0, torch.arange(25_000)), 4), position=4))


def test_inverse_cdf_draws_follow_the_probabilities_and_skip_zeros():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = uniforms(row_seeds(prompt_seeds(1, torch.arange(20_000)), 1), position=0)
    tokens = sample_from(probs.expand(len(u), 4), u)
    freq = torch.bincount(tokens, minlength=4).float() / len(u)
    assert freq[1] == 0
    assert torch.allclose(freq, probs, atol=0.015)
    # unnormalised (top-p filtered) rows: drawn in proportion to what is left
    assert sample_from(torch.tensor([[0.0, 0.2, 0.0, 0.2]]), torch.tensor([0.0])).item() == 1
    assert sample_from(torch.tensor([[0.0, 0.2, 0.0, 0.2]]), torch.tensor([0.5])).item() == 3
    assert sample_from(torch.tensor([[0.5, 0.5]]), torch.tensor([0.999999])).item() == 1


def test_every_turn_of_every_trajectory_has_its_own_stream():
    from grpoflow.trajectories.turns import stream_seed
    # turn 0 is the single-turn sample's stream; later turns must not meet another trajectory's turn 0
    seeds = [stream_seed(11, i, 4, j, t) for i in range(6) for j in range(4) for t in range(5)]
    assert len(set(seeds)) == len(seeds)


def test_first_turn_seeds_are_the_streams_of_turn_zero():
    from grpoflow.trajectories.turns import first_turn_seeds, stream_seed
    assert first_turn_seeds(5, [3, 0, 9], 2) == [stream_seed(5, i, 2, j, 0) for i in (3, 0, 9) for j in range(2)]
