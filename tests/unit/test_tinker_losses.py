"""The Tinker API's losses (algorithms/tinker_losses.py) against hand-computed values and gradients."""

import math

import pytest
import torch

from grpoflow.algorithms.tinker_losses import TINKER_LOSSES, check_request

# One datum of 3 positions; position 0 is prompt (advantage 0). lp - q = 0, 0.5, 0 -> ratio 1, e^0.5, 1.
LP = [-1.0, -2.0, -0.5]
INPUTS = {"logprobs": torch.tensor([-1.0, -2.5, -0.5]), "advantages": torch.tensor([0.0, 1.0, -1.0])}
E05 = math.exp(0.5)


def run(name, inputs=INPUTS, config=None):
    lp = torch.tensor(LP, requires_grad=True)
    resolved = check_request(name, {"target_tokens", *inputs}, config)
    loss = TINKER_LOSSES[name].fn(lp, inputs, resolved)
    loss.backward()
    return loss.detach(), lp.grad


def close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)


def test_cross_entropy_is_the_weighted_sum_of_negative_log_probs():
    loss, grad = run("cross_entropy", {"weights": torch.tensor([0.0, 1.0, 1.0])})
    close(loss, 2.5)                      # -(-2 - 0.5)
    close(grad, [0.0, -1.0, -1.0])        # -weights
    loss, _ = run("cross_entropy", {})    # no weights: every position counts
    close(loss, 3.5)


def test_importance_sampling():
    loss, grad = run("importance_sampling")
    close(loss, -(E05 * 1.0 + 1.0 * -1.0))     # -(sum r * A) = -(1.6487 - 1)
    close(grad, [0.0, -E05, 1.0])              # d/dlp (-r A) = -r A


def test_ppo_clips_the_ratio_on_the_side_that_would_grow_the_objective():
    loss, grad = run("ppo")
    # position 1: min(1.6487 * 1, 1.2 * 1) = 1.2 (clipped, no gradient); position 2: min(-1, -1) = -1
    close(loss, -(1.2 - 1.0))
    close(grad, [0.0, 0.0, 1.0])
    loss, _ = run("ppo", config={"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    close(loss, -(E05 - 1.0))                  # nothing clipped at [0.5, 2]


def test_cispo_weights_reinforce_by_the_detached_clipped_ratio():
    loss, grad = run("cispo")
    close(loss, -(1.2 * -2.0 * 1.0 + 1.0 * -0.5 * -1.0))   # -(sum sg(clip r) lp A) = 1.9
    close(grad, [0.0, -1.2, 1.0])                          # the clipped token keeps a gradient, scaled by 1.2


def test_dro_penalises_the_squared_log_ratio():
    loss, grad = run("dro", config={"beta": 0.1})
    close(loss, -((-2.0 * 1.0 - 0.05 * 0.25) + (-0.5 * -1.0)))   # 1.5125
    close(grad, [0.0, -(1.0 - 0.1 * 0.5), 1.0])                  # -(A - beta (lp - q))


def test_gspo_uses_one_geometric_mean_ratio_per_sequence():
    inputs = dict(INPUTS, sequence_ratio_mask=torch.tensor([0.0, 1.0, 1.0]))
    loss, grad = run("gspo", inputs)
    s = math.exp((0.5 + 0.0) / 2)                 # 1.2840, clipped to 1.0004 where that lowers the objective
    close(loss, -(min(s, 1 + 4e-4) * 1.0 + min(-s, -(1 + 4e-4))))
    # only position 2's term (-s * A = s) is unclipped: ds/dlp_j = s * m_j / sum(m)
    close(grad, [0.0, s / 2, s / 2])


@pytest.mark.parametrize("name, inputs, config, words", [
    ("stable_reinforce", set(), None, "not published"),
    ("custom", set(), None, "forward_backward_custom"),
    ("kl", set(), None, "unknown loss_fn"),
    ("ppo", {"logprobs"}, None, "needs loss_fn_inputs ['advantages']"),
    ("cross_entropy", {"advantages"}, None, "does not use loss_fn_inputs ['advantages']"),
    ("dro", {"logprobs", "advantages"}, None, "needs loss_fn_config={'beta'"),
    ("ppo", {"logprobs", "advantages"}, {"clip": 0.1}, "no loss_fn_config keys ['clip']"),
])
def test_bad_requests_are_refused_with_a_sentence(name, inputs, config, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]").replace("{", r"\{")):
        check_request(name, {"target_tokens", *inputs}, config)
