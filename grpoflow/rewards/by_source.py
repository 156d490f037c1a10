"""`reward.function=auto` (the default): each row scored by its `data_source`, as verl's `default_compute_score`
picks a scorer, with the built-ins grpoflow has.

    openai/gsm8k                                   gsm8k (verl's strict `#### 42` match, 1 or 0)
    lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500, numina_* (verl: prime_math)
                                                   math (the last \\boxed{} against the reference, equivalence)
    countdown (TinyZero)                           countdown
    reasoning_gym/<task> (data.train_files=reasoning_gym:TASK)   reasoning_gym (the task's own verifier)
    no data_source, or grpoflow's built-in tasks   exact_match (the whole completion against the reference)

Sources verl scores with a scorer grpoflow lacks (math_dapo and aime* with their -1/1 `Answer:` format, code
contests, geometry3k, ...) and sources nobody knows are refused at start by `unscored_sources`, naming them and
the keys that fix it (reward.function, reward.routes), instead of scoring every sample 0.
"""

from __future__ import annotations

from typing import Any, Iterable

from grpoflow.rewards.functions import REWARD_FUNCTIONS, register_reward

VERL_SOURCES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval": "math", "HuggingFaceH4/MATH-500": "math",
    "numina_aops_forum": "math", "numina_synthetic_math": "math", "numina_amc_aime": "math",
    "numina_synthetic_amc": "math", "numina_cn_k12": "math", "numina_olympiads": "math",
    "countdown": "countdown",
}
# grpoflow's own tasks' rows (tasks/), scored by exact_match as before `auto` existed
OWN_SOURCES = ("default", "addition", "chat_addition", "calculator", "guess_number")
PREFIXES = {"reasoning_gym/": "reasoning_gym", "verifiers/": "exact_match"}


def scorer_name(source: Any) -> str | None:
    """The built-in reward that scores rows of `source` (None: no data_source), or None when none does."""
    if source is None or source in OWN_SOURCES:
        return "exact_match"
    source = str(source)
    if source in VERL_SOURCES:
        return VERL_SOURCES[source]
    return next((name for prefix, name in PREFIXES.items() if source.startswith(prefix)), None)


def unscored_sources(rows: Iterable[dict]) -> list[str]:
    """The data sources among `rows` that `auto` has no scorer for, sorted."""
    return sorted({str(s) for s in (row.get("data_source") for row in rows)
                   if s is not None and scorer_name(s) is None})


def auto_scorers(rows: Iterable[dict]) -> str:
    """The start-up line of a `reward.function=auto` run: each data_source among `rows` with the scorer it gets and
    its row count, most rows first; rows without one are `(no data_source)`. Unscored sources are refused before."""
    counts: dict[Any, int] = {}
    for row in rows:
        source = row.get("data_source")
        counts[source] = counts.get(source, 0) + 1
    parts = [f"{'(no data_source)' if s is None else s} -> {scorer_name(s) or 'none'} ({n:,} "
             f"row{'s' if n != 1 else ''})" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))]
    return "reward.function=auto scores by data_source: " + ", ".join(parts)


def unscored_message(sources: list[str]) -> str:
    return (f"reward.function=auto scores each row by its data_source as verl does, but it has no scorer for "
            f"{sources} (it has {sorted(VERL_SOURCES)} and reasoning_gym/*). Set reward.function (a built-in or "
            f"path/to/file.py:function, e.g. a verl compute_score file), or reward.routes={{<source>: <function>}} "
            f"(docs/data-and-rewards.md).")


@register_reward("auto")
def by_data_source(prompt: str, completion: str, **row: Any) -> Any:
    """The row's data_source's scorer (module docstring); a source with none raises, naming it."""
    name = scorer_name(row.get("data_source"))
    if name is None:
        raise ValueError(unscored_message([str(row.get("data_source"))]))
    return REWARD_FUNCTIONS.get(name)(prompt, completion, **row)
