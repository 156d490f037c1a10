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
from grpoflow.foreign import Translation, translate_trl, translate_verl

_LAUNCHERS = ("verl.trainer.main_ppo", "verl.trainer.main_grpo", "recipe.")


def verl_script_pairs(text: str) -> list[tuple[str, Any]]:
    """The key=value arguments of the verl launch in a run script (the first one, if several)."""
    text = re.sub(r"\\\s*\n", " ", text)
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        starts = [i for i, w in enumerate(words) if w.startswith(_LAUNCHERS)]
        if not starts:
            continue
        pairs = []
        for word in words[starts[0] + 1:]:
            if "=" not in word or word.startswith("-"):
                continue
            key, _, raw = word.partition("=")
            key = key.lstrip("+")  # Hydra's "add a key" prefix
            pairs.append((key, _value(os.path.expandvars(raw))))
        return pairs
    raise ConfigError("no verl launch found in the script: expected a line running python3 -m "
                      "verl.trainer.main_ppo key=value ...")


def _value(raw: str) -> Any:
    """A Hydra value as YAML reads it (True, 1e-6, ['console','wandb'])."""
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def _word(key: str, value: Any) -> str:
    if isinstance(value, (list, dict)):
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value)
    return shlex.quote(f"{key}={text}")


def translate_file(framework: str, path: str) -> tuple[str, list[str]]:
    """(the grpoflow command, the notes on what was converted or left out) for a verl script or a TRL YAML."""
    text = Path(path).read_text()
    t: Translation
    if framework == "verl":
        t = translate_verl(verl_script_pairs(text))
    else:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a YAML mapping of GRPOConfig fields.")
        t = translate_trl(data)
    notes = [t.note(framework)]
    if t.unknown:
        notes.append(f"WARNING: keys grpoflow does not know (left out): {', '.join(t.unknown)}")
    words = [_word(k, v) for k, v in t.overrides]
    load_config(None, [shlex.split(w)[0] for w in words])  # what it prints loads as a config
    return "grpoflow train " + " ".join(words), notes
