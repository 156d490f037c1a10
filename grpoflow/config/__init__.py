"""The one typed configuration of a grpoflow run, in three parts that import one way:

    schema  <-  checks  <-  loading          (moved, precedence, foreign: stdlib only, read by loading; moved
                                              also by run-folder readers)

- `schema.py`: the dataclasses (one per section, a help text per field), `opt`, `ConfigError`. Loads and checks
  nothing.
- `checks.py`: `check_config_values` (every value and combination that needs no model or registry; never changes the
  config), the batch schedule, and the mark a config carries once the start-up check passed
  (`grpoflow.plan.checks.check_config` sets it, once per `grpoflow train`; the controller requires it).
- `loading.py`: the layers (defaults, recipes/builtin.yaml, a YAML recipe or preset, `a.b=c` overrides; verl's
  keys and TRL's fields translated), coercion and unknown-key hints, the resolve step (`resolve_defaults`,
  `resolve_total_steps`), `load_config`, `saved_config`, `to_yaml`, `help_text`.
- `precedence.py`: which of two keys that decide one thing wins across the layers (an explicit step count over
  epochs, as verl and TRL count; the built-in recipe's reward on the user's own data; verl's run folder name), and
  the start-up line that says so.
- `moved.py`: keys that moved (an error naming the new key; a run folder's old config.yaml read under the new
  names).
- `foreign/`: verl's and TRL's knowledge in one room: their keys and fields translated to ours (`verl.py`,
  `trl.py`, `translation.py`; stdlib only, read by loading and checks) and verl's run scripts read as its launcher
  reads them (`verl_script.py`, on loading; `grpoflow translate` uses it).

`from grpoflow.config import X` is the public surface; the names below are it. tests/unit/test_layering.py checks
that the modules import in this direction only.
"""

from grpoflow.config.checks import (Schedule, batch_schedule, check_config_values, is_checked, mark_checked,
                                    require_checked)
from grpoflow.config.loading import (BUILTIN_RECIPE, PRESETS, config_layers, describe_layers, help_text,
                                     load_config, parse_override, preset_names, resolve_defaults, resolve_total_steps,
                                     saved_config, to_yaml)
from grpoflow.config.schema import (ActorConfig, AgentConfig, AlgorithmConfig, Config, ConfigError, CriticConfig,
                                    CurriculumConfig, DataConfig, DistillConfig, FilterGroupsConfig, JudgeConfig,
                                    KLControlConfig, LoRAConfig, ModelConfig, MultiTurnConfig, RayConfig,
                                    ResourcesConfig, RewardConfig, RewardModelConfig, RolloutConfig, SFTConfig,
                                    TeacherConfig, TinkerConfig, TrainerConfig, opt, world_size)

__all__ = [
    "BUILTIN_RECIPE", "PRESETS", "ActorConfig", "AgentConfig", "AlgorithmConfig", "Config", "ConfigError",
    "CriticConfig", "CurriculumConfig", "DataConfig", "DistillConfig", "FilterGroupsConfig", "JudgeConfig",
    "KLControlConfig", "LoRAConfig", "ModelConfig", "MultiTurnConfig", "RayConfig", "ResourcesConfig",
    "RewardConfig", "RewardModelConfig", "RolloutConfig", "SFTConfig", "Schedule", "TeacherConfig", "TinkerConfig",
    "TrainerConfig", "batch_schedule", "check_config_values", "config_layers", "describe_layers", "help_text",
    "is_checked", "load_config", "mark_checked", "opt", "parse_override", "preset_names", "require_checked",
    "resolve_defaults", "resolve_total_steps", "saved_config", "to_yaml", "world_size",
]
