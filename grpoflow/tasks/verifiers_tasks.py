"""verifiers tasksets as a data source: `data.train_files=[verifiers:TASKSET?limit=200&option=value]`.

A verifiers taskset (`verifiers.v1.Taskset`, the data half of a verifiers environment; pip install
'grpoflow[verifiers]' and the taskset's own package) is named by its id, the module that exports it
(`reverse_text`, `my_pkg`, or a built-in one under `verifiers.v1.tasksets`). The query string sets `limit` (the
first N tasks; required for an infinite taskset) and any field of the taskset's config class (`num_tasks=100`,
`task.tolerance=0.5`: a dotted key is a nested field), read as YAML scalars. Each task is one row:

    {"prompt": [system?, user] (the task's prompt as chat messages), "data_source": "verifiers/<taskset>",
     "task": "<taskset>/<i>" (names the task in train_samples.jsonl and grpoflow view),
     "verifiers": {"taskset": {"id": ..., **options}, "limit": N, "index": i}}

`rollout.agent.program=verifiers` (trajectories/verifiers_agent.py) rebuilds the task from the `verifiers` column and
plays it; the prompt column is what grpoflow's length filter and an episode that never called the model see.
"""

from __future__ import annotations

import functools
import json
from typing import Any
from urllib.parse import parse_qsl

import yaml

from grpoflow.errors import MissingExtraError, UserError

PREFIX = "verifiers:"
EXTRA = "pip install 'grpoflow[verifiers]'"


def import_verifiers() -> Any:
    """`verifiers.v1`, or an ImportError naming the extra that installs it."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise MissingExtraError(f"verifiers environments need the verifiers package: {EXTRA}.") from None
    return vf


def is_verifiers(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def parse_spec(spec: str) -> tuple[dict[str, Any], int | None]:
    """`verifiers:my_set?limit=8&task.tolerance=0.5` -> ({"id": "my_set", "task": {"tolerance": 0.5}}, 8)."""
    body = spec.removeprefix(PREFIX)
    ident, _, query = body.partition("?")
    if not ident:
        raise UserError(f"data file {spec!r} names no taskset; write verifiers:TASKSET[?limit=N&option=value].")
    taskset: dict[str, Any] = {"id": ident}
    limit = None
    try:
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
            parsed = yaml.safe_load(value) if value else None
            if key == "limit":
                limit = int(str(parsed))
                continue
            *path, last = key.split(".")
            node = taskset
            for part in path:
                node = node.setdefault(part, {})
            node[last] = parsed
    except (ValueError, TypeError, AttributeError, yaml.YAMLError) as e:
        raise UserError(f"data file {spec!r}: its options {query!r} are not key=value pairs joined by & ({e}); "
                        "write e.g. verifiers:my_set?limit=200&num_tasks=500.") from None
    return taskset, limit


@functools.lru_cache(maxsize=16)
def _tasks(key: str) -> list[Any]:
    vf = import_verifiers()
    spec = json.loads(key)
    config = vf.resolve_env_config({"taskset": spec["taskset"]})
    taskset = vf.load_taskset(config.taskset)
    if spec["limit"] is not None:
        taskset = taskset.take(spec["limit"])
    elif not taskset.bounded:
        raise UserError(f"the verifiers taskset {spec['taskset']['id']!r} is infinite; bound it with "
                        f"verifiers:{spec['taskset']['id']}?limit=N.")
    return list(taskset)


def tasks_of(taskset: dict[str, Any], limit: int | None) -> list[Any]:
    """The taskset's tasks (built once per process for the same taskset config and limit)."""
    return _tasks(json.dumps({"taskset": taskset, "limit": limit}, sort_keys=True))


def task_of(column: dict[str, Any]) -> Any:
    """The task a row's `verifiers` column names."""
    return tasks_of(column["taskset"], column["limit"])[column["index"]]


def opening_messages(data: Any) -> list[dict]:
    """A task's prompt (and system prompt) as chat messages with text content."""
    prompt = data.prompt
    if prompt is None:
        messages = []
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [m.model_dump(mode="json", exclude_none=True) for m in prompt]
    if data.system_prompt:
        messages = [{"role": "system", "content": data.system_prompt}] + messages
    return messages or [{"role": "user", "content": ""}]


def verifiers_rows(spec: str) -> list[dict]:
    """The rows of a `verifiers:TASKSET?...` spec (module docstring)."""
    taskset, limit = parse_spec(spec)
    return [{"prompt": opening_messages(task.data), "data_source": f"verifiers/{taskset['id']}",
             "task": f"{taskset['id']}/{index}", "verifiers": {"taskset": taskset, "limit": limit, "index": index}}
            for index, task in enumerate(tasks_of(taskset, limit))]
