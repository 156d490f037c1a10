import textwrap

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
    load_from_file,
    ppo_clip_loss,
    register_advantage,
    register_policy_loss,
    required_inputs,
)


def test_builtins_are_registered_on_import():
    assert "grpo" in ADVANTAGE_ESTIMATORS
    assert "ppo" in POLICY_LOSSES
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"} <= set(
        LOSS_AGGREGATIONS.names()
    )
    assert {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gae",
            "grpo_passk"} <= set(ADVANTAGE_ESTIMATORS.names())
    assert {"ppo", "gspo", "cispo", "reinforce"} <= set(POLICY_LOSSES.names())
    assert "k3+" in KL_ESTIMATORS
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


# ---------------------------------------------------------------- metadata


def test_registry_stores_metadata():
    reg = Registry("widget")
    reg.register("a", flavour="sour", size=3)(lambda: None)
    reg.register("b")(lambda: None)
    assert reg.meta("a") == {"flavour": "sour", "size": 3}
    assert reg.meta("b") == {}
    reg.meta("a")["flavour"] = "sweet"  # a copy: the stored metadata is unchanged
    assert reg.meta("a")["flavour"] == "sour"
    with pytest.raises(ValueError, match="widget 'c'"):
        reg.meta("c")


def test_register_policy_loss_agg_modes():
    @register_policy_loss("test_registry_seq_loss", agg_modes=["seq-mean-token-mean"], override=True)
    def seq_loss(log_probs, advantages, response_mask):
        return -advantages * log_probs, {}

    assert POLICY_LOSSES.meta("test_registry_seq_loss") == {"agg_modes": ("seq-mean-token-mean",)}
    assert POLICY_LOSSES.meta("ppo") == {}  # None: every mode
    with pytest.raises(ValueError, match=r"tuple of mode names.*agg_modes=\('token-mean',\)"):
        register_policy_loss("test_registry_bad", agg_modes="token-mean")


def test_register_advantage_metadata():
    @register_advantage("test_registry_meta_adv", override=True, paper="arXiv:0000.00000")
    def adv(token_level_rewards, response_mask):
        return token_level_rewards, token_level_rewards

    assert ADVANTAGE_ESTIMATORS.meta("test_registry_meta_adv") == {"paper": "arXiv:0000.00000"}
    assert ADVANTAGE_ESTIMATORS.meta("grpo") == {}


# ---------------------------------------------------------------- user functions from files


USER_FILE = textwrap.dedent("""
    import torch
    from torch import Tensor

    from grpoflow.algorithms import register_advantage

    CONSTANT = 3


    @register_advantage("test_file_length_advantage", override=True, returns=False)
    def length_advantage(scores: Tensor, response_mask: Tensor) -> Tensor:
        # every token gets the response length
        return response_mask.float() * response_mask.sum(-1, keepdim=True)


    def helper():
        return CONSTANT


    def _private():
        pass
""")


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_estimators.py"
    path.write_text(USER_FILE)
    return path


def test_load_from_file_runs_the_decorators(user_file):
    fn = load_from_file(f"{user_file}:length_advantage")
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    torch.testing.assert_close(fn(torch.zeros(1), mask), torch.tensor([[2.0, 2.0, 0.0]]))
    # the decorator ran: the estimator is available by the name it registered
    assert get_advantage("test_file_length_advantage") is fn
    assert ADVANTAGE_ESTIMATORS.meta("test_file_length_advantage") == {"returns": False}
    # loading again reuses the module (a second run of the decorator would register a
    # different function object under the same name)
    assert load_from_file(f"{user_file}:length_advantage") is fn
    assert load_from_file(f"{user_file}:helper")() == 3


def test_load_from_file_errors(user_file, tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_from_file(f"{missing}:fn")
    with pytest.raises(ValueError) as err:
        load_from_file(f"{user_file}:lenght_advantage")
    message = str(err.value)
    # names the missing function and lists the file's own public callables only
    assert "'lenght_advantage'" in message
    assert "['helper', 'length_advantage']" in message
    with pytest.raises(ValueError, match="CONSTANT"):
        load_from_file(f"{user_file}:CONSTANT")  # not callable
    with pytest.raises(ValueError, match="expected 'path/to/file.py:function_name'"):
        load_from_file(str(user_file))


def test_load_from_file_propagates_import_errors_and_retries(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('broken on purpose')\n")
    for _ in range(2):  # no half-imported module is cached
        with pytest.raises(RuntimeError, match="broken on purpose"):
            load_from_file(f"{path}:fn")


def test_resolve_names_and_file_specs(user_file, monkeypatch):
    assert ADVANTAGE_ESTIMATORS.resolve("grpo") is grpo_advantage
    with pytest.raises(ValueError, match="did you mean 'grpo'"):
        ADVANTAGE_ESTIMATORS.resolve("gpro")

    monkeypatch.chdir(user_file.parent)  # a relative path is taken from the working directory
    spec = "my_estimators.py:length_advantage"
    fn = ADVANTAGE_ESTIMATORS.resolve(spec)
    assert fn is ADVANTAGE_ESTIMATORS.get("test_file_length_advantage")
    # registered under the spec itself, with the metadata the file registered it with
    assert ADVANTAGE_ESTIMATORS.get(spec) is fn
    assert ADVANTAGE_ESTIMATORS.meta(spec) == {"returns": False}
    assert get_advantage(spec) is fn
    assert ADVANTAGE_ESTIMATORS.resolve(f"{user_file}:length_advantage") is fn
