"""`grpoflow translate verl run.sh | trl config.yaml`: the grpoflow command for another framework's run.

The command only: reading a verl script (`grpoflow.config.foreign.verl_script`) and translating its keys or a TRL
GRPOConfig's fields (`grpoflow.config.foreign`) are the config's; the command it prints is checked by loading it as
a config, so what it prints runs. Standard library and PyYAML only: no torch.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from grpoflow.config import ConfigError, load_config
from grpoflow.config.foreign.translation import Translation
from grpoflow.config.foreign.trl import translate_trl
from grpoflow.config.foreign.verl import translate_verl
from grpoflow.config.foreign.verl_script import verl_script_pairs
from grpoflow.config.loading import load_yaml
from grpoflow.config.precedence import foreign_defaults
from grpoflow.engines.choice import engine_refusal


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
