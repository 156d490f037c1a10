import pytest
import torch

from grpoflow.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    call_with_available,
    get_advantage,
    get_policy_loss,
    grpo_advantage,
    ppo_clip_loss,
    register_advantage,
    required_inputs,
)


def test_builtins_are_registered_on_import():
    assert "grpo" in ADVANTAGE_ESTIMATORS
    assert "ppo" in POLICY_LOSSES
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"} <= set(
        LOSS_AGGREGATIONS.names()
    )
    assert get_advantage("grpo") is grpo_advantage
    assert get_policy_loss("ppo") is ppo_clip_loss


def test_register_get_names_contains():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    @reg.register("a")
    def a():
        return "a"

    assert reg.get("a") is a and reg.get("b") is b
    assert reg.names() == ["a", "b"]
    assert "a" in reg and "c" not in reg


def test_reregistering_a_name():
    reg = Registry("widget")

    def f():
        pass

    def g():
        pass

    reg.register("x")(f)
    reg.register("x")(f)  # the same function again is a no-op
    with pytest.raises(ValueError, match="'x' is already registered.*override=True"):
        reg.register("x")(g)
    assert reg.get("x") is f
    reg.register("x", override=True)(g)
    assert reg.get("x") is g


def test_unknown_name_error_names_kind_closest_and_all_valid():
    reg = Registry("policy loss")
    for name in ("ppo", "gspo", "cispo"):
        reg.register(name)(lambda: None)
    with pytest.raises(ValueError) as err:
        reg.get("gpso")
    message = str(err.value)
    assert "policy loss" in message
    assert "'gpso'" in message
    assert "did you mean 'gspo'" in message
    assert "['cispo', 'gspo', 'ppo']" in message


def test_global_registry_error_suggests_builtin():
    with pytest.raises(ValueError, match="advantage estimator 'gpro'; did you mean 'grpo'"):
        get_advantage("gpro")


def test_user_registered_estimator_is_retrievable_by_name():
    @register_advantage("test_registry_constant", override=True)
    def constant_advantage(scores, response_mask, group_ids, value: float = 1.0):
        return torch.full(response_mask.shape, value) * response_mask

    fn = get_advantage("test_registry_constant")
    assert fn is constant_advantage
    assert "test_registry_constant" in ADVANTAGE_ESTIMATORS
    mask = torch.tensor([[1.0, 0.0]])
    out = call_with_available(fn, scores=torch.zeros(1), response_mask=mask,
                              group_ids=torch.zeros(1, dtype=torch.long), value=2.0)
    torch.testing.assert_close(out, torch.tensor([[2.0, 0.0]]))


def test_call_with_available_passes_only_accepted_args():
    seen = {}

    def fn(a, b, c=3):
        seen.update(a=a, b=b, c=c)
        return a + b + c

    # d and e are not in fn's signature and must not be passed (fn would raise TypeError).
    assert call_with_available(fn, a=1, b=2, d=4, e=5) == 6
    assert seen == {"a": 1, "b": 2, "c": 3}
    assert call_with_available(fn, a=1, b=2, c=10, d=4) == 13


def test_call_with_available_passes_everything_to_var_kwargs():
    def fn(a, **kwargs):
        return a, kwargs

    assert call_with_available(fn, a=1, b=2, c=3) == (1, {"b": 2, "c": 3})


def test_call_with_available_missing_input_error():
    def needs_values(scores, token_level_values, gamma=1.0):
        return scores

    with pytest.raises(TypeError) as err:
        call_with_available(needs_values, scores=1, response_mask=2)
    message = str(err.value)
    assert "needs_values" in message
    assert "['token_level_values']" in message
    assert "['response_mask', 'scores']" in message


def test_required_inputs():
    def fn(a, b, *args, c, d=1, **kwargs):
        pass

    assert required_inputs(fn) == {"a", "b", "c"}
    assert required_inputs(grpo_advantage) == {"scores", "response_mask", "group_ids"}
    assert required_inputs(ppo_clip_loss) == {
        "log_probs", "old_log_probs", "advantages", "response_mask"
    }
