"""The judging stage of reward assembly (reward.judge, docs/data-and-rewards.md "LLM judges").

Before the rule rewards run, the samples whose reward names `judge` (in reward.function(s), or in the
route of their data_source) are judged as one batch: by an OpenAI-compatible server (bounded
concurrency, timeouts, retries) or by a local model in its own worker group (one batched generate).
Each judged sample's row, copied, gets its score in `JUDGE_COLUMN`, which the `judge` reward returns, so
the judge is weighted and routed like any other reward part. A failed or unparsable judgement scores
reward.error_score and is counted (reward/judge/failed, reward/judge/unparsable). When every judgement of a
step failed with the same error (a dead server, a wrong URL, model or key), the run stops with that error
(`JudgeFailure`) rather than train on reward.error_score alone. So it does when every reply of a step was
unparsable (a 0-100 judge under reward.judge.max_score 10 answering `85`); the first unparsable reply of a run is
a warning that quotes it and names max_score and the parser.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from grpoflow.config import RewardConfig
from grpoflow.distributed.worker_group import WorkerGroup, broadcast
from grpoflow.errors import UserError
from grpoflow.models.spec import model_folder
from grpoflow.plan.checks import names_judge
from grpoflow.rewards.judge import (JUDGE_COLUMN, JudgeStats, OpenAIJudge, ScoreParser,
                                    judge_scores, render_judge_prompt)
from grpoflow.workers.judge import JudgeWorker

log = logging.getLogger("grpoflow.judge")


class JudgeFailure(UserError):
    """Every judgement of a step failed with one error: the run stops with it (module docstring)."""


def resolve_judge_path(path: str, run_dir: Path) -> str:
    """reward.judge.path as a local model folder (models/spec.py: a .gguf file is dequantized into
    <run folder>/judge_model, a builtin: model built there)."""
    return model_folder(path, setting="reward.judge.path", into=run_dir.resolve() / "judge_model",
                        also=" (or serve the judge and set reward.judge.url)")


class Judging:
    """Judge scores for the samples whose reward names `judge`, written into copies of their rows."""

    def __init__(self, cfg: RewardConfig, group: WorkerGroup[JudgeWorker] | None) -> None:
        j = cfg.judge
        self.cfg, self.group = cfg, group
        self.parser = ScoreParser(j.parser, j.max_score)
        self.client = OpenAIJudge(j.url, model=j.model, api_key_env=j.api_key_env, max_concurrency=j.max_concurrency,
                                  timeout_s=j.timeout_s, retries=j.retries, max_tokens=j.max_tokens,
                                  temperature=j.temperature) if j.url else None
        self.default = names_judge(cfg.functions or cfg.function)
        self.routes = {source: names_judge(spec) for source, spec in (cfg.routes or {}).items()}
        self.warned_unparsable = False

    def judged(self, row: dict) -> bool:
        """Whether this row's reward (its data_source's route, else the default) includes the judge."""
        source = row.get("data_source")
        return self.routes[source] if isinstance(source, str) and source in self.routes else self.default

    def rows(self, prompts: list[str], completions: list[str], rows: list[dict]) -> tuple[list[dict], dict[str, float]]:
        """The rows with `JUDGE_COLUMN` set on the judged ones (copies; the dataset's rows are untouched), and
        the judge's counts."""
        which = [i for i, row in enumerate(rows) if self.judged(row)]
        stats = JudgeStats()
        if not which:
            return rows, stats.metrics()
        texts = [render_judge_prompt(self.cfg.judge.template, prompts[i], completions[i], rows[i]) for i in which]
        replies = self.complete(texts, stats)
        errors = set(self.client.errors) if self.client is not None else set()
        if self.client is not None and len(errors) == 1 and None not in errors:
            raise JudgeFailure(f"every one of this step's {len(texts)} judgements failed: the judge at "
                               f"{self.client.url} {errors.pop()}. Check that it is up and that reward.judge.url, "
                               ".model and .api_key_env are right; the run stops rather than train on "
                               "reward.error_score alone.")
        scores = judge_scores(replies, self.parser, self.cfg.error_score, stats)
        self.check_parsed(replies, stats)
        out = list(rows)
        for i, score in zip(which, scores):
            out[i] = {**rows[i], JUDGE_COLUMN: score}
        return out, stats.metrics()

    def check_parsed(self, replies: list[Any], stats: JudgeStats) -> None:
        """Warn at a run's first unparsable reply; raise JudgeFailure when every reply of the step that came back
        was one."""
        if not stats.unparsable:
            return
        first = next(r for r in replies if r is not None and self.parser(r) is None)
        j = self.cfg.judge
        how = (f"reward.judge.parser={j.parser!r} finds no number in [0, reward.judge.max_score={j.max_score:g}] "
               if j.max_score is not None else f"reward.judge.parser={j.parser!r} finds no number ")
        fix = ("set reward.judge.max_score to the judge's scale (100 for a 0-100 judge) or reward.judge.parser to "
               "read its replies")
        if stats.unparsable == sum(r is not None for r in replies):
            raise JudgeFailure(f"every one of this step's {len(replies)} judge replies was unparsable: "
                               f"{how}in e.g. {str(first)[:200]!r}; {fix}; the run stops rather than train on "
                               "reward.error_score alone.")
        if not self.warned_unparsable:
            self.warned_unparsable = True
            log.warning("a judge reply is unparsable: %sin %r, so it scores reward.error_score (counted in "
                        "reward/judge/unparsable); %s.", how, str(first)[:200], fix)

    def complete(self, texts: list[str], stats: JudgeStats) -> list[Any]:
        if self.client is not None:
            return self.client.complete(texts, stats)
        assert self.group is not None
        return self.group.call(JudgeWorker.complete, broadcast(texts))
