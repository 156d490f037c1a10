"""LLM-as-judge rewards: a model reads the prompt and the completion and replies with a score.

- `render_judge_prompt`: the judge's prompt from a template over `{prompt}`, `{completion}` and the
  row's columns (`{answer}`, `{reward_model[ground_truth]}`, ...).
- `ScoreParser`: the score in the judge's reply: the first number (`number`), a regex's first group
  (`regex:<pattern>`) or a user function (`path/to/file.py:name`, text -> float | None); with
  `max_score`, the reply is divided by it and a value outside [0, max_score] is unparsable.
- `OpenAIJudge`: any OpenAI-compatible `/v1/chat/completions` URL through the `openai` client, at most
  `max_concurrency` calls in flight, each bounded by `timeout_s` and retried `retries` times. Its first failed
  call is a warning naming the URL; after `max_concurrency` calls in a row have failed every attempt, the rest of
  the batch fails at once with the same error (a circuit breaker: a dead judge costs one wave of calls, not the
  whole batch's timeouts). An API key is sent only when `api_key_env` names a variable for it (reward.judge).
- `judge_scores`: replies -> scores; a failed call or an unparsable reply scores `error_score` and is
  counted in `JudgeStats` (logged as reward/judge/*), so a judge never hangs or crashes a step.

The local judge (a model run by grpoflow's own engine, batched) is `workers/judge.py`; both return one
reply text (or None: the call failed) per judged sample. The `judge` reward function (registered here)
reads the score that the controller's judging stage put in the row (`JUDGE_COLUMN`), so the judge
combines with rule rewards by `reward.weights` and routes by `data_source` like any other reward.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from grpoflow.errors import MissingExtraError, UserError
from grpoflow.plugins import is_file_spec, load_from_file
from grpoflow.rewards.functions import register_reward

log = logging.getLogger("grpoflow.judge")
JUDGE_COLUMN = "judge_score"  # the row column that carries a sample's judge score to the `judge` reward
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


class JudgeConfigError(UserError):
    """A judge template or parser that cannot work; the message names it and the fix."""


@register_reward("judge")
def judge(prompt: str, completion: str, **row: Any) -> float:
    """The LLM judge's score of this sample (reward.judge), computed for the whole batch before rule rewards."""
    if row.get(JUDGE_COLUMN) is None:
        raise ValueError("the `judge` reward has no judgement for this sample: configure reward.judge.url (an "
                         "OpenAI-compatible server) or reward.judge.path (a local model).")
    return float(row[JUDGE_COLUMN])


def render_judge_prompt(template: str, prompt: str, completion: str, row: dict) -> str:
    """`template` formatted with the row's columns, `prompt` and `completion`."""
    try:
        return template.format(**{**row, "prompt": prompt, "completion": completion})
    except (KeyError, IndexError, AttributeError) as e:
        raise JudgeConfigError(f"reward.judge.template names {e}, which the row lacks (its columns: {sorted(row)}); "
                               "use {prompt}, {completion} and those columns.") from None


class ScoreParser:
    """reply text -> score or None (unparsable)."""

    def __init__(self, spec: str, max_score: float | None = None) -> None:
        self.spec, self.max_score = spec, max_score
        self._fn: Callable[[str], Any] | None = None
        self._regex: re.Pattern | None = None
        if spec.startswith("regex:"):
            try:
                self._regex = re.compile(spec.removeprefix("regex:"))
            except re.error as e:
                raise JudgeConfigError(f"reward.judge.parser={spec!r} is not a valid regex: {e}.") from None
        elif is_file_spec(spec):
            self._fn = load_from_file(spec)
        elif spec != "number":
            raise JudgeConfigError(f"reward.judge.parser={spec!r}; use number, regex:<pattern> (first group) or "
                                   "path/to/file.py:function (text -> float | None).")

    def __call__(self, text: str) -> float | None:
        value = self._raw(text)
        if value is None or not math.isfinite(value):
            return None
        if self.max_score is None:
            return value
        return value / self.max_score if 0 <= value <= self.max_score else None

    def _raw(self, text: str) -> float | None:
        if self._fn is not None:
            out = self._fn(text)
            return float(out) if isinstance(out, (int, float)) and not isinstance(out, bool) else None
        match = (self._regex or _NUMBER).search(text)
        if match is None:
            return None
        try:
            return float(match.group(1) if self._regex is not None and self._regex.groups else match.group(0))
        except (ValueError, TypeError):
            return None


