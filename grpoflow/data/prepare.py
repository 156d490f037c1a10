"""Turn a local copy of GSM8K, MATH or Countdown into verl-style ``train.parquet`` / ``test.parquet``.

The rows match verl's ``examples/data_preprocess`` scripts (gsm8k.py, math_dataset.py, and
TinyZero's countdown.py), so the files work with verl and with grpoflow alike:

    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": ...}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"split": "train", "index": 0, ...}}

Nothing is downloaded: ``source`` is anything ``load_rows`` reads (jsonl, json, parquet, a
``save_to_disk`` folder, a hub snapshot folder of parquet files). As in verl, which builds the
rows with ``datasets.map``, source columns a converter does not consume are kept (MATH's
``level`` and ``type``, Countdown's ``target`` and ``nums``).

A converter is ``fn(row, index, split) -> dict``; ``DATASETS`` maps each name to one, and
``prepare_dataset`` is the one entry point (``grpoflow data <name>`` calls it).
"""

from __future__ import annotations

import math
import os
import random
import re
from typing import Callable

from grpoflow.data.dataset import load_rows
from grpoflow.errors import UserError
from grpoflow.rewards.math_normalize import last_boxed

Converter = Callable[[dict, int, str], dict]

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
# TinyZero's "qwen-instruct" user turn (its system turn and "<think>" prefill are not chat messages).
COUNTDOWN_TEMPLATE = (
    "Using the numbers {nums}, create an equation that equals {target}.\n"
    "You can use basic arithmetic operations (+, -, *, /) and each number can only be used once. "
    "Show your work in <think> </think> tags.\n"
    "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)

_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")  # verl's extract_solution: the first "#### <number>"


class RowError(UserError):
    """A source row that a converter cannot use; ``prepare_dataset`` adds the file and row number."""


def _column(row: dict, name: str):
    value = row.get(name)
    if value is None:
        raise RowError(f"missing column {name!r} (the row has {sorted(row)})")
    return value


def _rest(row: dict, consumed: tuple[str, ...]) -> dict:
    """The source columns a converter leaves alone (``datasets.map`` keeps them, so verl's files have them)."""
    return {k: v for k, v in row.items() if k not in consumed}


def gsm8k_row(row: dict, index: int, split: str) -> dict:
    """openai/gsm8k (``question``, ``answer`` ending in "#### 42") -> verl's gsm8k.py row."""
    question, answer = str(_column(row, "question")), str(_column(row, "answer"))
    found = _GSM8K_ANSWER.search(answer)
    if found is None:
        raise RowError(f"column 'answer' has no '#### <number>' final answer: {answer[-80:]!r}")
    return {
        **_rest(row, ("question", "answer")),
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": found.group(1).replace(",", "")},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def math_row(row: dict, index: int, split: str) -> dict:
    """MATH / hendrycks (``problem``, ``solution`` with a \\boxed{} answer) -> verl's math_dataset.py row."""
    problem, solution = str(_column(row, "problem")), str(_column(row, "solution"))
    truth = last_boxed(solution)
    if truth is None:
        raise RowError(f"column 'solution' has no closed \\boxed{{...}} answer: {solution[-80:]!r}")
    return {
        **_rest(row, ("problem", "solution")),
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index},
    }


def countdown_row(row: dict, index: int, split: str) -> dict:
    """TinyZero Countdown (``target``, ``nums``) -> its countdown.py row; ``target``/``nums`` stay as columns."""
    target, nums = _column(row, "target"), _column(row, "nums")
    try:
        target, nums = int(target), [int(n) for n in nums]
    except (TypeError, ValueError) as e:
        raise RowError(f"columns 'target' and 'nums' must be an integer and a list of integers ({e})") from e
    return {
        **_rest(row, ()),
        "target": target,
        "nums": nums,
        "data_source": "countdown",
        "prompt": [{"role": "user", "content": COUNTDOWN_TEMPLATE.format(nums=nums, target=target)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": {"target": target, "numbers": nums}},
        "extra_info": {"split": split, "index": index},
    }


DATASETS: dict[str, Converter] = {"gsm8k": gsm8k_row, "math": math_row, "countdown": countdown_row}


# ---------------------------------------------------------------------------------------------


def _read(source: str | os.PathLike | list) -> list[tuple[str, int, dict]]:
    """(file, row number in that file, row) for every row, so errors can name where a row came from."""
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    return [(os.fspath(p), i, row) for p in paths for i, row in enumerate(load_rows(p))]


def _test_count(test_size: int | float, n: int) -> int:
    if isinstance(test_size, bool) or not isinstance(test_size, (int, float)):
        raise UserError(f"test_size={test_size!r}: give a row count (int) or a fraction in (0, 1).")
    if isinstance(test_size, float):
        if not 0.0 < test_size < 1.0:
            raise UserError(f"test_size={test_size!r}: a fraction must be in (0, 1); give an int for a row count.")
        count = math.ceil(test_size * n)  # rounds up, as datasets' train_test_split does
    else:
        count = test_size
    if not 0 < count < n:
        raise UserError(f"test_size={test_size!r} gives {count} test rows of {n}; leave at least one row each.")
    return count


def _split(rows: list, test_size: int | float, seed: int) -> tuple[list, list]:
    """A seeded random ``test_size`` rows for test; both parts keep the source order."""
    count = _test_count(test_size, len(rows))
    test_ids = set(random.Random(seed).sample(range(len(rows)), count))
    return ([r for i, r in enumerate(rows) if i not in test_ids],
            [r for i, r in enumerate(rows) if i in test_ids])


def _convert(convert: Converter, rows: list[tuple[str, int, dict]], split: str) -> list[dict]:
    out = []
    for index, (path, i, row) in enumerate(rows):
        try:
            out.append(convert(row, index, split))
        except RowError as e:
            raise UserError(f"{path}: row {i}: {e}.") from e
    return out


def write_parquet(rows: list[dict], path: str) -> None:
    """Write rows (nested dicts and lists become struct and list columns) atomically with pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = f"{path}.tmp"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def prepare_dataset(
    name: str,
    source: str | os.PathLike | list,
    out_dir: str | os.PathLike,
    *,
    test_source: str | os.PathLike | list | None = None,
    test_size: int | float | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> dict[str, str]:
    """Convert a local copy of dataset ``name`` into ``out_dir/train.parquet`` (and ``test.parquet``).

    The test rows come from ``test_source``, or, with ``test_size`` (a row count or a fraction),
    from a seeded split of ``source``; with neither, only train.parquet is written. ``limit``
    keeps the first ``limit`` rows of each split (after splitting). ``extra_info.index`` counts
    within each split. Returns ``{"train": path, "test": path}`` for the files written.
    """
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; choose one of: {', '.join(sorted(DATASETS))}.")
    if test_source is not None and test_size is not None:
        raise UserError("give test_source or test_size, not both: test_size splits the train source.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"limit={limit!r}: give a positive number of rows per split, or None for all.")

    splits = {"train": _read(source)}
    if test_source is not None:
        splits["test"] = _read(test_source)
    elif test_size is not None:
        splits["train"], splits["test"] = _split(splits["train"], test_size, seed)

    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for split, rows in splits.items():
        rows = rows[:limit] if limit is not None else rows
        if not rows:
            raise UserError(f"the {split} source of {name!r} has no rows; check the path.")
        path = os.path.join(os.fspath(out_dir), f"{split}.parquet")
        write_parquet(_convert(DATASETS[name], rows, split), path)
        written[split] = path
    return written
