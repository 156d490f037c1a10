"""A sandboxed stand-in for the built-in `calculator` (the name the calculator_tool demonstrations call): the
product, then a number drawn from `random` and how many calls this process has served. In the sandbox's fork
server each call runs in a fresh child seeded from the call's bytes, so the same call always returns the same text
(the count is always 1), in an uninterrupted run and in a resumed one; a worker that kept state between calls, or a
seed that depended on anything but the call, would change what the model reads next."""

import random

from grpoflow.trajectories.builtin_tools import calculator as exact

_served = [0]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "(17 + 4) * 3 / 7".
    """
    _served[0] += 1
    return f"{exact(expression)} ~{random.randrange(1000)} #{_served[0]}"
