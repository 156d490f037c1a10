"""Loading a grpoflow config from its layers, later ones winning:

1. the defaults of schema.py, chosen for a pretrained model;
2. `recipes/builtin.yaml`, only when `model.path` is a `builtin:` model (built from scratch, or the shipped warm
   start builtin:tiny-4m-addition): the settings of the built-in addition job that `make train` runs (lr 2e-4
   cosine, 8 new tokens, ...);
3. an optional YAML recipe (a path or a preset name; a verl config or a TRL GRPOConfig is translated through
   grpoflow/config/foreign/);
4. `a.b=c` overrides from the command line (verl's keys translated too).

`config_layers` names the files applied and `grpoflow config` prints them above the resolved config. Unknown keys
and wrong types are errors that name the key and suggest the closest valid one; every bad key among the layers is
reported at once. A key that moved (moved.py) is an error naming its new name, except in a run folder's saved
config.yaml (`saved_config`), which is read under the new names.

Then, once, the resolve step (`resolve_defaults`): the keys whose default depends on other keys get their value,
so the resolved config (config.yaml, `grpoflow config`) says what the run does; then checks.check_config_values. So
`load_config` returns a resolved, checked config, and nothing later rewrites what the user set.
`trainer.total_epochs` is resolved later, by `resolve_total_steps`, once the training prompts are counted.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from grpoflow.config.checks import check_config_values, keep_checked
from grpoflow.config.foreign.translation import Translation
from grpoflow.config.foreign.trl import is_trl_field, looks_like_trl, translate_trl
from grpoflow.config.foreign.verl import VERL_SECTIONS, foreign_hint, is_verl_key, looks_like_verl, translate_verl
from grpoflow.config.moved import moved_key_message, translate_moved
from grpoflow.config.precedence import Layer, builtin_reward, foreign_defaults, steps_or_epochs
from grpoflow.config.schema import Config, ConfigError


def _all_keys(cls: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        sub = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(sub):
            keys += _all_keys(sub, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


def _closest(key: str) -> str | None:
    """A valid key close to `key` in the same section (verl's prefixes read as ours), or None: a hint must never
    point at an unrelated key."""
    for verl, ours in VERL_SECTIONS.items():
        if key.startswith(verl):
            key = ours + key[len(verl):]
    section, _, leaf = key.rpartition(".")
    same = {k.rpartition(".")[2]: k for k in _all_keys(Config) if k.rpartition(".")[0] == section}
    close = difflib.get_close_matches(leaf, list(same), n=1, cutoff=0.75)
    return same[close[0]] if close else None


def _unknown_key(key: str) -> ConfigError:
    close = _closest(key)
    hint = foreign_hint(key) or (f" Did you mean `{close}`?" if close else
                                 " Run `grpoflow train --help` for the valid keys (docs/migrating.md maps verl's "
                                 "and TRL's).")
    return ConfigError(f"Unknown config key `{key}`.{hint}")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check/convert a YAML value to the field's annotated type, or raise naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for arg in args[1:]:  # Union[str, list]: a value that fits a later type as it is keeps that type
            if isinstance(value, typing.get_origin(arg) or arg):
                return _coerce(key, value, arg)
        return _coerce(key, value, args[0])
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str) and _looks_numeric(value):
            value = float(value)  # YAML 1.1 reads `1e-4` (no dot) as a string
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"Config key `{key}` must be a finite number, got {value!r}.")
            return float(value)
    elif tp is str:
        if isinstance(value, bool):  # YAML 1.1 reads off/no/false (on/yes/true) as booleans
            return "on" if value else "off"
        if isinstance(value, (str, int, float)):
            return str(value)
    elif tp is list or origin is list:
        if isinstance(value, str):
            return [value]
        if isinstance(value, (list, tuple)):
            return list(value)
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    else:  # pragma: no cover - schema uses only the types above
        return value
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"Config key `{key}` expects {name}, got {value!r} ({type(value).__name__}).")


def _set(cfg: Any, key: str, value: Any) -> None:
    moved = moved_key_message(key, value)
    if moved:
        raise ConfigError(moved)
    *parents, leaf = key.split(".")
    node = cfg
    for p in parents:
        if not dataclasses.is_dataclass(node) or p not in {f.name for f in dataclasses.fields(node)}:
            raise _unknown_key(key)
        node = getattr(node, p)
    hints = typing.get_type_hints(type(node)) if dataclasses.is_dataclass(node) else {}
    if leaf not in hints:
        raise _unknown_key(key)
    if dataclasses.is_dataclass(hints[leaf]):
        value = {} if value is None else value  # an empty YAML section
        if not isinstance(value, dict):
            raise ConfigError(f"Config key `{key}` is a section; give its fields, e.g. `{key}.<field>=...`.")
        for k, v in value.items():
            _set(cfg, f"{key}.{k}", v)
        return
    setattr(node, leaf, _coerce(key, value, hints[leaf]))


class NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (`*name`): a YAML anchor bomb (a few lines whose aliases expand to
    billions of nodes when the config is printed or saved) is refused as it is read, before anything else sees it.
    A recipe writes repeated values out."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"an alias (*{event.anchor}): grpoflow configs take no YAML "
                                              f"aliases; write the value out", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """`text` as YAML data, aliases refused (NoAliasLoader); raises yaml.YAMLError."""
    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506  (a safe loader)


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", yaml-parsed c)."""
    if "=" not in text:
        raise ConfigError(f"Override `{text}` is not of the form key=value (e.g. actor.lr=1e-4).")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"Override `{text}`: its value is not valid YAML ({_yaml_problem(e)}); quote it, e.g. "
                          f"{key.strip()}='{raw}'.") from None
    return key.strip(), value


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line of a YAML error: what and where (line and column, counted from 1)."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(error, 'problem', None) or type(error).__name__}{where}"


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


