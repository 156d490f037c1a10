"""The one start-up check: every registry-backed config key is resolved before any model loads.

These typos used to pass the config's checks and fail inside a worker, after the warm start and the
first rollout (actor.loss_agg_mode, actor.kl_estimator, algorithm.kl_penalty), or were checked
against a list the config hard-coded beside the registry (rollout.engine, algorithm.kl_ctrl.type).
"""

import pytest

from grpoflow.config import ConfigError, load_config
from grpoflow.plan.checks import check_config, check_exact, check_nucleus_sampling


@pytest.mark.parametrize("override, named", [
    ("actor.loss_agg_mode=tokenmean", "actor.loss_agg_mode='tokenmean'.*did you mean 'token-mean'"),
    ("actor.kl_estimator=k4", "actor.kl_estimator='k4'"),
    ("algorithm.kl_penalty=kl", "algorithm.kl_penalty=kl is verl's name; here it is `algorithm.kl_penalty=k1`"),
    ("algorithm.kl_ctrl.type=adaptiv", "algorithm.kl_ctrl.type='adaptiv'.*did you mean 'adaptive'"),
    ("algorithm.adv_estimator=grp", "algorithm.adv_estimator='grp'.*did you mean 'grpo'"),
    ("actor.policy_loss=ppo2", "actor.policy_loss='ppo2'"),
    ("rollout.engine=tgi", "rollout.engine='tgi'.*'hf', 'sglang', 'vllm'"),
    ("reward.function=exact_mach", "reward.function='exact_mach'.*did you mean 'exact_match'"),
    ("reward.functions=[gsm8k,fromat]", "reward.function='fromat'.*did you mean 'format'"),
    ("reward.routes={gsm8k: gsm9k}", "reward.function='gsm9k'"),
    (["rollout.multi_turn.tools=[calculator]", "rollout.multi_turn.tool_parser=hermse"],
     "rollout.multi_turn.tool_parser='hermse'.*did you mean"),
    (["rollout.multi_turn.env=guess_number", "rollout.multi_turn.max_turns=2000"],
     "rollout.multi_turn.max_turns=2000: at most 1008 turns"),
])
def test_every_registry_backed_key_is_resolved_at_start(override, named):
    with pytest.raises(ConfigError, match=named):
        check_config(load_config(None, override if isinstance(override, list) else [override]))


def test_a_file_spec_that_does_not_exist_names_the_key(tmp_path):
    cfg = load_config(None, [f"algorithm.adv_estimator={tmp_path}/missing.py:adv"])
    with pytest.raises(ConfigError, match="algorithm.adv_estimator=.*does not exist"):
        check_config(cfg)


def test_the_defaults_and_the_presets_pass():
    from grpoflow.config import preset_names

    check_config(load_config())
    for name in preset_names():
        check_config(load_config(name))


def test_async_top_p_guard_applies_to_the_resolved_importance_sampling():
    # Async mode turns on token-level IS for stale samples; it used to skip this guard.
    cfg = load_config(None, ["backend=ray", "placement=split", "trainer.mode=async", "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match=r"trainer.mode=async turns it on.*rollout.top_p=1 or actor.rollout_is=off"):
        check_config(cfg)
    check_config(load_config(None, ["backend=ray", "placement=split", "trainer.mode=async", "rollout.top_p=0.9",
                                    "actor.rollout_is=off"]))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_top_p_importance_sampling_is_refused_where_the_engine_records_no_nucleus(engine):
    # vLLM and SGLang return each token's log-prob but not the nucleus it was drawn from: the trainer cannot score
    # the token under the same renormalised set, so the importance ratio would be biased (TRL #7269)
    cfg = load_config(None, [f"rollout.engine={engine}", "actor.rollout_is=token", "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match=f"rollout.engine={engine} does not report.*rollout.engine=hf"):
        check_nucleus_sampling(cfg)
    check_nucleus_sampling(load_config(None, ["rollout.engine=hf", "actor.rollout_is=token", "rollout.top_p=0.9"]))


def test_exact_mode_is_refused_on_other_engines_than_hf():
    with pytest.raises(ConfigError, match="rollout.exact=true.*rollout.engine=vllm computes with its own"):
        check_exact(load_config(None, ["rollout.engine=vllm", "rollout.exact=true"]))
    check_exact(load_config(None, ["rollout.engine=hf", "rollout.exact=true"]))


def test_exact_mode_asks_what_the_engine_declares():
    """Not the engine's name: one registered as batch-invariant is taken with rollout.exact."""
    from grpoflow.engines.factory import ROLLOUT_ENGINES, register_rollout_engine

    cfg = load_config(None, ["rollout.engine=declared_exact_engine", "rollout.exact=true"])
    register_rollout_engine("declared_exact_engine", override=True, batch_invariant=True)(lambda model_path, **_: None)
    try:
        check_exact(cfg)
        register_rollout_engine("declared_exact_engine", override=True)(lambda model_path, **_: None)
        with pytest.raises(ConfigError, match="rollout.engine=declared_exact_engine computes with its own"):
            check_exact(cfg)
    finally:
        ROLLOUT_ENGINES._fns.pop("declared_exact_engine")
        ROLLOUT_ENGINES._meta.pop("declared_exact_engine")


def test_multi_turn_settings_are_checked_before_any_model_loads(tmp_path):
    from grpoflow.config import load_config

    with pytest.raises(ConfigError, match="rollout.multi_turn.env='nowhere_env'"):
        check_config(load_config(None, ["rollout.multi_turn.env=nowhere_env"]))
    with pytest.raises(ConfigError, match="rollout.multi_turn.tools"):
        check_config(load_config(None, ["rollout.multi_turn.tools=[no_such_tool]"]))
    untyped = tmp_path / "tools.py"
    untyped.write_text("def f(x):\n    return x\n")
    with pytest.raises(ConfigError, match="no docstring"):
        check_config(load_config(None, [f"rollout.multi_turn.tools=[{untyped}:f]"]))
    with pytest.raises(ConfigError, match="max_turns"):
        check_config(load_config(None, ["rollout.multi_turn.max_turns=0", "rollout.multi_turn.env=guess_number"]))


@pytest.mark.parametrize("source, overrides, named", [
    ("def run(row, client):\n    return 1.0\n", [], "is not an async function"),
    ("async def run(row):\n    return 1.0\n", [], r"must take two arguments, \(row, client\)"),
    ("async def run(row, client):\n    return 1.0\n", ["algorithm.filter_groups.enable=true"],
     "filter_groups needs groups of exactly rollout.n"),
    ("async def run(row, client):\n    return 1.0\n", ["algorithm.adv_estimator=remax"], "greedy baseline"),
    ("async def run(row, client):\n    return 1.0\n", ["rollout.multi_turn.tools=[calculator]"],
     "leave rollout.multi_turn.env and rollout.multi_turn.tools empty"),
])
def test_rollout_agent_is_checked_at_start(tmp_path, source, overrides, named):
    (tmp_path / "agent.py").write_text(source)
    with pytest.raises(ConfigError, match=named):  # plain values fail at load, the rest at the start-up check
        check_config(load_config(None, [f"rollout.agent.program={tmp_path}/agent.py:run", "reward.function=null",
                                        *overrides]))


def test_a_good_agent_passes(tmp_path):
    (tmp_path / "agent.py").write_text("async def run(row, client):\n    return 1.0\n")
    check_config(load_config(None, [f"rollout.agent.program={tmp_path}/agent.py:run", "reward.function=null"]))
