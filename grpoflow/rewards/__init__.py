"""Reward functions and scoring: standard library only, math-verify optional (docs/architecture.md, "The parts and
their layering").

    functions.py   the contract fn(prompt, completion, **row) -> float | dict | None, the registry,
                   ground_truth_of(row), loading `name` or `path/to/file.py:function`
    answers.py     gsm8k, gsm8k_flexible (verl's `#### 42`), math (last \\boxed{} vs the reference)
    math_normalize.py  last_boxed, math_equal: LaTeX answer normalisation (+ math-verify if installed)
    countdown.py   countdown (TinyZero): an equation over given numbers, checked with `ast`
    shaping.py     format (regex), length_penalty (characters over a budget)
    combine.py     CombinedReward (weighted sum), RoutedReward (by data_source), build_reward(spec)
    shapes.py      TRL's batched and verl's compute_score reward functions, detected by signature and run unchanged
    values.py      each call's own deep copy of its row; return values made plain (bools, NumPy, tensors, generators)
    batched.py     RewardCalls (what a reward worker runs); TRL-shaped functions' one call per step, spread to samples
    by_source.py   auto (the default): each row scored by its data_source, as verl's default_compute_score does
    judge.py       LLM-as-judge: prompt template, score parser, the OpenAI-compatible client (bounded
                   concurrency, timeouts, retries), and the `judge` reward that reads its score
    reasoning_gym_reward.py  reasoning_gym: a reasoning-gym task's own verifier (`score_answer`) on rows built
                   by data.train_files=reasoning_gym:TASK (extra `reasoning-gym`, imported when used)
    scoring.py     Scores, RewardScorer (in-process, worker processes with a timeout, or async); the
                   worker processes are grpoflow/user_code.py (a hung call is killed and replaced)

Importing the package registers the built-ins (auto, exact_match, length, gsm8k, gsm8k_flexible, math,
countdown, format, length_penalty, judge, reasoning_gym).
"""

from grpoflow.rewards.functions import (REWARD_FUNCTIONS, RewardFn, exact_match, ground_truth_of, length,
                                        load_reward_function, register_reward)
from grpoflow.rewards.answers import extract_gsm8k_answer, gsm8k_flexible_reward, gsm8k_reward, math_reward
from grpoflow.rewards.countdown import countdown_reward
from grpoflow.rewards.math_normalize import last_boxed, math_equal
from grpoflow.rewards.form import format_reward, length_penalty_reward
from grpoflow.rewards.combine import CombinedReward, RoutedReward, build_reward
from grpoflow.rewards.by_source import by_data_source, unscored_message, unscored_sources  # registers `auto`
from grpoflow.rewards.scoring import RewardScorer, Scores, score_completions
from grpoflow.rewards.judge import judge  # registers the `judge` reward (reward.judge)
from grpoflow.rewards.reasoning_gym_reward import reasoning_gym_reward  # imports reasoning_gym only when scoring

__all__ = [
    "REWARD_FUNCTIONS", "RewardFn", "register_reward", "load_reward_function", "ground_truth_of",
    "exact_match", "length", "gsm8k_reward", "gsm8k_flexible_reward", "math_reward", "countdown_reward",
    "format_reward", "length_penalty_reward", "extract_gsm8k_answer", "last_boxed", "math_equal",
    "CombinedReward", "RoutedReward", "build_reward", "RewardScorer", "Scores", "score_completions",
    "judge", "reasoning_gym_reward", "by_data_source", "unscored_message", "unscored_sources",
]
