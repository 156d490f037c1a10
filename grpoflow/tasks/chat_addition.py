"""The built-in task for pretrained chat models: "What is 7 + 5? Answer with just the number." -> 12.

The same arithmetic as `tasks.addition`, asked as a chat message so that it goes through the
tokenizer's chat template. Small operands (0..20): a 135M instruct model (SmolLM2-135M-Instruct)
knows most of these sums but often buries them in rambling that runs past the token budget, so
its greedy answers are right about half of the time and a few minutes of GRPO on a CPU move that
visibly (docs/real-models.md). Scored with `gsm8k_flexible`: the last number of the completion.
"""

from __future__ import annotations

import random

DATA_SOURCE = "chat_addition"
QUESTION = "What is {a} + {b}? Answer with just the number."
MAX_OPERAND = 20


def chat_addition_splits(n_val: int = 100, seed: int = 0, max_operand: int = MAX_OPERAND
                         ) -> tuple[list[dict], list[dict]]:
    """Disjoint ``(train_rows, val_rows)`` over every pair ``a, b`` in ``[0, max_operand]``; ``n_val``
    pairs (seeded shuffle) are held out. Rows: ``{"prompt": [user message], "answer": "12", "data_source"}``."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if not 0 < n_val < len(pairs):
        raise ValueError(f"n_val={n_val} must be between 1 and {len(pairs) - 1} (there are {len(pairs)} pairs).")
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user", "content": QUESTION.format(a=a, b=b)}], "answer": str(a + b),
             "data_source": DATA_SOURCE} for a, b in pairs]
    return rows[n_val:], rows[:n_val]
