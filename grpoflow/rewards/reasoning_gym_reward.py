"""reasoning-gym's own verifiers as grpoflow's `reasoning_gym` reward (pip install 'grpoflow[reasoning-gym]').

A row built from `data.train_files=reasoning_gym:TASK?...` (tasks/reasoning_gym_tasks.py) carries a column
`reasoning_gym = {"task": name, "options": {size, seed, task options}, "index": i}`. The reward rebuilds that
entry — `reasoning_gym.create_dataset(task, **options)[index]`, a pure function of the options, cached once per
process, so it works in reward worker processes too — and returns `dataset.score_answer(answer, entry)`: the
task's own verifier (1.0 right, 0.0 wrong, some tasks give partial credit such as 0.01 for a well-formed wrong
answer). The answer is the text of the completion's last `<answer>...</answer>` (reasoning-gym's convention),
else the whole completion, stripped.

The package is imported only when a reasoning_gym row is scored or built, never by `import grpoflow`.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from typing import Any

from grpoflow.errors import MissingExtraError, UserError
from grpoflow.rewards.functions import register_reward

EXTRA = "pip install 'grpoflow[reasoning-gym]'"
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def import_reasoning_gym() -> Any:
    """The `reasoning_gym` package, or an ImportError naming the extra that installs it."""
    try:
        import reasoning_gym
    except ImportError:
        raise MissingExtraError(f"reasoning-gym tasks need the reasoning-gym package: {EXTRA}.") from None
    return reasoning_gym


@functools.lru_cache(maxsize=32)
def _dataset(task: str, options_json: str) -> Any:
    return import_reasoning_gym().create_dataset(task, **json.loads(options_json))


def task_dataset(task: str, options: dict) -> Any:
    """`reasoning_gym.create_dataset(task, **options)`, built once per process for each (task, options).
    An unknown task or option is a ValueError saying which and how to list the valid ones."""
    try:
        return _dataset(task, json.dumps(options, sort_keys=True))
    except ValueError as e:
        names = sorted(import_reasoning_gym().factory.DATASETS)
        close = difflib.get_close_matches(task, names, n=3)
        raise UserError(f"reasoning_gym:{task}: {e}; did you mean {close}? All tasks: "
                        "sorted(reasoning_gym.factory.DATASETS).") from None
    except TypeError as e:
        raise UserError(f"reasoning_gym:{task}: {e}; the options are the fields of the task's config class "
                        f"(reasoning_gym.factory.DATASETS[{task!r}][1]).") from None


def entry_of(ref: Any) -> tuple[Any, dict]:
    """(dataset, entry) of a row's `reasoning_gym` column {"task", "options", "index"}."""
    if not isinstance(ref, dict) or not {"task", "options", "index"} <= set(ref):
        raise UserError(f"the row's reasoning_gym column is {str(ref)[:80]!r}; the reasoning_gym reward and "
                        "environment score rows built by data.train_files=[reasoning_gym:TASK?...].")
    dataset = task_dataset(str(ref["task"]), dict(ref["options"]))
    return dataset, dataset[int(ref["index"])]


def answer_text(completion: str) -> str:
    """The text of the last `<answer>...</answer>` of `completion`, else the completion; stripped."""
    tagged = _ANSWER_TAG.findall(completion)
    return (tagged[-1] if tagged else completion).strip()


def score_reasoning_gym(completion: str, ref: Any) -> float:
    """The task's own verifier on the completion's answer."""
    dataset, entry = entry_of(ref)
    return float(dataset.score_answer(answer_text(completion), entry))


@register_reward("reasoning_gym")
def reasoning_gym_reward(prompt: str, completion: str, reasoning_gym: Any = None, **row: Any) -> float:
    """reasoning-gym's `dataset.score_answer(answer, entry)` for a row of `reasoning_gym:TASK` data."""
    return score_reasoning_gym(completion, reasoning_gym)
