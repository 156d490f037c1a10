"""Where a config's values come from: defaults for pretrained models, recipes/builtin.yaml under
everything for a `builtin:` model, then a recipe, then overrides."""

import yaml

from grpoflow.config import BUILTIN_RECIPE, PRESETS, Config, config_layers, describe_layers, load_config


def test_defaults_suit_a_pretrained_model():
    cfg = Config()
    assert cfg.actor.lr <= 1e-5 and cfg.actor.lr_schedule == "constant"
    assert cfg.data.max_prompt_length >= 512 and cfg.rollout.max_new_tokens >= 256
    assert cfg.sft.lr <= 1e-5 and cfg.critic.lr <= 1e-5
    assert cfg.actor.clip_ratio_low == cfg.actor.clip_ratio_high == 0.2 and cfg.actor.grad_clip == 1.0


def test_no_arguments_is_the_builtin_job_with_its_own_settings():
    cfg = load_config()
    # the values the built-in job was tuned with (README), from the shipped warm start
    assert cfg.model.path == "builtin:tiny-4m-addition"
    assert (cfg.actor.lr, cfg.actor.lr_schedule, cfg.actor.min_lr_ratio) == (2e-4, "cosine", 0.1)
    assert (cfg.data.max_prompt_length, cfg.rollout.max_new_tokens) == (64, 8)
    assert (cfg.sft.steps, cfg.sft.lr, cfg.critic.lr) == (None, 1e-3, 1e-4)   # None: 400 for builtin:tiny-<size>
    assert (cfg.data.prompts_per_step, cfg.rollout.n, cfg.trainer.total_steps) == (32, 8, 300)
    assert config_layers() == [BUILTIN_RECIPE]


def test_every_value_of_builtin_yaml_is_applied():
    data = yaml.safe_load(BUILTIN_RECIPE.read_text())
    cfg = load_config().to_dict()
    for section, values in data.items():
        for key, value in values.items():
            assert cfg[section][key] == value, f"{section}.{key}"


def test_any_builtin_model_gets_the_builtin_layer_under_a_preset_and_overrides():
    cfg = load_config("dapo", ["model.path=builtin:tiny-0.5m", "actor.lr=1e-3"])
    assert config_layers("dapo", ["model.path=builtin:tiny-0.5m"]) == [BUILTIN_RECIPE, PRESETS / "dapo.yaml"]
    assert cfg.rollout.max_new_tokens == 8            # builtin layer
    assert cfg.actor.clip_ratio_high == 0.28          # preset over it
    assert cfg.actor.lr == 1e-3                       # command line over both


def test_a_real_model_with_a_preset_keeps_the_pretrained_defaults():
    cfg = load_config("dapo", ["model.path=/models/m"])
    assert config_layers("dapo", ["model.path=/models/m"]) == [PRESETS / "dapo.yaml"]
    assert cfg.actor.lr == Config().actor.lr and cfg.rollout.max_new_tokens == Config().rollout.max_new_tokens
    assert cfg.actor.clip_ratio_high == 0.28


def test_a_recipe_that_names_a_builtin_model_gets_the_builtin_layer(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: builtin:tiny-0.5m\nrollout:\n  n: 4\n")
    cfg = load_config(str(recipe))
    assert cfg.actor.lr == 2e-4 and cfg.rollout.n == 4
    # ... and an override to a real model removes it again
    assert load_config(str(recipe), ["model.path=/m"]).actor.lr == Config().actor.lr


def test_describe_layers_names_each_source_in_order():
    text = describe_layers("grpo", ["rollout.n=4"])
    lines = text.splitlines()
    assert lines[0].startswith("#") and "later ones win" in lines[0]
    assert "defaults (grpoflow/config/schema.py)" in lines[1]
    assert lines[2].endswith("builtin.yaml") and lines[3].endswith("grpo.yaml")
    assert lines[4].endswith("command line: rollout.n=4")
    assert "builtin.yaml" not in describe_layers(None, ["model.path=/m"])


def test_grpoflow_config_prints_the_layers_and_the_resolved_values(capsys):
    from grpoflow.cli import main

    assert main(["config", "rollout.n=4"]) == 0
    out = capsys.readouterr().out
    assert "builtin.yaml" in out and "command line: rollout.n=4" in out
    resolved = yaml.safe_load(out)   # the header is YAML comments
    assert resolved["actor"]["lr"] == 2e-4 and resolved["rollout"]["n"] == 4
    assert main(["config", "model.path=/m"]) == 0
    out = capsys.readouterr().out
    assert "builtin.yaml" not in out and yaml.safe_load(out)["actor"]["lr"] == 1e-6
