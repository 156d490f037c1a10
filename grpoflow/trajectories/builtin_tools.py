"""The built-in tools, as plain typed functions: `calculator` and `python` (tools.py registers them).

`calculator` evaluates arithmetic by walking the `ast` of the expression, never with `eval`:
numbers, + - * / // % **, unary + and -, parentheses. Exponents and results are bounded, so a
model cannot make it compute `9**9**9` and stall a step; a refused or invalid expression raises
ValueError with a message meant for the model (the tool runner sends it back as the tool message).

`python` runs arbitrary code and returns what it printed: it must run sandboxed (a worker process
with CPU, memory and output limits; tool_runner.py), which is how tools.py registers it. In a
sandboxed worker it captures fds 1 and 2 themselves, so `os.write(1, ...)` and subprocess-level
writes are output too; elsewhere (a trusted thread) only sys.stdout/sys.stderr.
"""

from __future__ import annotations

import ast
import contextlib
import io
import math
import operator
import sys
import traceback
from typing import Callable, TextIO

from grpoflow.sandbox import captured_output, in_sandbox

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 1000      # |b| in a ** b
MAX_RESULT_DIGITS = 100  # decimal digits of an integer, for the result and every intermediate value
_INT_LIMIT = 10**MAX_RESULT_DIGITS

_BINARY: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = "numbers, + - * / // % **, and parentheses"
MAX_CAPTURE_BYTES = 4 * 2**20  # what `python` keeps of a program's output; more is an error


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "(17 + 4) * 3 / 7".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_CHARS}.")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"cannot parse {expression!r} ({e.msg}); the calculator takes {_ALLOWED}.") from None
    except (RecursionError, MemoryError):
        raise ValueError("the expression is nested too deeply.") from None
    return str(_evaluate(tree.body))


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero.") from None
        except OverflowError:
            raise ValueError("the result is too large for a floating-point number.") from None
    raise ValueError(f"unsupported syntax {ast.unparse(node)!r}; the calculator takes {_ALLOWED}.")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a ** b when |b| is over MAX_EXPONENT or the integer result would be over MAX_RESULT_DIGITS."""
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"the exponent {exponent} is too large (the limit is {MAX_EXPONENT}).")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        digits = exponent * math.log10(abs(base))
        if digits > MAX_RESULT_DIGITS:
            raise ValueError(f"{base} ** {exponent} has about {digits:.0f} digits; the limit is {MAX_RESULT_DIGITS}.")
    if base == 0 and exponent < 0:
        raise ValueError("division by zero (0 raised to a negative power).")


def _checked(value: object) -> int | float:
    """`value` if it is a finite real number of at most MAX_RESULT_DIGITS digits; ValueError otherwise."""
    if isinstance(value, complex):
        raise ValueError("the result is a complex number (a negative number raised to a fractional power).")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number.")
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits.")
    assert isinstance(value, (int, float))
    return value


def python(code: str) -> str:
    """Run Python code and return what it printed; the value of a last bare expression is printed too.

    Args:
        code: A Python program. Use print() to show results; an exception's traceback is returned as output.
    """
    if in_sandbox():
        with captured_output(MAX_CAPTURE_BYTES) as captured:
            _run_printing_errors(code, sys.stdout)
        if getattr(captured, "truncated", False):
            raise ValueError(f"the program printed more than {MAX_CAPTURE_BYTES} bytes; print less.")
        return captured.getvalue()
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        _run_printing_errors(code, output)
    return output.getvalue()


def _run_printing_errors(code: str, output: TextIO) -> None:
    """Run `code`; its own error becomes a traceback in `output`, from the program's first frame on."""
    try:
        _run(code)
    except MemoryError:
        raise  # the worker's memory limit: the runner reports it and replaces the worker
    except BaseException as e:  # the program's own error (SystemExit too) is its output, as in a terminal
        stack = traceback.extract_tb(e.__traceback__)
        first = next((i for i, f in enumerate(stack) if f.filename == "<code>"), len(stack))
        frames = stack[first:]  # from the program's first line on: not _run's frame nor ast.parse's
        output.write("Traceback (most recent call last):\n" if frames else "")
        output.write("".join(traceback.format_list(frames)))
        output.write("".join(traceback.format_exception_only(type(e), e)))


def _run(code: str) -> None:
    """exec `code` as a fresh `__main__`; a last statement that is an expression has its repr printed."""
    tree = ast.parse(code, "<code>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace: dict = {"__name__": "__main__"}
    exec(compile(tree, "<code>", "exec"), namespace)
    if isinstance(last, ast.Expr):
        value = eval(compile(ast.Expression(last.value), "<code>", "eval"), namespace)
        if value is not None:
            print(repr(value))
