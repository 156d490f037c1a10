"""grpoflow.rewards: built-ins, loading a user function, and scoring that counts every failure."""

import logging
import math
import textwrap

import pytest

from grpoflow.rewards.functions import exact_match, length, load_reward_function
from grpoflow.rewards.scoring import score_completions

# ---------------------------------------------------------------- built-ins


def test_exact_match_with_answer_column():
    assert exact_match("1+3=", " 4 \n", answer="4") == 1.0
    assert exact_match("1+3=", "5", answer="4") == 0.0
    assert exact_match("1+3=", "4", answer=4) == 1.0  # a numeric column is compared as text


def test_exact_match_with_ground_truth_column():
    assert exact_match("q", "yes", ground_truth="yes") == 1.0
    assert exact_match("q", "no", ground_truth="yes") == 0.0


def test_exact_match_with_verl_reward_model_column():
    row = {"reward_model": {"ground_truth": "42", "style": "rule"}, "data_source": "gsm8k"}
    assert exact_match("q", "42", **row) == 1.0
    assert exact_match("q", "41", **row) == 0.0


def test_exact_match_prefers_verl_ground_truth_over_answer():
    assert exact_match("q", "a", reward_model={"ground_truth": "a"}, answer="b") == 1.0


def test_exact_match_is_none_without_any_truth():
    assert exact_match("q", "4") is None
    assert exact_match("q", "4", data_source="x", reward_model={"style": "rule"}) is None
    assert exact_match("q", "4", answer=None) is None


def test_length_counts_characters():
    assert length("prompt is ignored", "abcde") == 5.0
    assert length("p", "", answer="x") == 0.0


# ---------------------------------------------------------------- loading


def test_load_builtin():
    assert load_reward_function("exact_match") is exact_match
    assert load_reward_function("length") is length


def test_load_from_file(tmp_path):
    path = tmp_path / "my_reward_ok.py"
    path.write_text(textwrap.dedent("""
        def helper(x):
            return x

        def reward(prompt, completion, **row):
            return float(completion == row["answer"]) + 0.5
    """))
    fn = load_reward_function(f"{path}:reward")
    assert fn("p", "7", answer="7") == 1.5
    assert fn("p", "8", answer="7") == 0.5


def test_load_from_missing_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError, match="nope.py. does not exist"):
        load_reward_function(f"{missing}:reward")