@dataclass
class JudgeStats:
    """What happened to one batch's judgements (logged as reward/judge/<field>)."""
    calls: int = 0        # samples judged
    failed: int = 0       # no reply after every retry (error, timeout): scored error_score
    timeouts: int = 0     # attempts over timeout_s (retried while retries remain)
    retries: int = 0      # attempts beyond each call's first
    unparsable: int = 0   # a reply the parser found no score in: scored error_score

    def metrics(self) -> dict[str, float]:
        return {f"reward/judge/{k}": float(v) for k, v in vars(self).items()}


def judge_scores(replies: list[str | None], parser: ScoreParser, error_score: float, stats: JudgeStats
                 ) -> list[float]:
    """One score per reply: the parsed score, or `error_score` for a failed call (None) or an unparsable reply."""
    scores = []
    for reply in replies:
        score = parser(reply) if reply is not None else None
        if reply is None:
            stats.failed += 1
        elif score is None:
            stats.unparsable += 1
        scores.append(error_score if score is None else score)
    stats.calls += len(replies)
    return scores


class OpenAIJudge:
    """Chat completions from an OpenAI-compatible server: one user message per judged sample."""

    def __init__(self, url: str, *, model: str, api_key_env: str | None, max_concurrency: int, timeout_s: float,
                 retries: int, max_tokens: int, temperature: float) -> None:
        """`api_key_env`: the variable holding this judge's key (None: no key is sent, "EMPTY" in its place)."""
        self.url, self.model = url, model
        self.api_key = (os.environ.get(api_key_env) if api_key_env else None) or "EMPTY"
        self.max_concurrency, self.timeout_s, self.retries = max_concurrency, timeout_s, retries
        self.max_tokens, self.temperature = max_tokens, temperature
        self.errors: list[str | None] = []  # the last batch's: why each call failed (None: it did not)
        self.warned = False
        self._in_a_row = 0                  # calls in a row that failed every attempt
        self._tripped: str | None = None    # the error that opened the circuit (this batch)

    def complete(self, texts: list[str], stats: JudgeStats) -> list[str | None]:
        """The reply to each text (None: every attempt failed; `errors` says why), in order; never longer than
        about ceil(len / max_concurrency) x (retries + 1) x timeout_s, and about (retries + 1) x timeout_s more
        than the calls until the circuit breaker opened (module docstring)."""
        self._in_a_row, self._tripped = 0, None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._all(texts, stats))
        with ThreadPoolExecutor(1) as thread:  # this thread already runs an event loop
            return thread.submit(asyncio.run, self._all(texts, stats)).result()

    async def _all(self, texts: list[str], stats: JudgeStats) -> list[str | None]:
        try:
            from openai import AsyncOpenAI
        except ImportError:
            raise MissingExtraError("reward.judge.url needs the openai client: pip install -e '.[agents]'.") from None
        client = AsyncOpenAI(base_url=self.url, api_key=self.api_key, max_retries=0, timeout=self.timeout_s)
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(text: str) -> tuple[str | None, str | None]:
            async with gate:
                return await self._one(client, text, stats)

        try:
            done = list(await asyncio.gather(*(one(t) for t in texts)))
        finally:
            await client.close()
        self.errors = [error for _, error in done]
        return [reply for reply, _ in done]

    async def _one(self, client: Any, text: str, stats: JudgeStats) -> tuple[str | None, str | None]:
        """(the reply, None) or (None, why every attempt failed)."""
        error = "no attempt was made"
        for attempt in range(self.retries + 1):
            if self._tripped is not None:
                return None, self._tripped
            if attempt:
                stats.retries += 1
                await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
            try:
                reply = await asyncio.wait_for(client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": text}], max_tokens=self.max_tokens,
                    temperature=self.temperature), self.timeout_s)
                self._in_a_row = 0
                return reply.choices[0].message.content or "", None
            except asyncio.TimeoutError:
                stats.timeouts += 1
                error = f"gave no reply within reward.judge.timeout_s={self.timeout_s:g} s"
            except Exception as e:  # connection refused, HTTP 5xx, a malformed reply: retried, then counted
                if "timed out" in str(e).lower():
                    stats.timeouts += 1
                error = f"failed: {type(e).__name__}: {str(e)[:300]}"
        self._failed(error)
        return None, error

    def _failed(self, error: str) -> None:
        """Warn at the first failed call; open the circuit after `max_concurrency` failed calls in a row."""
        if not self.warned:
            self.warned = True
            log.warning("the judge at %s (reward.judge.url) %s, after %d attempt(s); its sample scores "
                        "reward.error_score (counted in reward/judge/failed).", self.url, error, self.retries + 1)
        self._in_a_row += 1
        if self._in_a_row >= self.max_concurrency and self._tripped is None:
            self._tripped = error
            log.warning("the judge at %s failed %d calls in a row (%s): the rest of this batch is not sent.",
                        self.url, self._in_a_row, error)
