"""grpoflow.config: defaults -> YAML recipe -> `a.b=c` overrides, strict keys and types, the batch schedule."""

import dataclasses
import typing

import pytest

from grpoflow.config import (
    Config,
    ConfigError,
    batch_schedule,
    check_config_values,
    help_text,
    load_config,
    parse_override,
    resolve_defaults,
    to_yaml,
)


def _leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field]]:
    """Every (dotted key, field) of the schema, walked independently of config's own helpers."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaf_fields(hints[f.name], prefix + f.name + ".")
        else:
            out.append((prefix + f.name, f))
    return out


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- layers


def test_a_pretrained_model_gets_the_dataclass_defaults():
    cfg = load_config(overrides=["model.path=/models/m"])
    expected = Config()
    expected.model.path = "/models/m"
    resolve_defaults(expected)  # the keys whose default depends on others
    assert cfg == expected
    assert cfg.backend == "local"
    assert cfg.actor.lr == 1e-6


def test_default_list_fields_are_not_shared_between_instances():
    a, b = Config(), Config()
    a.data.train_files.append("x.jsonl")
    assert b.data.train_files == ["builtin:addition/train"]


def test_recipe_with_nested_sections_then_overrides_win(tmp_path):
    recipe = _write(tmp_path, (
        "actor:\n"
        "  lr: 0.01\n"
        "  epochs: 2\n"
        "rollout:\n"
        "  n: 4\n"
        "  temperature: 0.7\n"
        "data:\n"
        "  prompts_per_step: 8\n"
        "trainer:\n"
        "  output_dir: runs/x\n"
    ))
    cfg = load_config(recipe, ["actor.lr=0.5", "rollout.n=2"])
    # overrides beat the recipe
    assert cfg.actor.lr == 0.5
    assert cfg.rollout.n == 2
    # recipe beats the defaults where no override was given
    assert cfg.actor.epochs == 2
    assert cfg.rollout.temperature == 0.7
    assert cfg.data.prompts_per_step == 8
    assert cfg.trainer.output_dir == "runs/x"
    # untouched keys keep their defaults
    assert cfg.actor.weight_decay == Config().actor.weight_decay


def test_later_override_of_the_same_key_wins():
    cfg = load_config(overrides=["rollout.n=2", "rollout.n=4"])
    assert cfg.rollout.n == 4


def test_scientific_notation_override_parses_to_float():
    cfg = load_config(overrides=["actor.lr=1e-4"])
    assert isinstance(cfg.actor.lr, float)
    assert cfg.actor.lr == pytest.approx(1e-4)


def test_scientific_notation_without_dot_in_yaml_parses_to_float(tmp_path):
    # YAML 1.1 (PyYAML) reads `1e-4` as the string "1e-4"; the loader must still give a float.
    cfg = load_config(_write(tmp_path, "actor:\n  lr: 1e-4\n"))
    assert isinstance(cfg.actor.lr, float)
    assert cfg.actor.lr == pytest.approx(1e-4)


def test_int_given_to_a_float_field_becomes_float():
    cfg = load_config(overrides=["actor.kl_coef=1"])
    assert isinstance(cfg.actor.kl_coef, float) and cfg.actor.kl_coef == 1.0


def test_list_field_from_a_single_string():
    cfg = load_config(overrides=["data.train_files=x.jsonl"])
    assert cfg.data.train_files == ["x.jsonl"]


def test_list_field_from_a_yaml_list():
    cfg = load_config(overrides=["data.train_files=[a.jsonl, b.parquet]"])
    assert cfg.data.train_files == ["a.jsonl", "b.parquet"]


def test_optional_list_from_a_single_string():
    cfg = load_config(overrides=["data.val_files=v.jsonl"])
    assert cfg.data.val_files == ["v.jsonl"]


def test_optional_fields_accept_null(tmp_path):
    recipe = _write(tmp_path, "data:\n  val_files: [v.jsonl]\n  system_prompt: be brief\n")
    cfg = load_config(recipe, ["data.val_files=null", "data.system_prompt=null",
                               "data.apply_chat_template=null", "sft.steps=null"])
    assert cfg.data.val_files is None
    assert cfg.data.system_prompt is None
    assert cfg.data.apply_chat_template is None
    assert cfg.sft.steps is None


def test_optional_field_still_checks_the_type_of_a_value():
    with pytest.raises(ConfigError, match="`sft.steps`"):
        load_config(overrides=["sft.steps=many"])


def test_non_optional_field_rejects_null():
    with pytest.raises(ConfigError, match="`actor.lr`"):
        load_config(overrides=["actor.lr=null"])


# ---------------------------------------------------------------- errors that name the key


@pytest.mark.parametrize("override, typo, suggestion", [
    ("actor.lrr=1e-4", "actor.lrr", "actor.lr"),
    ("rollout.temprature=0.5", "rollout.temprature", "rollout.temperature"),
])
def test_unknown_key_names_it_and_suggests_the_closest(override, typo, suggestion):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    message = str(err.value)
    assert f"`{typo}`" in message
    assert f"Did you mean `{suggestion}`?" in message


def test_unknown_key_inside_a_yaml_section_names_the_dotted_key(tmp_path):
    with pytest.raises(ConfigError, match="Unknown config key `actor.lrr`.*`actor.lr`"):
        load_config(_write(tmp_path, "actor:\n  lrr: 0.1\n"))


def test_unknown_section_is_an_error():
    with pytest.raises(ConfigError, match="Unknown config key `nosuchsection.x`"):
        load_config(overrides=["nosuchsection.x=1"])


def test_key_below_a_scalar_is_unknown():
    with pytest.raises(ConfigError, match="Unknown config key `backend.x`"):
        load_config(overrides=["backend.x=1"])


@pytest.mark.parametrize("override, key, expected", [
    ("rollout.n=abc", "rollout.n", "int"),
    ("actor.kl_coef=true", "actor.kl_coef", "float"),  # a bool is not a number here
    ("rollout.n=2.5", "rollout.n", "int"),
    ("data.prompts_per_step=true", "data.prompts_per_step", "int"),
    ("model.path=[a, b]", "model.path", "str"),
    ("data.train_files=3", "data.train_files", "list"),
])
def test_wrong_type_names_the_key_and_the_expected_type(override, key, expected):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    message = str(err.value)
    assert f"`{key}`" in message
    assert f"expects {expected}" in message


def test_wrong_type_in_yaml_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="`rollout.n` expects int"):
        load_config(_write(tmp_path, "rollout:\n  n: eight\n"))


def test_setting_a_section_to_a_scalar_errors():
    with pytest.raises(ConfigError, match="`actor` is a section"):
        load_config(overrides=["actor=3"])


def test_setting_a_section_to_a_scalar_in_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="`rollout` is a section"):
        load_config(_write(tmp_path, "rollout: 8\n"))


def test_override_without_equals_errors():
    with pytest.raises(ConfigError, match="`actor.lr` is not of the form key=value"):
        load_config(overrides=["actor.lr"])


def test_parse_override_splits_on_the_first_equals_and_parses_yaml():
    assert parse_override("data.system_prompt=a=b") == ("data.system_prompt", "a=b")
    assert parse_override(" rollout.n = 4") == ("rollout.n", 4)
    assert parse_override("data.system_prompt=") == ("data.system_prompt", "")


def test_missing_recipe_file_errors(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(str(missing))


def test_recipe_that_is_not_a_mapping_errors(tmp_path):
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))


def test_empty_recipe_gives_the_defaults(tmp_path):
    assert load_config(_write(tmp_path, "")) == load_config()
    assert load_config(_write(tmp_path, ""), ["model.path=/m"]) == load_config(overrides=["model.path=/m"])


# ---------------------------------------------------------------- batch schedule


def test_batch_schedule_arithmetic():
    cfg = load_config(overrides=[
        "data.prompts_per_step=6", "rollout.n=4", "actor.minibatches=3", "actor.epochs=2",
        "data.max_prompt_length=10", "rollout.max_new_tokens=6",
        "actor.max_tokens_per_microbatch=48",
    ])
    s = batch_schedule(cfg)
    assert s.trajectories == 6 * 4 == 24
    assert s.trajectories_per_minibatch == 6 // 3 * 4 == 8
    assert s.optimizer_steps == 3 * 2 == 6
    # one sequence is 10 + 6 = 16 tokens, so 48 // 16 = 3 rows fit a micro-batch: ceil(8 / 3) = 3
    assert s.max_microbatches_per_minibatch == 3
    text = s.describe()
    assert "24 trajectories" in text and "6 optimizer step(s)" in text


def test_minibatches_not_dividing_prompts_errors_with_valid_divisors():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["data.prompts_per_step=12", "actor.minibatches=5"])
    message = str(err.value)
    assert "actor.minibatches=5" in message
    assert "data.prompts_per_step=12" in message
    assert "[1, 2, 3, 4, 6, 12]" in message


def test_token_budget_smaller_than_one_sequence_errors():
    overrides = ["data.max_prompt_length=40", "rollout.max_new_tokens=9"]
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides + ["actor.max_tokens_per_microbatch=48"])
    message = str(err.value)
    assert "actor.max_tokens_per_microbatch=48" in message
    assert "49" in message
    # exactly one sequence fits: accepted
    cfg = load_config(overrides=overrides + ["actor.max_tokens_per_microbatch=49"])
    assert batch_schedule(cfg).max_microbatches_per_minibatch == cfg.data.prompts_per_step * cfg.rollout.n


# ---------------------------------------------------------------- help and validation


def test_help_text_lists_every_key_with_its_help():
    text = help_text()
    fields = _leaf_fields(Config)
    assert len(fields) > 20
    for key, f in fields:
        assert f"  {key} = " in text, key
        assert f.metadata["help"], f"{key} has no help text"
        assert f.metadata["help"] in text, key


@pytest.mark.parametrize("override, fragment", [
    ("backend=slurm", "backend='slurm'"),
    ("placement=spread", "placement='spread'"),
    ("trainer.mode=async", "trainer.mode=async"),
    ("resources.devices_per_node=2", "backend=local runs one rank"),
    ("data.overlong=truncate", "data.overlong='truncate'"),
    ("rollout.temperature=0", "rollout.temperature must be > 0"),
    ("rollout.temperature=-1", "rollout.temperature must be > 0"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5"),
    ("rollout.top_p=0", "rollout.top_p=0"),
    ("rollout.n=0", "rollout.n=0"),
    ("actor.lr=0", "actor.lr must be > 0"),
    ("actor.clip_ratio_c=1", "actor.clip_ratio_c must be > 1"),
    ("actor.kl_coef=-0.1", "actor.kl_coef must be >= 0"),
])
def test_check_config_values_rejects_bad_choices_and_ranges(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert fragment in str(err.value)


def test_check_config_values_accepts_boundary_values():
    cfg = load_config(overrides=["rollout.top_p=1", "data.overlong=error", "actor.kl_coef=0"])
    check_config_values(cfg)  # no error


def test_check_config_values_on_a_mutated_config():
    cfg = Config()
    cfg.rollout.top_p = 1.01
    with pytest.raises(ConfigError, match="top_p"):
        check_config_values(cfg)


@pytest.mark.parametrize("override", ["actor.clip_ratio_low=nan", "actor.grad_clip=nan", "reward.error_score=nan"])
def test_nan_is_not_a_valid_float_value(override):
    with pytest.raises(ConfigError):
        load_config(overrides=[override])


def test_empty_yaml_section_means_its_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("actor:\nrollout:\n  n: 3\n")
    cfg = load_config(str(recipe))
    assert cfg.rollout.n == 3 and cfg.actor.lr == load_config().actor.lr


# ---------------------------------------------------------------- defaults that depend on other keys


def test_async_mode_resolves_rollout_is_in_the_config_itself():
    # It used to be switched on behind the user's back: config.yaml said null and the top_p guard was skipped.
    base = ["backend=ray", "placement=split", "trainer.mode=async"]
    assert load_config(None, base).actor.rollout_is == "token"
    assert "rollout_is: token" in to_yaml(load_config(None, base))
    assert load_config(None, [*base, "rollout.max_staleness=0"]).actor.rollout_is == "off"
    assert load_config(None, [*base, "actor.rollout_is=sequence"]).actor.rollout_is == "sequence"
    assert load_config(None, [*base, "actor.rollout_is=off"]).actor.rollout_is == "off"
    assert load_config().actor.rollout_is == "off"
    with pytest.raises(ConfigError, match="actor.rollout_is='tokn'"):
        load_config(None, ["actor.rollout_is=tokn"])


@pytest.mark.parametrize("override, fragment", [
    ("tinker.session_timeout_s=25", "tinker.session_timeout_s=25 would end live sessions"),
    ("tinker.max_queued_tokens=100", "tinker.max_queued_tokens=100 is below tinker.max_sample_tokens"),
    ("tinker.max_queued_mb=8", "tinker.max_queued_mb=8 is below tinker.max_request_mb=64"),
    ("tinker.body_timeout_s=0", "body_timeout_s"),
])
def test_tinker_limits_that_would_hurt_live_clients_are_refused(override, fragment):
    """A session timeout under three SDK heartbeats (10 s each) frees live clients' models; shared budgets below
    one request's worth would refuse every request: each is one ConfigError at load."""
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert fragment in str(err.value)
    load_config(overrides=["tinker.session_timeout_s=30"])  # three heartbeats exactly: accepted
