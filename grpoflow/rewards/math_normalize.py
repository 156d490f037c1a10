"""Math answers: the last `\\boxed{...}` of a text, and whether two answers are equal.

`math_equal` first compares the two answers after a plain LaTeX normalisation (the steps of
Hendrycks et al.'s MATH grader: spacing commands, `\\left`/`\\right`, units in `\\text{}`,
degrees, dollars, `\\frac{a}{b}` -> `a/b`, a leading `x =`), then as exact rationals when both
are numbers (`0.5` == `\\frac12`, but `0.333` != `\\frac13`). When the optional `math-verify`
package is importable (`pip install math-verify`), an answer that the normaliser does not
match is also checked symbolically with it (`\\sqrt{2}/2` == `\\frac{1}{\\sqrt2}`).
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction
from typing import Any

from grpoflow.errors import MissingExtraError

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str | None) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`, stripped.

    Nested braces are balanced: `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. None if there is no
    box, or the last one is never closed.
    """
    if not text:
        return None
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    after = start + len(command)
    i = after
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        close = _matching_brace(text, i)
        return None if close is None else text[i + 1:close].strip()
    if i > after:  # "\boxed 5": the token after the space, up to whitespace or a dollar
        token = re.match(r"[^\s$]+", text[i:])
        return token.group() if token else None
    return None


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the "}" that closes the "{" at `open_index` (escaped `\\{`, `\\}` are skipped)."""
    depth = 0
    for i in range(open_index, len(text)):
        ch = text[i]
        if ch in "{}" and i > 0 and text[i - 1] == "\\":
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def math_equal(pred: str | None, truth: str | None, *, use_math_verify: bool | None = None) -> bool:
    """Whether answer `pred` equals reference `truth` (both without `\\boxed`).

    `use_math_verify`: None uses `math-verify` when it is importable, False never does (the plain
    normaliser only), True requires it.
    """
    if pred is None or truth is None:
        return False
    p, t = normalize_math_answer(str(pred)), normalize_math_answer(str(truth))
    if p and p == t:
        return True
    fp, ft = _as_fraction(p), _as_fraction(t)
    if fp is not None and ft is not None and fp == ft:
        return True
    module = _math_verify() if use_math_verify is not False else None
    if use_math_verify and module is None:
        raise MissingExtraError("math_equal(use_math_verify=True) needs the optional package: pip install math-verify")
    return module is not None and _verify_symbolically(module, str(pred), str(truth))


@functools.lru_cache(maxsize=None)
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


def _verify_symbolically(module: Any, pred: str, truth: str) -> bool:
    # math-verify bounds parsing time with SIGALRM, which only the main thread may set.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = module.parse("\\boxed{" + truth + "}", parsing_timeout=limit)
        answer = module.parse("\\boxed{" + pred + "}", parsing_timeout=limit)
        return bool(gold) and bool(answer) and bool(module.verify(gold, answer, timeout_seconds=limit))
    except Exception:  # math-verify raises on inputs it cannot handle; then the answers are not shown equal
        return False


# ---------------------------------------------------------------- the plain normaliser

_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[!,;:> ]|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_LEADING_VARIABLE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER = r"-?(?:\d+\.?\d*|\.\d+)(?:e-?\d+)?"
_RATIONAL = re.compile(rf"({_NUMBER})(?:/({_NUMBER}))?")
_ATOM = re.compile(r"-?(?:[\w.]+|\\[a-zA-Z]+(?:\{[^{}]*\})*)")


def normalize_math_answer(text: str) -> str:
    """A canonical string for a final answer: `\\left( \\frac{1}{2} \\right)` -> `(1/2)`, `5\\text{ cm}` -> `5`."""
    s = text.strip().replace("\n", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACING.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = _strip_text_groups(s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)  # \sqrt2 -> \sqrt{2}
    s = _frac_to_slash(s)
    if s.count("=") == 1:
        s = _LEADING_VARIABLE.sub("", s)
    s = s.replace(" ", "").rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    letter = re.fullmatch(r"\(([A-Za-z])\)", s)  # multiple choice: (B) -> B
    return letter.group(1) if letter else s


def _strip_text_groups(s: str) -> str:
    """Drop `\\text{...}` groups that are units next to a number; otherwise keep their content."""
    without = _TEXT_GROUP.sub("", s).strip()
    if without and re.search(r"\d", without):
        return without
    return _TEXT_GROUP.sub(r"\1", s)


def _frac_to_slash(s: str) -> str:
    """`\\frac{a}{b}` and `\\frac12` -> `a/b` (parenthesised unless a or b is a single atom)."""
    out, i = [], 0
    while (j := s.find("\\frac", i)) >= 0:
        out.append(s[i:j])
        num, k = _argument(s, j + len("\\frac"))
        den, end = _argument(s, k) if num is not None else (None, k)
        if num is None or den is None:  # malformed: keep the command as written
            out.append("\\frac")
            i = j + len("\\frac")
            continue
        out.append(f"{_wrap(_frac_to_slash(num))}/{_wrap(_frac_to_slash(den))}")
        i = end
    out.append(s[i:])
    return "".join(out)


def _argument(s: str, i: int) -> tuple[str | None, int]:
    """One macro argument at `i`: a `{...}` group or a single character; (None, i) if there is none."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None, i
    if s[i] == "{":
        close = _matching_brace(s, i)
        return (None, i) if close is None else (s[i + 1:close], close + 1)
    return (s[i], i + 1) if s[i].isalnum() else (None, i)


def _wrap(x: str) -> str:
    x = x.strip()
    return x if _ATOM.fullmatch(x) else f"({x})"


def _as_fraction(s: str) -> Fraction | None:
    """`s` as an exact rational if it is a number or `number/number`, else None."""
    m = _RATIONAL.fullmatch(s)
    if m is None:
        return None
    try:
        value = Fraction(m.group(1))
        if m.group(2) is not None:
            value /= Fraction(m.group(2))
    except (ValueError, ZeroDivisionError):
        return None
    return value
