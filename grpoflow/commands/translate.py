"""`grpoflow translate verl run.sh | trl config.yaml`: the grpoflow command for another framework's run.

A verl script is read as verl's launcher reads its arguments: the `key=value` words after
`python3 -m verl.trainer.main_ppo`, with shell line continuations joined, `$VAR`/`${VAR}` expanded from the
environment and `$@` dropped. The translation is grpoflow.foreign's, and the command it prints is checked by
loading it as a config, so what it prints runs. Standard library and PyYAML only: no torch.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from grpoflow.config import ConfigError, load_config
from grpoflow.config.loading import load_yaml
from grpoflow.config.precedence import foreign_defaults
from grpoflow.engines.choice import engine_refusal
from grpoflow.foreign import Translation, translate_trl, translate_verl

_LAUNCHERS = ("verl.trainer.main_ppo", "verl.trainer.main_grpo", "recipe.")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# $NAME, ${NAME} and ${NAME:-default}: what is expanded; any other `$` (a command, arithmetic) is warned about
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expand(word: str, env: dict[str, str], warnings: list[str], where: str) -> str:
    """`word` with its simple variables replaced from `env`; one warning per `$` that is left as it is."""
    def value(m: re.Match) -> str:
        name, default = m.group(1) or m.group(3), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        warnings.append(f"WARNING: {where}: ${name} is not set by a plain name=value line of the script above the "
                        "launch nor in the environment, so it is left as it is: replace it by its value.")
        return m.group(0)

    spans = [m.span() for m in _VARIABLE.finditer(word)]
    for i in (i for i, c in enumerate(word) if c == "$"):
        if not any(a <= i < b for a, b in spans) and word[i:i + 2] != "$@":
            warnings.append(f"WARNING: {where}: `{word[i:i + 12]}...` is computed by the shell (a command or "
                            "arithmetic), so it is left as it is: replace it by its value.")
    return _VARIABLE.sub(value, word)


def verl_script_pairs(text: str, warnings: list[str] | None = None) -> list[tuple[str, Any]]:
    """The key=value arguments of the verl launch in a run script (the first one, if several), with the script's own
    simple `name=value` assignments above it (and then the environment) expanded in them; `warnings` gets a line
    per `$` that could not be expanded."""
    warnings = [] if warnings is None else warnings
    env = dict(os.environ)
    text = re.sub(r"\\\s*\n", " ", text)
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        starts = [i for i, w in enumerate(words) if w.startswith(_LAUNCHERS)]
        if not starts:
            words = words[1:] if words[:1] == ["export"] else words
            if len(words) == 1 and _ASSIGNMENT.match(words[0]):  # name=value, quotes removed
                name, _, raw = words[0].partition("=")
                before = len(warnings)
                value = _expand(raw, env, warnings, f"{name}=")
                if len(warnings) == before:  # a value the shell computes stays unknown
                    env[name] = value
            continue
        pairs = []
        for word in words[starts[0] + 1:]:
            if word.startswith("~"):
                warnings.append(f"WARNING: {word} (Hydra's delete) left out: every grpoflow key has a default.")
            if "=" not in word or word.startswith(("-", "~")):
                continue
            key, _, raw = word.partition("=")
            key = key.lstrip("+")  # Hydra's "add a key" prefixes
            pairs.append((key, _value(_expand(raw, env, warnings, key))))
        return pairs
    raise ConfigError("no verl launch found in the script: expected a line running python3 -m "
                      "verl.trainer.main_ppo key=value ...")


def _value(raw: str) -> Any:
    """A Hydra value as YAML reads it (True, 1e-6, ['console','wandb'])."""
    try:
        return load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def _word(key: str, value: Any, quote: bool = True) -> str:
    if isinstance(value, (list, dict)):
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value)
    return shlex.quote(f"{key}={text}") if quote else f"{key}={text}"


def translate_file(framework: str, path: str) -> tuple[str, list[str]]:
    """(the grpoflow command, the notes on what was converted, decided or left out) for a verl script or a TRL
    YAML. The command is checked by loading it as a config; printed with each note line as a `#` comment
    (`script_text`), it runs as a shell script."""
    text = Path(path).read_text()
    t: Translation
    warnings: list[str] = []
    if framework == "verl":
        t = translate_verl(verl_script_pairs(text, warnings))
    else:
        try:
            data = load_yaml(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}".replace("\n", " ")) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a YAML mapping of GRPOConfig fields.")
        t = translate_trl(data)
    if t.refused:
        raise ConfigError(" ".join(t.refused))
    notes = [t.note(framework), *warnings]
    if t.unknown:
        notes.append(f"WARNING: keys grpoflow does not know (left out): {', '.join(t.unknown)}")
    overrides = [*t.overrides, *foreign_defaults([(framework, t.overrides)], t.defaults, notes)]
    checked: list[str] = []  # the command as loaded: weights need the functions TRL takes in code
    weights = dict(overrides).get("reward.weights")
    if isinstance(weights, list) and "reward.functions" not in dict(overrides):
        checked = [f"reward.functions=[{','.join(['exact_match'] * len(weights))}]"]
        notes.append(f"reward.weights weighs reward.functions in order (TRL's reward_funcs, given in code): add "
                     f"reward.functions=[rewards.py:first,...] with {len(weights)} functions.")
    loaded: list[str] = []
    cfg = load_config(None, [_word(k, v, quote=False) for k, v in overrides] + checked, loaded)
    notes += [line for line in loaded if line.startswith("steps:")]
    refusal = engine_refusal(cfg.rollout.engine, tensor_parallel_size=cfg.rollout.tensor_parallel_size, facts=None)
    if refusal:  # what the config alone refuses (verl's vLLM with tensor parallel 2): said before the first try
        cpu = "" if cfg.rollout.engine == "hf" else (" On a machine without a CUDA GPU: rollout.engine=hf "
                                                      "rollout.tensor_parallel_size=1 (nothing to install).")
        notes.append(f"WARNING: the command is refused as it is: {refusal}{cpu}")
    if cfg.trainer.total_epochs is None:  # the step count won: the command says only what the run does
        overrides = [(k, v) for k, v in overrides if k != "trainer.total_epochs"]
    return "grpoflow train " + " \\\n    ".join(_word(k, v) for k, v in overrides), notes


def script_text(command: str, notes: list[str]) -> str:
    """The translation as a shell script: every line of every note a `#` comment, then the command."""
    comments = [f"# {line}" for note in notes for line in note.splitlines() if line]
    return "\n".join([*comments, command]) + "\n"
