"""Countdown (TinyZero): reach `target` with an arithmetic equation that uses each of `nums` once.

The equation is parsed with `ast` and evaluated on exact rationals by a walker that knows only
numbers, + - * / and parentheses, so a completion can never run code or raise a huge power.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from fractions import Fraction
from typing import Any, Callable

from grpoflow.rewards.functions import register_reward

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_EQUATION_CHARS = re.compile(r"[\d+\-*/().\s]+")
_MAX_EQUATION_CHARS = 500  # longer is not a countdown equation; also bounds the parser's recursion
_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY: dict[type, Callable[[Fraction], Fraction]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def countdown_problem(row: dict) -> tuple[Fraction, list[int]] | None:
    """(target, numbers) of a row: `target` + `nums` (or `numbers`) columns, or verl's
    reward_model.ground_truth = {"target": ..., "numbers": [...]} (a dict or its JSON). None if absent."""
    source: Any = row
    rm = row.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        source = rm["ground_truth"]
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except ValueError:
                return None
    if not isinstance(source, dict):
        return None
    target = source.get("target")
    numbers = source.get("nums", source.get("numbers"))
    if target is None or numbers is None:
        return None
    return Fraction(target), [int(n) for n in numbers]


def extract_equation(completion: str) -> str | None:
    """The text of the last <answer>...</answer>; without tags, the last line if it is made only of
    digits, + - * / ( ) . and spaces; else None."""
    found = _ANSWER.findall(completion)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    if lines and _EQUATION_CHARS.fullmatch(lines[-1]) and re.search(r"\d", lines[-1]):
        return lines[-1]
    return None


def evaluate_equation(equation: str, numbers: list[int]) -> Fraction | None:
    """The exact value of `equation` if it is valid (allowed characters only, each of `numbers`
    used exactly once, no division by zero), else None."""
    if len(equation) > _MAX_EQUATION_CHARS or not _EQUATION_CHARS.fullmatch(equation):
        return None
    try:
        tree = ast.parse(equation, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    used: list[int] = []
    try:
        value = _evaluate(tree.body, used)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    return value if sorted(used) == sorted(numbers) else None


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left, used), _evaluate(node.right, used))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, used))
    raise ValueError(f"not allowed in a countdown equation: {ast.dump(node)[:80]}")


@register_reward("countdown")
def countdown_reward(prompt: str, completion: str, format_score: float = 0.1, **row: Any) -> float | None:
    """TinyZero's countdown score: 1.0 if the equation uses each number once and equals the target
    (within 1e-5), `format_score` if an equation was found but is invalid or wrong, 0.0 if none
    was found; None if the row has no target and numbers."""
    problem = countdown_problem(row)
    if problem is None:
        return None
    target, numbers = problem
    equation = extract_equation(completion)
    if equation is None:
        return 0.0
    value = evaluate_equation(equation, numbers)
    if value is None or abs(value - target) >= Fraction(1, 100_000):
        return float(format_score)
    return 1.0
