"""The config sections rollout.multi_turn, rollout.agent and rollout.partial: they resolve from overrides, YAML
recipes and the shipped presets; the flat keys they replaced are an error naming the new key (never silently
ignored), except in a run folder's saved config.yaml, which is read under the new names; verl's names point to
ours."""

import pytest
import yaml

from grpoflow.config import Config, ConfigError, help_text, load_config, saved_config, to_yaml
from grpoflow.config.moved import MOVED, translate_moved
from grpoflow.viewer.watched_run import read_config, schedule_line, summary
from old_configs import NEWER_THAN_THE_MOVE, old_flat

# every old flat key, with a value of its type, and its new name (written out by hand, not derived from MOVED)
OLD_KEYS = [
    ("rollout.env=guess_number", "rollout.multi_turn.env"),
    ("rollout.env_args={url: http://127.0.0.1:1}", "rollout.multi_turn.env_args"),
    ("rollout.tools=[calculator]", "rollout.multi_turn.tools"),
    ("rollout.max_turns=3", "rollout.multi_turn.max_turns"),
    ("rollout.tool_parser=hermes", "rollout.multi_turn.tool_parser"),
    ("rollout.max_tool_calls_per_turn=2", "rollout.multi_turn.max_tool_calls_per_turn"),
    ("rollout.max_tool_output_tokens=64", "rollout.multi_turn.max_tool_output_tokens"),
    ("rollout.tool_timeout_s=5", "rollout.multi_turn.tool_timeout_s"),
    ("rollout.tool_cpu_time_s=5", "rollout.multi_turn.tool_cpu_time_s"),
    ("rollout.tool_memory_mb=512", "rollout.multi_turn.tool_memory_mb"),
    ("rollout.tool_workers=1", "rollout.multi_turn.tool_workers"),
    ("rollout.agent=agents/calc.py:run", "rollout.agent.program"),
    ("rollout.agent_args={agent: {harness: {id: null}}}", "rollout.agent.args"),
    ("rollout.agent_timeout_s=60", "rollout.agent.timeout_s"),
    ("rollout.agent_model=policy", "rollout.agent.model"),
    ("rollout.partial=true", "rollout.partial.enable"),
    ("rollout.partial_oversample=2", "rollout.partial.oversample"),
    ("rollout.partial_max_staleness=3", "rollout.partial.max_staleness"),
]


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- the new sections resolve


def test_multi_turn_keys_resolve_from_overrides():
    cfg = load_config(None, ["rollout.multi_turn.env=guess_number", "rollout.multi_turn.max_turns=3",
                             "rollout.multi_turn.tools=[calculator]", "rollout.multi_turn.tool_timeout_s=2"])
    m = cfg.rollout.multi_turn
    assert (m.env, m.max_turns, m.tools, m.tool_timeout_s) == ("guess_number", 3, ["calculator"], 2.0)
    assert m.enabled and not cfg.rollout.agent.enabled and cfg.rollout.conversational
    assert not Config().rollout.multi_turn.enabled and not Config().rollout.conversational


def test_agent_keys_resolve_from_a_yaml_recipe(tmp_path):
    cfg = load_config(_write(tmp_path, "rollout:\n  n: 4\n  agent:\n    program: a.py:run\n    timeout_s: 30\n"
                                       "    args: {x: 1}\n  multi_turn:\n    max_turns: 2\n"))
    a = cfg.rollout.agent
    assert (a.program, a.timeout_s, a.args, a.model) == ("a.py:run", 30.0, {"x": 1}, "policy")
    assert a.enabled and cfg.rollout.multi_turn.max_turns == 2 and cfg.rollout.n == 4


def test_partial_keys_resolve_from_overrides_and_a_yaml_recipe(tmp_path):
    p = load_config(None, ["rollout.partial.enable=true", "rollout.partial.oversample=2",
                           "rollout.partial.max_staleness=3"]).rollout.partial
    assert (p.enable, p.oversample, p.max_staleness) == (True, 2.0, 3)
    cfg = load_config(_write(tmp_path, "rollout:\n  partial:\n    enable: true\n    oversample: 1.25\n"),
                      ["rollout.partial.max_staleness=0"])
    assert (cfg.rollout.partial.enable, cfg.rollout.partial.oversample, cfg.rollout.partial.max_staleness) == \
        (True, 1.25, 0)
    assert cfg.actor.rollout_is == "token"  # stale samples: resolved on by the section's switch
    assert not Config().rollout.partial.enable and load_config().actor.rollout_is == "off"
    with pytest.raises(ConfigError, match="rollout.partial.oversample must be >= 1"):
        load_config(None, ["rollout.partial.oversample=0.5"])


