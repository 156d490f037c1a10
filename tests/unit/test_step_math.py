"""The controller's own arithmetic (controller/step_math.py, controller/rewarding.py) against hand values."""


import torch

from grpoflow.controller.rewarding import shape_scores
from grpoflow.controller.step_math import loss_mask, partition_groups, score_at_last_token, token_rewards


def test_score_sits_at_the_last_response_token():
    # lengths 2, 3, 0: scores go to columns 1, 2 and (empty response) 0
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = score_at_last_token(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert out.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [3.0, 0.0, 0.0]]
    assert out.dtype == torch.float32


def test_multi_turn_score_sits_at_the_models_last_token_not_after_environment_tokens():
    # model tokens (1) and environment tokens (0) interleaved: model, env, env, model, model, env, padding
    mask = torch.tensor([[1, 0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0]])
    out = score_at_last_token(torch.tensor([5.0, -1.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 5.0, 0, 0], [0, -1.0, 0, 0, 0, 0, 0]]


def test_mask_truncated_drops_every_token_of_a_truncated_sample():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    truncated = torch.tensor([True, False, False])
    assert loss_mask(mask, truncated, mask_truncated=True).tolist() == [[0, 0], [1, 0], [1, 1]]
    assert loss_mask(mask, truncated, mask_truncated=False) is mask


def test_kl_in_the_reward_composed_with_the_score_and_the_mask():
    # k1 = old - ref = 0.5, 0, -0.5 | 0.2, (0.4: padding) ; coef 0.1
    # row 0: score 1 at token 2: [-0.05, 0, 1 + 0.05]; row 1: score 2 at token 0: [2 - 0.02, 0]
    scores = torch.tensor([1.0, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -1.4, -1.0]])
    rewards, out_mask, metrics = token_rewards(scores, mask, torch.tensor([False, False]), mask_truncated=False,
                                               old_log_probs=old, ref_log_probs=ref, kl_coef=0.1, kl_estimator="k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.05], [1.98, 0.0, 0.0]]))
    assert out_mask.tolist() == mask.tolist()
    # kl_mean over the 4 valid tokens: (0.5 + 0 - 0.5 + 0.2) / 4 = 0.05
    torch.testing.assert_close(metrics["kl_in_reward/kl_mean"], torch.tensor(0.05))


def test_kl_in_the_reward_spares_a_masked_truncated_sample():
    # row 1 is truncated and masked out: no KL term on it, its score stays at its last token
    scores = torch.tensor([1.0, 2.0])
    mask = torch.tensor([[1, 1], [1, 1]])
    old, ref = torch.zeros(2, 2), torch.full((2, 2), -1.0)   # k1 = 1 everywhere
    rewards, out_mask, metrics = token_rewards(scores, mask, torch.tensor([False, True]), mask_truncated=True,
                                               old_log_probs=old, ref_log_probs=ref, kl_coef=0.5, kl_estimator="k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.5, 0.5], [0.0, 2.0]]))
    assert out_mask.tolist() == [[1, 1], [0, 0]]
    torch.testing.assert_close(metrics["kl_in_reward/kl_mean"], torch.tensor(1.0))


def test_no_kl_term_without_log_probs():
    rewards, _, metrics = token_rewards(torch.tensor([1.0]), torch.tensor([[1, 1]]), torch.tensor([False]),
                                        mask_truncated=False)
    assert rewards.tolist() == [[0.0, 1.0]] and metrics == {}


def test_overlong_penalty_on_the_scores():
    # max 12, buffer 4: no penalty up to 8 tokens, then (8 - L) / 4 * 0.5: L=9 -> -0.125, L=12 -> -0.5
    scores = torch.tensor([1.0, 1.0, 1.0])
    lengths = torch.tensor([6, 9, 12])
    out = shape_scores(scores, lengths, max_length=12, buffer=4, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([1.0, 0.875, 0.5]))
    assert shape_scores(scores, lengths, max_length=12, buffer=0, penalty_factor=0.5) is scores


def test_dynamic_sampling_keeps_groups_with_signal_and_sets_the_rest_aside():
    # 3 groups of 2: group 0 and 2 have different rewards (signal), group 1 does not
    signal = torch.tensor([True, True, False, False, True, True])
    assert partition_groups(signal, torch.tensor([0, 0, 1, 1, 2, 2])) == ([0, 2], [1])
    assert partition_groups(torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.long)) == ([], [0])
    # groups of unequal size (an agent episode split into several samples)
    assert partition_groups(torch.tensor([False, True, True, True]), torch.tensor([0, 1, 1, 1])) == ([1], [0])
