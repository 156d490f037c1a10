"""Shaping rewards that look at the form of a completion, not its answer: format and length.

Usually combined with an answer reward, e.g. `build_reward(["gsm8k", "format"], weights=[1.0, 0.1])`.
"""

from __future__ import annotations

import re
from typing import Any

from grpoflow.errors import UserError
from grpoflow.rewards.functions import register_reward

DEFAULT_FORMAT = r"^<think>.*?</think>\s*<answer>.*?</answer>$"


@register_reward("format")
def format_reward(prompt: str, completion: str, pattern: str = DEFAULT_FORMAT, **row: Any) -> float:
    """1.0 if the completion, stripped of surrounding whitespace, matches `pattern` from its start
    (`re.match`, DOTALL so "." spans lines), else 0.0. `pattern` may come from a row column; the
    default asks for "<think>...</think> <answer>...</answer>" and nothing else."""
    return float(re.match(pattern, completion.strip(), re.DOTALL) is not None)


@register_reward("length_penalty")
def length_penalty_reward(prompt: str, completion: str, max_chars: int = 1000, **row: Any) -> float:
    """-(characters over `max_chars`) / `max_chars`: 0.0 up to `max_chars` characters, -1.0 at twice that.

    The unit is characters of the decoded completion, not tokens; for a penalty in tokens against
    rollout.max_new_tokens use DAPO's overlong shaping (reward.overlong_buffer_len) instead.
    `max_chars` may come from a row column.
    """
    if not max_chars or max_chars <= 0:
        raise UserError(f"length_penalty: max_chars={max_chars!r} must be a positive number of characters.")
    return -max(0, len(completion) - max_chars) / max_chars
