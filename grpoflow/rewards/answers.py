"""Answer-match rewards: GSM8K (`#### 42`, verl's scoring) and MATH (`\\boxed{...}`, equivalence).

Each reads the reference answer with `ground_truth_of(row)`. A reference that is a whole worked
solution (GSM8K's `answer` column ends in `#### 72`, MATH's `solution` holds a `\\boxed{}`) is
reduced to its final answer the same way as the completion.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from grpoflow.rewards.functions import ground_truth_of, register_reward
from grpoflow.rewards.math_normalize import last_boxed, math_equal

# verl clips the completion to its last 300 characters before searching (the answer is at the
# end); kept so that scores match verl's.
_CLIP_CHARS = 300
_STRICT = re.compile(r"#### \$?(-?[0-9][0-9.,]*)")
_FLEXIBLE = re.compile(r"-?[0-9][0-9.,]*")


def extract_gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """The final number of a GSM8K-style answer, without commas, "$" and a trailing ".".

    strict: the number after the last "#### " (what the GSM8K solutions end with; verl's default).
    flexible: the last number anywhere in the text.
    None if there is none.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method={method!r}: use 'strict' (after '#### ') or 'flexible' (last number).")
    text = text[-_CLIP_CHARS:]
    found = (_STRICT if method == "strict" else _FLEXIBLE).findall(text)
    if not found:
        return None
    answer = found[-1].replace(",", "").replace("$", "").rstrip(".")
    return answer or None


def _gsm8k_truth(row: dict) -> str | None:
    truth = ground_truth_of(row)
    if truth is None:
        return None
    if "####" in truth:  # a full GSM8K solution: take its final answer
        return extract_gsm8k_answer(truth, "strict")
    return truth.strip().replace(",", "").replace("$", "").rstrip(".")


def _same_number(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return False


def _gsm8k_score(completion: str, row: dict, method: str, format_score: float) -> float | None:
    truth = _gsm8k_truth(row)
    if truth is None:
        return None
    answer = extract_gsm8k_answer(completion, method)
    if answer is None:
        return 0.0
    return 1.0 if _same_number(answer, truth) else float(format_score)


@register_reward("gsm8k")
def gsm8k_reward(prompt: str, completion: str, format_score: float = 0.0, **row: Any) -> float | None:
    """verl's GSM8K score: 1.0 if the number after the last "#### " equals the reference,
    `format_score` if there is such a number but it is wrong, 0.0 if there is none; None without
    a reference. Numbers compare exactly as rationals ("72.0" == "72"), a superset of verl's
    string match.
    """
    return _gsm8k_score(completion, row, "strict", format_score)


@register_reward("gsm8k_flexible")
def gsm8k_flexible_reward(prompt: str, completion: str, format_score: float = 0.0, **row: Any) -> float | None:
    """As `gsm8k`, but the answer is the last number anywhere in the completion (no "#### " needed)."""
    return _gsm8k_score(completion, row, "flexible", format_score)


@register_reward("math")
def math_reward(prompt: str, completion: str, format_score: float = 0.0, **row: Any) -> float | None:
    """1.0 if the last `\\boxed{...}` of the completion equals the reference (`math_equal`),
    `format_score` if there is a box but the answer differs, 0.0 without a box; None without a
    reference.
    """
    truth = ground_truth_of(row)
    if truth is None:
        return None
    truth = last_boxed(truth) or truth
    answer = last_boxed(completion)
    if answer is None:
        return 0.0
    return 1.0 if math_equal(answer, truth) else float(format_score)