PRESETS = Path(__file__).parent.parent / "recipes"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


BUILTIN_RECIPE = PRESETS / "builtin.yaml"


def _recipe_path(recipe: str) -> Path:
    path = Path(recipe) if recipe.endswith((".yaml", ".yml")) else PRESETS / f"{recipe}.yaml"
    if not path.exists():
        raise ConfigError(f"Recipe {recipe} does not exist; pass a .yaml path, a preset name "
                          f"({', '.join(preset_names())}) or only key=value overrides.")
    return path


def _read_recipe(path: Path) -> dict:
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"Recipe {path} is not valid YAML: {_yaml_problem(e)}; fix the file.") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"Recipe {path} is not UTF-8 text ({e.reason} at byte {e.start}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Recipe {path} must be a YAML mapping of sections (model:, data:, ...).")
    return data


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """A verl-style nested config as dotted key=value pairs."""
    pairs: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            pairs += _flat(value, f"{prefix}{key}.")
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs


def _recipe_pairs(path: Path, notes: list[str], defaults: list) -> list[tuple[str, Any]]:
    """A recipe's key=value pairs in grpoflow's names: a TRL GRPOConfig (flat fields) or a verl config (verl's
    sections) is translated (grpoflow.config.foreign)."""
    data = _read_recipe(path)
    if looks_like_trl(data):
        t = translate_trl(data)
        _refused(t)
        _foreign_unknown(t, "TRL GRPOConfig field", path)
        notes.append(t.note("TRL"))
        return t.overrides
    if looks_like_verl(data):
        return _with_foreign(_flat(data), notes, defaults)
    return list(data.items())


def _foreign_unknown(t: Translation, kind: str, where: Any) -> None:
    if t.unknown:
        raise ConfigError(f"{len(t.unknown)} {kind}(s) in {where} that grpoflow does not know: "
                          f"{', '.join(t.unknown)} (docs/migrating.md lists the ones it maps).")


def _refused(t: Translation) -> None:
    if t.refused:
        raise ConfigError(t.refused[0] if len(t.refused) == 1 else
                          f"{len(t.refused)} problems in the config:\n" + "\n".join(f"  - {p}" for p in t.refused))


def _with_foreign(pairs: list[tuple[str, Any]], notes: list[str], defaults: list) -> list[tuple[str, Any]]:
    """`pairs` with verl's keys and TRL's field names translated (they come first, so that our own keys given beside
    them win); the translations' derived defaults are added to `defaults`."""
    verl = [(k, v) for k, v in pairs if is_verl_key(k)]
    trl = {k: v for k, v in pairs if is_trl_field(k)}
    if not verl and not trl:
        return pairs
    ours = [(k, v) for k, v in pairs if not is_verl_key(k) and not is_trl_field(k)]
    translated = []
    for framework, t in (("verl", translate_verl(verl, dict(ours)) if verl else None),
                         ("TRL", translate_trl(trl) if trl else None)):
        if t is not None:
            _refused(t)
            notes.append(t.note(framework))
            defaults += t.defaults
            translated += [*t.overrides, *((k, None) for k in t.unknown)]
    return [*translated, *ours]


def parse_command_line(texts: list[str], problems: list[str]) -> list[tuple[str, Any]]:
    """`key=value` words as pairs; Hydra's `+key=value` (add) and `++key=value` (add or override) are read as
    `key=value` (every key exists here), `~key` (delete) is answered with a sentence in `problems`, as are words
    that are not key=value."""
    pairs = []
    for text in texts:
        if text.startswith("~"):
            key = text[1:].partition("=")[0]
            problems.append(f"`{text}` deletes a key in Hydra; every grpoflow key has a default instead: leave "
                            f"`{key}` out (or give `{key}=null` where the key takes null).")
            continue
        try:
            pairs.append(parse_override(text.removeprefix("++").removeprefix("+")))
        except ConfigError as e:
            problems.append(str(e))
    return pairs


def _layer_name(path: Path) -> str:
    return f"grpoflow/recipes/{path.name}" if path.parent == PRESETS else str(path)


