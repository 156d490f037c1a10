"""LLM-judge pieces without a model: templates, score parsing, counting, routing, config checks."""

import pytest

from grpoflow.config import ConfigError, load_config
from grpoflow.plan.checks import check_config
from grpoflow.controller.judging import Judging
from grpoflow.rewards import build_reward
from grpoflow.rewards.judge import (JUDGE_COLUMN, JudgeConfigError, JudgeStats, ScoreParser, judge_scores,
                                    render_judge_prompt)


def test_template_renders_prompt_completion_and_row_columns():
    text = render_judge_prompt("Q: {prompt} A: {completion} truth: {answer} gt: {reward_model[ground_truth]}",
                               "1+1=", "2", {"answer": "2", "reward_model": {"ground_truth": "two"}})
    assert text == "Q: 1+1= A: 2 truth: 2 gt: two"
    with pytest.raises(JudgeConfigError, match="names 'solution'.*columns: \\['answer'\\]"):
        render_judge_prompt("{solution}", "p", "c", {"answer": "2"})


@pytest.mark.parametrize("spec, max_score, text, expect", [
    ("number", None, "Score: 7 out of 10", 7.0),        # the first number
    ("number", 10.0, "I'd say 7.5/10", 0.75),           # 7.5 / 10
    ("number", 10.0, "12", None),                        # over max_score: unparsable
    ("number", 10.0, "-1", None),                        # under 0: unparsable
    ("number", None, "no digits here", None),
    ("regex:RATING=(\\d+)", 5.0, "1 2 3 RATING=4", 0.8),  # the group, not the first number: 4 / 5
    ("regex:RATING=(\\d+)", 5.0, "RATING=?", None),
])
def test_score_parser_hand_values(spec, max_score, text, expect):
    assert ScoreParser(spec, max_score)(text) == expect


def test_user_parser_from_a_file_and_bad_specs(tmp_path):
    f = tmp_path / "parse.py"
    f.write_text("def yes(text):\n"
                 "    return 1.0 if 'yes' in text.lower() else (0.0 if 'no' in text.lower() else None)\n")
    parser = ScoreParser(f"{f}:yes")
    assert (parser("Yes!"), parser("no"), parser("maybe")) == (1.0, 0.0, None)
    with pytest.raises(JudgeConfigError, match="use number, regex"):
        ScoreParser("first_number")
    with pytest.raises(JudgeConfigError, match="not a valid regex"):
        ScoreParser("regex:(")


def test_failed_and_unparsable_replies_score_error_score_and_are_counted():
    stats = JudgeStats()
    scores = judge_scores(["8", None, "great", "3"], ScoreParser("number", 10.0), -1.0, stats)
    assert scores == [0.8, -1.0, -1.0, 0.3]
    assert (stats.calls, stats.failed, stats.unparsable) == (4, 1, 1)
    assert stats.metrics()["reward/judge/failed"] == 1.0


def test_judge_combines_by_weight_and_routes_by_data_source():
    # exact_match + 0.5 x judge: a right answer judged 0.6 scores 1 + 0.3
    combined = build_reward(["exact_match", "judge"], [1.0, 0.5])
    assert combined("1+1=", "2", answer="2", **{JUDGE_COLUMN: 0.6}) == {"score": 1.3, "exact_match": 1.0, "judge": 0.6}
    cfg = load_config(None, ["reward.function=exact_match", "reward.routes={chat: [exact_match, judge]}",
                             "reward.judge.url=http://localhost:1/v1"])
    judging = Judging(cfg.reward, None)
    assert [judging.judged({"data_source": s}) for s in ("chat", "math", None)] == [True, False, False]


def test_the_judge_must_be_both_named_and_configured():
    with pytest.raises(ConfigError, match="names `judge` but no judge is configured"):
        check_config(load_config(None, ["reward.functions=[exact_match, judge]"]))
    with pytest.raises(ConfigError, match="no reward uses it"):
        check_config(load_config(None, ["reward.judge.url=http://localhost:1/v1"]))
    with pytest.raises(ConfigError, match="both set"):
        check_config(load_config(None, ["reward.function=judge", "reward.judge.url=http://x/v1",
                                        "reward.judge.path=/tmp"]))
    check_config(load_config(None, ["reward.function=judge", "reward.judge.url=http://localhost:1/v1"]))
