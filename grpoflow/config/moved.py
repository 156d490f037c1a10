"""Config keys that moved.

The multi-turn, agent and partial-rollout settings were flat `rollout.*` keys until they became the sections
`rollout.multi_turn`, `rollout.agent` and `rollout.partial` (MOVED lists each old key and its new name;
`rollout.agent` and `rollout.partial` are both an old key and a section's name: a mapping, or nothing, is the
section). An old key in a recipe or on the command line must not silently do nothing, so `moved_key_message` names
the new key and `loading._set` raises it. The one exception is a run folder's saved config.yaml written by an older
grpoflow: resuming it must not fail, so `translate_moved` rewrites such a config to the new keys (the caller prints
a warning naming them). Standard library only.

verl's keys under the new sections (`multi_turn.max_assistant_turns`, ...) and what grpoflow has for them are verl's
knowledge: `grpoflow.config.foreign.verl` (`foreign_hint`).
"""

from __future__ import annotations

from typing import Any

MULTI_TURN = ("env", "env_args", "tools", "max_turns", "tool_parser", "max_tool_calls_per_turn",
              "max_tool_output_tokens", "tool_timeout_s", "tool_cpu_time_s", "tool_memory_mb", "tool_workers")
AGENT = {"agent": "program", "agent_args": "args", "agent_timeout_s": "timeout_s", "agent_model": "model"}
PARTIAL = {"partial": "enable", "partial_oversample": "oversample", "partial_max_staleness": "max_staleness"}
MOVED: dict[str, str] = {**{f"rollout.{k}": f"rollout.multi_turn.{k}" for k in MULTI_TURN},
                         **{f"rollout.{k}": f"rollout.agent.{v}" for k, v in AGENT.items()},
                         **{f"rollout.{k}": f"rollout.partial.{v}" for k, v in PARTIAL.items()}}
# old keys that are now the name of the section they moved into
SECTION_NAMES = ("rollout.agent", "rollout.partial")



def is_moved(key: str, value: Any) -> bool:
    """`key=value` is an old flat key (`rollout.agent` and `rollout.partial` are the new sections when given a
    mapping or nothing)."""
    if key not in MOVED:
        return False
    return not (key in SECTION_NAMES and (value is None or isinstance(value, dict)))


def moved_key_message(key: str, value: Any) -> str | None:
    """The error for an old flat key given in a recipe or an override (None: `key` did not move)."""
    if not is_moved(key, value):
        return None
    new = MOVED[key]
    section = new.split(".")[1]
    return (f"Config key `{key}` moved to `{new}` (the multi-turn, agent and partial-rollout keys are in the sections "
            f"rollout.multi_turn, rollout.agent and rollout.partial): give `{new}=...`, or in YAML "
            f"`{new.split('.')[-1]}:` under `rollout:` `{section}:`.")


def translate_moved(tree: dict) -> list[str]:
    """Rewrite the old flat keys of a saved config (a nested dict, as config.yaml holds it) to their sections, in
    place; a key already in its section wins. Returns `old -> new` for each key moved."""
    rollout = tree.get("rollout")
    if not isinstance(rollout, dict):
        return []
    # a saved `agent: null` is the old key (no program), not an empty section; `partial: false` the old switch
    found = [(old, rollout.pop(name)) for old, name in ((o, o.split(".")[1]) for o in MOVED)
             if name in rollout and not (old in SECTION_NAMES and isinstance(rollout[name], dict))]
    for old, value in found:
        _, section, leaf = MOVED[old].split(".")
        if not isinstance(rollout.get(section), dict):
            rollout[section] = {}
        rollout[section].setdefault(leaf, value)
    return [f"{old} -> {MOVED[old]}" for old, _ in found]