def test_an_override_wins_over_the_recipe_inside_a_section(tmp_path):
    recipe = _write(tmp_path, "rollout:\n  multi_turn:\n    env: guess_number\n    max_turns: 2\n")
    cfg = load_config(recipe, ["rollout.multi_turn.max_turns=5"])
    assert cfg.rollout.multi_turn.env == "guess_number" and cfg.rollout.multi_turn.max_turns == 5


@pytest.mark.parametrize("preset, env, tools, max_turns", [
    ("guess_number", "guess_number", [], 4), ("calculator_tool", None, ["calculator"], 2),
    ("smollm2_guess_number", "guess_number", [], 4), ("smollm2_calculator", None, ["calculator"], 2)])
def test_the_multi_turn_presets_use_the_section(preset, env, tools, max_turns):
    m = load_config(preset).rollout.multi_turn
    assert (m.env, m.tools, m.max_turns) == (env, tools, max_turns)


def test_the_agent_example_recipe_uses_the_section():
    cfg = load_config("examples/agents/calculator_agent.yaml")
    assert cfg.rollout.agent.program == "examples/agents/calculator_agent.py:run"
    assert cfg.rollout.agent.timeout_s == 120 and cfg.rollout.multi_turn.max_turns == 2


def test_grpoflow_config_prints_the_sections_nested(capsys):
    from grpoflow.cli import main

    assert main(["config", "rollout.multi_turn.max_turns=3", "rollout.agent.model=m"]) == 0
    rollout = yaml.safe_load(capsys.readouterr().out)["rollout"]
    assert rollout["multi_turn"]["max_turns"] == 3 and rollout["agent"]["model"] == "m"
    assert not {"max_turns", "env", "tools", "agent_args", "agent_model"} & set(rollout)


def test_help_names_the_section_keys_and_no_old_flat_key():
    text = help_text()
    assert "rollout.multi_turn.max_turns = 4" in text and "rollout.agent.program = None" in text
    for old, _ in OLD_KEYS:
        assert f"  {old.split('=')[0]} = " not in text, old


def test_a_section_is_not_a_switch():
    """`if cfg.rollout.agent:` would always be true now; it raises instead of running agent code for every run."""
    cfg = Config()
    with pytest.raises(TypeError, match="rollout.agent.enabled"):
        bool(cfg.rollout.agent)
    with pytest.raises(TypeError, match="rollout.multi_turn.enabled"):
        bool(cfg.rollout.multi_turn)
    with pytest.raises(TypeError, match="rollout.partial.enable"):  # `if r.partial:` was the old switch
        bool(cfg.rollout.partial)


# ---------------------------------------------------------------- the old flat keys


def test_the_list_of_old_keys_is_complete():
    assert {o.split("=")[0] for o, _ in OLD_KEYS} == set(MOVED)


