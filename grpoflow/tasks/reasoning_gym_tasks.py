"""reasoning-gym tasks as a data source: `data.train_files=[reasoning_gym:TASK?size=500&seed=1&min_terms=2]`.

The spec is `reasoning_gym:<task>` with an optional query string of `key=value` pairs joined by `&`: `size`
(rows; default 500) and `seed` (default 0) and any option of the task's config class (`min_terms=2`,
`max_digits=3`, ...). Values are read as YAML scalars (`2` an int, `0.5` a float, `true` a bool, `[1, 3]` a
list). The rows are `reasoning_gym.create_dataset(task, size=, seed=, **options)`'s entries:

    {"prompt": [{"role": "user", "content": question}], "answer": answer, "data_source": "reasoning_gym/<task>",
     "demo": [the question, {"role": "assistant", "content": answer}],
     "reasoning_gym": {"task": task, "options": {"size": ..., "seed": ..., ...}, "index": i}}

`demo` is a warm start's target (`sft.response_key=demo`: the answer as the assistant turn); so the `reasoning_gym`
reward (rewards/reasoning_gym_reward.py) and environment (trajectories/reasoning_gym_env.py) can rebuild the entry and
score with the task's own `score_answer`. Without `data.val_files`, a reasoning_gym training spec is validated on the
same task with `seed + size` and at most 100 rows (`default_val_spec`): reasoning-gym draws entry i from
`Random(seed + i)`, so `seed + 1` would replay the training questions shifted by one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

import yaml

from grpoflow.errors import UserError
from grpoflow.rewards.reasoning_gym_reward import task_dataset

PREFIX = "reasoning_gym:"
DEFAULT_SIZE = 500
VAL_SIZE = 100
MAX_SIZE = 100_000  # rows of one spec: generating is in-process and takes memory (a typo of 10**8 would hang)


def is_reasoning_gym(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`reasoning_gym:chain_sum?size=8&min_terms=2` -> ("chain_sum", {"size": 8, "seed": 0, "min_terms": 2})."""
    body = spec.removeprefix(PREFIX)
    task, _, query = body.partition("?")
    if not task:
        raise UserError(f"data file {spec!r} names no task; write reasoning_gym:TASK[?size=N&seed=S&option=value].")
    options: dict[str, Any] = {"size": DEFAULT_SIZE, "seed": 0}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        for key, value in pairs:
            options[key] = yaml.safe_load(value) if value else None
    except (ValueError, yaml.YAMLError) as e:
        raise UserError(f"data file {spec!r}: its options {query!r} are not key=value pairs joined by & ({e}); "
                        "write e.g. reasoning_gym:chain_sum?size=500&seed=1&min_terms=2.") from None
    size, seed = options["size"], options["seed"]
    if not (type(size) is int and 1 <= size <= MAX_SIZE):
        raise UserError(f"data file {spec!r}: size={size!r}; give a whole number of rows from 1 to {MAX_SIZE}.")
    if type(seed) is not int:
        raise UserError(f"data file {spec!r}: seed={seed!r}; give a whole number.")
    return task, options


def format_spec(task: str, options: dict[str, Any]) -> str:
    return f"{PREFIX}{task}?{urlencode({k: v for k, v in options.items()})}"


def reasoning_gym_rows(spec: str) -> list[dict]:
    """The rows of a `reasoning_gym:TASK?...` spec (module docstring)."""
    task, options = parse_spec(spec)
    try:
        dataset = task_dataset(task, options)
        entries = [dataset[index] for index in range(len(dataset))]
    except UserError:
        raise
    except Exception as e:  # reasoning-gym checks its options with asserts, or fails on them while generating
        raise UserError(f"data file {spec!r}: reasoning-gym refused its options ({type(e).__name__}: "
                        f"{str(e)[:300] or 'no message'}); check them against the task's config class "
                        f"(reasoning_gym.factory.DATASETS[{task!r}][1]).") from None
    rows = []
    for index, entry in enumerate(entries):
        question = [{"role": "user", "content": entry["question"]}]
        rows.append({"prompt": question, "answer": str(entry["answer"]),
                     "demo": question + [{"role": "assistant", "content": str(entry["answer"])}],
                     "data_source": f"reasoning_gym/{task}",
                     "reasoning_gym": {"task": task, "options": dict(options), "index": index}})
    return rows


def default_val_spec(train_spec: str) -> str:
    """The held-out split of a training spec: the same task and options, at most VAL_SIZE rows drawn from the seeds
    after the training entries' (entry i of a reasoning-gym dataset comes from Random(seed + i), so the training rows
    use seeds seed .. seed + size - 1; seed + 1 would give the same questions shifted by one)."""
    task, options = parse_spec(train_spec)
    return format_spec(task, {**options, "seed": int(options["seed"]) + int(options["size"]),
                              "size": min(int(options["size"]), VAL_SIZE)})
