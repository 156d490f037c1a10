"""Built-in multi-turn tasks for the tiny model, with demonstration conversations for the warm start.

- guess_number: find a hidden number in 1..8 from "higher"/"lower" replies (environment
  `guess_number`, reward 1 when found within rollout.multi_turn.max_turns). Demonstrations guess the middle of
  the numbers still possible half of the time and any of them otherwise, so the warm-started model
  often needs more turns than binary search; GRPO is rewarded for finding it within the turn limit.
- calculator: "347*29" -> "10063", with the `calculator` tool. A 4M model cannot multiply, but it can
  copy the expression into a tool call and the result into its answer. Half of the demonstrations
  call the tool, half answer directly (right, but a model that imitates them guesses); GRPO learns
  to call the tool.

Each row's `demo` column is a whole conversation in chat messages (assistant turns included), the
warm start's target (`sft.response_key: demo`); the tool call is rendered by the `hermes` tool format
(data/tool_format.py), the default of rollout.multi_turn.tool_parser.
"""

from __future__ import annotations

import random

from grpoflow.data.tool_format import HERMES, ToolCall

GUESS_HIGH = 8


def guess_number_demo(secret: int, rng: random.Random, high: int = GUESS_HIGH) -> list[dict]:
    """A conversation that finds `secret`: each guess the middle of the numbers still possible (half of the
    time) or any of them."""
    messages = [{"role": "user", "content": f"Guess 1-{high}"}]
    low, top = 1, high
    while True:
        guess = (low + top) // 2 if rng.random() < 0.5 else rng.randint(low, top)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            return messages
        if guess < secret:
            low = guess + 1
            messages.append({"role": "user", "content": "higher"})
        else:
            top = guess - 1
            messages.append({"role": "user", "content": "lower"})


def guess_number_splits(n_train: int = 2000, n_val: int = 64, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows {"prompt", "secret", "high", "data_source", "demo"}; validation cycles through every secret."""
    rng = random.Random(seed)

    def row(secret: int) -> dict:
        return {"prompt": f"Guess 1-{GUESS_HIGH}", "secret": secret, "high": GUESS_HIGH,
                "data_source": "guess_number", "demo": guess_number_demo(secret, rng)}

    train = [row(rng.randint(1, GUESS_HIGH)) for _ in range(n_train)]
    val = [row(1 + i % GUESS_HIGH) for i in range(n_val)]
    return train, val


def calculator_demo(expression: str, answer: str, use_tool: bool) -> list[dict]:
    messages = [{"role": "user", "content": expression}]
    if use_tool:
        call = HERMES.render(ToolCall("calculator", {"expression": expression}))
        messages += [{"role": "assistant", "content": call},
                     {"role": "tool", "name": "calculator", "content": answer}]
    return messages + [{"role": "assistant", "content": answer}]


def calculator_splits(n_train: int = 3000, n_val: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows {"prompt": "347*29", "answer": "10063", "data_source": "calculator", "demo"}: a 3-digit times a
    2-digit number; disjoint splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n_train + n_val:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        expression = f"{a}*{b}"
        if expression in seen:
            continue
        seen.add(expression)
        rows.append({"prompt": expression, "answer": str(a * b), "data_source": "calculator",
                     "demo": calculator_demo(expression, str(a * b), use_tool=rng.random() < 0.5)})
    return rows[:n_train], rows[n_train:]