@pytest.mark.parametrize("override, new", OLD_KEYS)
def test_an_old_flat_key_on_the_command_line_names_its_new_key(override, new):
    old = override.split("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert f"Config key `{old}` moved to `{new}`" in str(err.value)
    assert f"`{new}=...`" in str(err.value)


@pytest.mark.parametrize("text, old, new", [
    ("rollout:\n  max_turns: 3\n", "rollout.max_turns", "rollout.multi_turn.max_turns"),
    ("rollout:\n  env: guess_number\n  n: 4\n", "rollout.env", "rollout.multi_turn.env"),
    ("rollout:\n  agent: a.py:run\n", "rollout.agent", "rollout.agent.program"),
    ("rollout:\n  agent_timeout_s: 30\n", "rollout.agent_timeout_s", "rollout.agent.timeout_s"),
    ("rollout:\n  partial: true\n", "rollout.partial", "rollout.partial.enable"),
    ("rollout:\n  partial_oversample: 2\n", "rollout.partial_oversample", "rollout.partial.oversample"),
])
def test_an_old_flat_key_in_a_yaml_recipe_names_its_new_key(tmp_path, text, old, new):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    assert f"Config key `{old}` moved to `{new}`" in str(err.value)
    assert f"`{new.split('.')[-1]}:` under `rollout:` `{new.split('.')[1]}:`" in str(err.value)


def test_an_empty_agent_entry_is_the_empty_section(tmp_path):
    # `agent: null` meant "no agent" before and means the section's defaults now: the same run, not an error
    assert not load_config(_write(tmp_path, "rollout:\n  agent:\n")).rollout.agent.enabled
    assert not load_config(None, ["rollout.agent=null"]).rollout.agent.enabled
    assert not load_config(_write(tmp_path, "rollout:\n  partial:\n")).rollout.partial.enable


@pytest.mark.parametrize("override, ours", [
    ("rollout.multi_turn.max_assistant_turns=3", "`rollout.multi_turn.max_turns`"),
    ("rollout.multi_turn.format=hermes", "`rollout.multi_turn.tool_parser`"),
    ("rollout.multi_turn.max_parallel_calls=2", "`rollout.multi_turn.max_tool_calls_per_turn`"),
    ("rollout.multi_turn.enable=true", "multi-turn is on when rollout.multi_turn.env or rollout.multi_turn.tools"),
    ("rollout.agent.agent_loop_config_path=a.yaml", "`rollout.agent.program`"),
])
def test_a_verl_key_name_points_to_ours(override, ours):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert "verl's `actor_rollout_ref." in str(err.value) and ours in str(err.value)


# ---------------------------------------------------------------- checks name the new keys


@pytest.mark.parametrize("overrides, fragment", [
    (["rollout.multi_turn.max_turns=0"], "rollout.multi_turn.max_turns, max_tool_calls_per_turn"),
    (["rollout.multi_turn.tool_timeout_s=0"], "rollout.multi_turn.tool_timeout_s, tool_cpu_time_s"),
    (["rollout.multi_turn.max_turns=1009"], "rollout.multi_turn.max_turns=1009: at most 1008 turns"),
    (["rollout.agent.timeout_s=0"], "rollout.agent.timeout_s must be > 0"),
    (["rollout.agent.program=a.py:run", "rollout.multi_turn.env=guess_number"],
     "leave rollout.multi_turn.env and rollout.multi_turn.tools empty"),
])
def test_validation_messages_name_the_section_keys(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert fragment in str(err.value)


def test_partial_rollout_of_agent_episodes_is_refused_at_the_start_up_check_naming_both_keys():
    """The rollout kind declares whether it can pause (trajectories/agents.py: an agent episode cannot); the start-up
    check (plan/checks.py) asks that declaration, so the refusal comes from there, not from the config's own check."""
    from grpoflow.plan.checks import check_partial

    cfg = load_config(None, ["rollout.partial.enable=true", "rollout.agent.program=a.py:run"])
    with pytest.raises(ConfigError) as err:
        check_partial(cfg)
    assert "an agent episode, rollout.agent.program, holds" in str(err.value)
    assert "unset rollout.partial.enable or rollout.agent.program" in str(err.value)


# ---------------------------------------------------------------- a run folder's config.yaml of an older grpoflow


def test_translate_moved_reads_an_old_config_under_the_new_names():
    new = yaml.safe_load(to_yaml(load_config("guess_number", ["rollout.agent.timeout_s=30"])))
    old = old_flat(new)
    for key in NEWER_THAN_THE_MOVE:  # what an older config.yaml cannot hold (the defaults apply on load)
        new["rollout"]["multi_turn"].pop(key)
    assert "max_turns" in old["rollout"] and "multi_turn" not in old["rollout"]
    moved = translate_moved(old)
    assert old == new
    assert "rollout.max_turns -> rollout.multi_turn.max_turns" in moved
    assert "rollout.agent -> rollout.agent.program" in moved and len(moved) == len(MOVED)
    assert "rollout.partial -> rollout.partial.enable" in moved
    assert "rollout.partial_oversample -> rollout.partial.oversample" in moved
    assert translate_moved(old) == []  # a config of this version: nothing to move


def test_translate_moved_keeps_a_key_already_in_its_section():
    tree = {"rollout": {"max_turns": 2, "multi_turn": {"max_turns": 5}, "agent": None}}
    translate_moved(tree)
    assert tree == {"rollout": {"multi_turn": {"max_turns": 5}, "agent": {"program": None}}}


def test_an_old_run_folders_partial_keys_are_read_under_the_section():
    cfg = saved_config({"rollout": {"partial": True, "partial_oversample": 2.0, "partial_max_staleness": 1}})
    assert (cfg.rollout.partial.enable, cfg.rollout.partial.oversample, cfg.rollout.partial.max_staleness) == \
        (True, 2.0, 1)
    assert cfg.actor.rollout_is == "token"
    tree = {"rollout": {"partial_oversample": 2.0, "partial": {"oversample": 3.0}}}  # the section's value wins
    assert translate_moved(tree) == ["rollout.partial_oversample -> rollout.partial.oversample"]
    assert tree == {"rollout": {"partial": {"oversample": 3.0}}}


def test_an_old_run_folders_config_loads_and_shows_in_the_viewer(tmp_path):
    new = yaml.safe_load(to_yaml(load_config("guess_number", ["data.prompts_per_step=4"])))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old_flat(new), sort_keys=False))
    assert saved_config(old_flat(new)).rollout.multi_turn.env == "guess_number"
    with pytest.raises(ConfigError, match="moved to `rollout.multi_turn.env`"):
        load_config(str(tmp_path / "config.yaml"))  # as a recipe for a new run: the user renames the keys
    assert schedule_line(tmp_path / "config.yaml").startswith("schedule: 4 prompts x 8 samples")
    assert summary(read_config(tmp_path / "config.yaml")[1])["rollout.multi_turn.env"] == "guess_number"
