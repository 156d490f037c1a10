"""The `key=value` arguments of a verl run script, read as verl's launcher reads them: the words after
`python3 -m verl.trainer.main_ppo`, with shell line continuations joined, `$VAR`/`${VAR}` expanded from the script's
own assignments and the environment, `$@` dropped, and Hydra's `+key=value` read as `key=value`. Standard library
and PyYAML, on `loading` (values read as YAML, as the config reads them).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

import yaml

from grpoflow.config.loading import load_yaml
from grpoflow.config.schema import ConfigError

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
