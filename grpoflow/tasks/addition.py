"""The built-in task: n-digit addition, prompt ``"37+48="`` and answer ``"85"``.

Small enough for a 4M-parameter char model to learn on a CPU in minutes, and checkable
exactly, so it is the default task for tests, examples and benchmarks. Rows follow the TRL
convention (``prompt`` a string) plus ``answer`` (passed to reward functions as a keyword
argument) and ``data_source``.
"""

from __future__ import annotations

import random

DATA_SOURCE = "addition"


def make_addition_rows(
    n: int, seed: int, digits: int = 2, exclude: set[str] | None = None
) -> list[dict]:
    """Return ``n`` distinct rows ``{"prompt": "a+b=", "answer": str(a+b), "data_source": "addition"}``.

    Operands are uniform in ``[0, 10**digits - 1]``; the same ``seed`` gives the same rows.
    Prompts in ``exclude`` are skipped (used to keep validation disjoint from training).
    """
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    high = 10**digits - 1
    exclude = exclude or set()
    available = (high + 1) ** 2 - len(exclude)
    if n > available:
        raise ValueError(
            f"asked for {n} distinct {digits}-digit addition prompts but at most {available} "
            f"exist outside `exclude`; lower n or raise digits."
        )
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n:
        a, b = rng.randint(0, high), rng.randint(0, high)
        prompt = f"{a}+{b}="
        if prompt in seen or prompt in exclude:
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "answer": str(a + b), "data_source": DATA_SOURCE})
    return rows


def addition_splits(n_train: int = 5000, n_val: int = 500, seed: int = 0, digits: int = 2
                    ) -> tuple[list[dict], list[dict]]:
    """Disjoint ``(train_rows, val_rows)``; the same arguments always give the same rows."""
    train = make_addition_rows(n_train, seed=seed, digits=digits)
    # A different seed stream for validation; `exclude` makes the two sets disjoint.
    val = make_addition_rows(n_val, seed=seed + 1_000_003, digits=digits, exclude={r["prompt"] for r in train})
    return train, val