def test_load_missing_function_lists_defined_functions(tmp_path):
    path = tmp_path / "my_reward_missing.py"
    path.write_text("def score_a(prompt, completion, **row):\n    return 1.0\n\n"
                    "def score_b(prompt, completion, **row):\n    return 0.0\n\n"
                    "def _private():\n    pass\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(f"{path}:reward")
    message = str(err.value)
    assert "'reward'" in message
    assert "score_a" in message and "score_b" in message
    assert "_private" not in message


def test_load_unknown_builtin_suggests_closest():
    with pytest.raises(ValueError) as err:
        load_reward_function("exact_mach")
    message = str(err.value)
    assert "'exact_mach'" in message
    assert "did you mean 'exact_match'?" in message.lower()
    assert "length" in message  # the valid built-ins are listed


def test_load_function_with_wrong_signature(tmp_path):
    path = tmp_path / "my_reward_badsig.py"
    path.write_text("def reward(completion):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"must accept \(prompt, completion, \*\*row_columns\)"):
        load_reward_function(f"{path}:reward")


def test_load_attribute_that_is_not_callable(tmp_path):
    path = tmp_path / "my_reward_notfn.py"
    path.write_text("reward = 3\n\ndef other(prompt, completion, **row):\n    return 0.0\n")
    with pytest.raises(ValueError, match="no function 'reward'.*other"):
        load_reward_function(f"{path}:reward")


# ---------------------------------------------------------------- scoring


def test_score_completions_happy_path():
    result = score_completions(exact_match, ["a", "b", "c"], ["1", "2", "3"],
                               [{"answer": "1"}, {"answer": "0"}, {"answer": "3"}])
    assert result.scores == [1.0, 0.0, 1.0]
    assert result.errors == 0 and result.nones == 0
    m = result.metrics()
    assert "critic/score/mean" not in m  # the controller logs the score of the batch it trains on
    assert m["reward/errors"] == 0.0 and m["reward/none"] == 0.0


def test_raising_function_gets_error_score_and_is_counted(caplog):
    def fn(prompt, completion, **row):
        if completion == "bad":
            raise RuntimeError("cannot parse")
        return 1.0

    with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
        result = score_completions(fn, ["p"] * 4, ["ok", "bad", "ok", "bad"], [{}] * 4, error_score=-1.0)
    assert result.scores == [1.0, -1.0, 1.0, -1.0]
    assert result.errors == 2 and result.nones == 0
    assert result.metrics()["reward/errors"] == 2.0
    # one warning per call, with the count and the first traceback
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "2 of 4" in text and "cannot parse" in text and "Traceback" in text


def test_none_is_counted_separately_and_gets_error_score(caplog):
    def fn(prompt, completion, **row):
        return None if completion == "?" else 0.5

    with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
        result = score_completions(fn, ["p"] * 3, ["?", "x", "?"], [{}] * 3, error_score=-2.0)
    assert result.scores == [-2.0, 0.5, -2.0]
    assert result.nones == 2 and result.errors == 0
    assert result.metrics()["reward/none"] == 2.0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # None is not a failure


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", [1.0], {"fmt": 1.0}, {"score": "x"}])
def test_non_finite_or_non_numeric_returns_are_errors(bad):
    result = score_completions(lambda prompt, completion, **row: bad, ["p", "p"], ["a", "b"], [{}, {}],
                               error_score=-3.0)
    assert result.scores == [-3.0, -3.0]
    assert result.errors == 2
    assert result.nones == 0
    assert all(math.isfinite(s) for s in result.scores)


def test_int_return_is_a_score():
    result = score_completions(lambda prompt, completion, **row: 1, ["p"], ["a"], [{}])
    assert result.scores == [1.0] and result.errors == 0


def test_dict_return_logs_extras_as_reward_key_mean():
    values = iter([{"score": 1, "fmt": 0.5}, {"score": 0, "fmt": 1.0, "note": "text"}])
    result = score_completions(lambda prompt, completion, **row: next(values), ["p", "p"], ["a", "b"], [{}, {}])
    assert result.scores == [1.0, 0.0]
    assert result.errors == 0
    m = result.metrics()
    assert m["reward/fmt/mean"] == pytest.approx(0.75)
    assert "reward/note/mean" not in m  # only numeric extras are logged
    assert "reward/score/mean" not in m


def test_merge_concatenates_scores_and_adds_counts():
    a = score_completions(lambda p, c, **r: None, ["p"], ["a"], [{}], error_score=-1)
    b = score_completions(lambda p, c, **r: {"score": 2, "fmt": 1}, ["p", "p"], ["a", "b"], [{}, {}])
    m = a.merge(b)
    assert m.scores == [-1.0, 2.0, 2.0] and m.nones == 1 and m.errors == 0 and m.extras == {"fmt": [1.0, 1.0]}


def test_row_columns_are_keyword_args_and_prompt_completion_not_passed_twice():
    seen = []

    def fn(prompt, completion, **row):
        seen.append((prompt, completion, row))
        return 1.0

    rows = [{"prompt": "row prompt", "completion": "row completion", "answer": "4", "extra_info": {"i": 0}}]
    result = score_completions(fn, ["real prompt"], ["real completion"], rows)
    assert result.errors == 0
    assert seen == [("real prompt", "real completion", {"answer": "4", "extra_info": {"i": 0}})]
    assert "prompt" in rows[0]  # the caller's row is not mutated


def test_builtin_scores_verl_rows_through_score_completions():
    rows = [{"prompt": [{"role": "user", "content": "2+2"}], "reward_model": {"ground_truth": "4"}}] * 2
    result = score_completions(exact_match, ["2+2", "2+2"], ["4", "5"], rows)
    assert result.scores == [1.0, 0.0]
    assert result.errors == 0
