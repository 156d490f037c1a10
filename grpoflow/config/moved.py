"""Config keys that moved, and the names other frameworks' users bring.

The multi-turn, agent and partial-rollout settings were flat `rollout.*` keys until they became the sections
`rollout.multi_turn`, `rollout.agent` and `rollout.partial` (MOVED lists each old key and its new name;
`rollout.agent` and `rollout.partial` are both an old key and a section's name: a mapping, or nothing, is the
section). An old key in a recipe or on the command line must not silently do nothing, so `moved_key_message` names
the new key and `loading._set` raises it. The one exception is a run folder's saved config.yaml written by an older
grpoflow: resuming it must not fail, so `translate_moved` rewrites such a config to the new keys (the caller prints
a warning naming them).

`foreign_hint` turns a verl key under the new sections (`multi_turn.max_assistant_turns`, `multi_turn.format`,
...) into ours, for the unknown-key error. Standard library only.
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

# verl's actor_rollout_ref.rollout.multi_turn.* / .agent.* names -> what grpoflow has instead
VERL: dict[str, str] = {
    "rollout.multi_turn.enable": "has no counterpart: multi-turn is on when rollout.multi_turn.env or "
                                 "rollout.multi_turn.tools is set",
    "rollout.multi_turn.max_assistant_turns": "is `rollout.multi_turn.max_turns` here",
    "rollout.multi_turn.max_user_turns": "has no counterpart: the environment answers each model turn, so "
                                         "rollout.multi_turn.max_turns bounds both",
    "rollout.multi_turn.format": "is `rollout.multi_turn.tool_parser` here",
    "rollout.multi_turn.max_parallel_calls": "is `rollout.multi_turn.max_tool_calls_per_turn` here",
    "rollout.multi_turn.max_tool_response_length": "is `rollout.multi_turn.max_tool_output_tokens` here (tokens; a "
                                                   "longer result is replaced by an error message, not cut)",
    "rollout.multi_turn.tool_config_path": "is `rollout.multi_turn.tools` here (a list of tool names or "
                                           "path/to/file.py:function, no YAML file)",
    "rollout.multi_turn.interaction_config_path": "is `rollout.multi_turn.env` (+ `env_args`) here",
    "rollout.agent.agent_loop_config_path": "is `rollout.agent.program` here (one program: path/to/file.py:run or "
                                            "verifiers)",
}


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


def foreign_hint(key: str) -> str | None:
    """What grpoflow has for a verl key under rollout.multi_turn / rollout.agent (None: not a verl key)."""
    ours = VERL.get(key)
    if ours is None:
        return None
    return f" verl's `actor_rollout_ref.{key}` {ours} (docs/multi-turn.md, 'Coming from verl or SkyRL')."
