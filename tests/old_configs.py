"""What an older grpoflow wrote in a run folder's config.yaml: the multi-turn, agent and partial-rollout settings as
flat rollout.* keys, before they moved into the sections rollout.multi_turn, rollout.agent and rollout.partial
(grpoflow/config/moved.py).
Written out by hand, not derived from config.moved.MOVED, so the tests that use it check the mapping."""

import copy


NEWER_THAN_THE_MOVE = ("env_timeout_s",)


def old_flat(tree: dict) -> dict:
    """`tree` (a resolved config as config.yaml holds it) with the flat keys an older grpoflow wrote."""
    old = copy.deepcopy(tree)
    rollout = old["rollout"]
    section = rollout.pop("multi_turn")
    for key in NEWER_THAN_THE_MOVE:  # keys born in the section: an older grpoflow never wrote them
        section.pop(key, None)
    rollout.update(section)  # env, env_args, tools, max_turns, tool_parser, tool_* ...
    agent = rollout.pop("agent")
    rollout.update(agent=agent["program"], agent_args=agent["args"], agent_timeout_s=agent["timeout_s"],
                   agent_model=agent["model"])
    partial = rollout.pop("partial")
    rollout.update(partial=partial["enable"], partial_oversample=partial["oversample"],
                   partial_max_staleness=partial["max_staleness"])
    return old