def _layered(recipe: str | None, overrides: list[str] | None, base: list[Path],
             notes: list[str] | None = None) -> Config:
    """Every layer applied, then the rules between keys that decide the same thing (precedence.py); every bad key
    or value among them reported at once."""
    notes = [] if notes is None else notes
    cfg, problems = Config(), list[str]()
    defaults: list[tuple[str, Any]] = []  # the foreign keys' derived defaults (precedence.foreign_defaults)
    layers: list[Layer] = [(_layer_name(path), _recipe_pairs(path, notes, defaults))
                           for path in [*base, *([_recipe_path(recipe)] if recipe else [])]]
    given = parse_command_line(overrides or [], problems)
    layers.append(("the command line", _with_foreign(given, notes, defaults)))
    rules = [*steps_or_epochs(layers, notes), *foreign_defaults(layers, defaults, notes),
             *builtin_reward(layers, _layer_name(BUILTIN_RECIPE), Config().reward.function or "auto", notes)]
    for key, value in [*(p for _, pairs in layers for p in pairs), *rules]:
        try:
            _set(cfg, key, value)
        except ConfigError as e:
            problems.append(str(e))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {p}" for p in problems))
    return cfg


def config_layers(recipe: str | None = None, overrides: list[str] | None = None) -> list[Path]:
    """The recipe files under the overrides, in order: `recipes/builtin.yaml` first when the resolved
    `model.path` is a `builtin:` model (the defaults are for pretrained models), then `recipe`."""
    builtin = _layered(recipe, overrides, []).model.path.startswith("builtin:")
    return [*([BUILTIN_RECIPE] if builtin else []), *([_recipe_path(recipe)] if recipe else [])]


def describe_layers(recipe: str | None = None, overrides: list[str] | None = None) -> str:
    """`# layers: ...` lines naming where the values of a resolved config come from."""
    names = ["defaults (grpoflow/config/schema.py)", *(str(p) for p in config_layers(recipe, overrides))]
    if overrides:
        names.append("command line: " + " ".join(overrides))
    return "# config layers, later ones win:\n" + "".join(f"#   {i + 1}. {n}\n" for i, n in enumerate(names))


def load_config(recipe: str | None = None, overrides: list[str] | None = None,
                notes: list[str] | None = None) -> Config:
    """Defaults, then `recipes/builtin.yaml` for a `builtin:` model, then the YAML recipe (a path or a
    preset name), then `a.b=c` overrides (verl's keys and a TRL GRPOConfig recipe translated; `notes` gets the
    lines saying how); resolved (`resolve_defaults`) and checked (`check_config_values`)."""
    layers = config_layers(recipe, overrides)
    cfg = _layered(None, overrides, layers, notes)
    resolve_defaults(cfg)
    check_config_values(cfg)
    return cfg


def saved_config(data: dict) -> Config:
    """The config a run folder's config.yaml holds (parsed), written by this or an older grpoflow: keys that have
    moved since (moved.py) are read under their new names; resolved and checked (`check_config_values`). Changes
    `data`."""
    translate_moved(data)
    cfg = Config()
    for key, value in data.items():
        _set(cfg, key, value)
    resolve_defaults(cfg)
    check_config_values(cfg)
    return cfg


def resolve_defaults(cfg: Config) -> None:
    """The resolve step: set the keys whose default depends on other keys and that the user left unset (None), so
    that the resolved config (config.yaml, `grpoflow config`) says what the run does. A value the user set is kept.
    `load_config` and `saved_config` call it once, before checks.check_config_values (which never changes the config).

    actor.rollout_is: token where samples can be stale (trainer.mode=async with rollout.max_staleness > 0, or
    rollout.partial.enable), else off."""
    if cfg.actor.rollout_is is None:
        stale = (cfg.trainer.mode == "async" and cfg.rollout.max_staleness > 0) or cfg.rollout.partial.enable
        cfg.actor.rollout_is = "token" if stale else "off"


def resolve_total_steps(cfg: Config, prompts: int) -> Config:
    """`trainer.total_epochs` (verl's, TRL's num_train_epochs) resolved once the training prompts are counted:
    trainer.total_steps = total_epochs x ceil(prompts / data.prompts_per_step). A new config (the caller's is left
    as it is), checked if `cfg` was: a step count >= 0 is all the checks ask of it. Unset total_epochs: `cfg`."""
    if cfg.trainer.total_epochs is None:
        return cfg
    steps = cfg.trainer.total_epochs * -(-prompts // cfg.data.prompts_per_step)
    return keep_checked(cfg, dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=steps)))


def help_text() -> str:
    """All keys with their type, default and help, for `--help`."""
    lines = []

    def walk(cls: type, obj: Any, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], value, prefix + f.name + ".")
            else:
                lines.append(f"  {prefix + f.name} = {value!r}\n      {f.metadata.get('help', '')}")

    walk(Config, Config(), "")
    return "\n".join(lines)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
