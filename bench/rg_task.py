"""Reasoning-gym tasks for the learning bench (bench/learning.py), as chat rows both frameworks read.

`reasoning_gym.create_dataset(name, size=, seed=, **options)` draws procedural questions with
their answers; a training split and a held-out split come from two seeds, with held-out questions
that also occur in the training split dropped. Rows are grpoflow's and TRL's common shape:
`{"prompt": [user message], "answer": "...", "data_source": "rg_<name>"}`, written once as a
jsonl file that grpoflow reads as `data.train_files` (TRL gets the same rows as a `Dataset`).

Both frameworks score them with grpoflow's `gsm8k_flexible` (the last number of the completion
equals the answer), not reasoning-gym's `score_answer`, which wants the bare answer string or an
`<answer>` tag that a 135M chat model rarely writes; the options below keep every answer an integer.
"""

from __future__ import annotations

import json
from pathlib import Path

# task label -> (reasoning-gym dataset, its options[, an instruction appended to each question]). The learning study
# (issue 38) uses the four below chain_sum: tasks outside the addition family on which SmolLM2-135M-Instruct's greedy
# held-out accuracy (24 new tokens) is 15-35 %, measured 2026-12-03: letter counting 32 %, GCD 25 %, LCM 16.5 %,
# the next term of a sequence 13 %. Without "Answer with only the number." the model explains until the budget cuts
# it (GCD 1 %, 95 % cut; letter counting 26 %); leg counting, products, simple equations, count bits and count
# primes stayed at 0-7 % with it, so they were not chosen.
ONLY_THE_NUMBER = "Answer with only the number."
RG_TASKS = {"rg_chain_sum": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
            "rg_letter_counting": ("letter_counting", {"min_words": 3, "max_words": 8}, ONLY_THE_NUMBER),
            "rg_gcd": ("gcd", {"min_value": 1, "max_value": 30}, ONLY_THE_NUMBER),
            "rg_lcm": ("lcm", {"min_value": 1, "max_value": 30}, ONLY_THE_NUMBER),
            "rg_number_sequence": ("number_sequence", {"min_terms": 4, "max_terms": 5, "max_complexity": 1,
                                                       "min_value": -20, "max_value": 20}, ONLY_THE_NUMBER)}
STUDY_TASKS = ("rg_letter_counting", "rg_gcd", "rg_lcm", "rg_number_sequence")
TRAIN_SIZE, HELDOUT_SIZE = 1000, 200
# reasoning-gym draws item i from Random(seed + i): seeds 1 and 2 would give the same questions shifted by one, so
# the held-out seed lies far beyond the training items' seeds.
TRAIN_SEED, HELDOUT_SEED = 1, 1_000_003


def rg_splits(task: str) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of a reasoning-gym task: up to HELDOUT_SIZE distinct held-out questions, none of
    them in the training rows."""
    import reasoning_gym
    name, options, *instruction = RG_TASKS[task]
    suffix = "".join(" " + i for i in instruction)

    def rows(size: int, seed: int) -> list[dict]:
        return [{"prompt": [{"role": "user", "content": e["question"] + suffix}], "answer": str(e["answer"]),
                 "data_source": task} for e in reasoning_gym.create_dataset(name, size=size, seed=seed, **options)]

    train = rows(TRAIN_SIZE, TRAIN_SEED)
    seen = {r["prompt"][0]["content"] for r in train}
    held = []  # distinct questions outside the training rows (GCD and LCM of numbers <= 30 repeat within 1,000 draws)
    for r in rows(10 * HELDOUT_SIZE, HELDOUT_SEED):
        if r["prompt"][0]["content"] not in seen and len(held) < HELDOUT_SIZE:
            seen.add(r["prompt"][0]["content"])
            held.append(r)
    return train, held


def rg_train_file(task: str, cache: Path) -> Path:
    """The training rows as jsonl under `cache` (written once), for grpoflow's `data.train_files`."""
    path = cache / f"{task}-train.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rg_splits(task)[0]))
        tmp.rename(path)
    return path
