"""Built-in rewards (gsm8k, math, countdown, format, length_penalty) and combining them."""

import importlib.util
import math
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from grpoflow.rewards import (REWARD_FUNCTIONS, CombinedReward, RoutedReward, build_reward, countdown_reward,
                              extract_gsm8k_answer, format_reward, gsm8k_flexible_reward, gsm8k_reward, last_boxed,
                              length, length_penalty_reward, load_reward_function, math_equal, math_reward,
                              score_completions)
from grpoflow.rewards import math_normalize
from grpoflow.rewards.countdown import evaluate_equation

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None


def test_every_builtin_is_registered_and_loadable():
    names = {"exact_match", "length", "gsm8k", "gsm8k_flexible", "math", "countdown", "format", "length_penalty"}
    assert names <= set(REWARD_FUNCTIONS.names())
    assert load_reward_function("gsm8k") is gsm8k_reward
    assert load_reward_function("countdown") is countdown_reward


# ---------------------------------------------------------------- gsm8k


@pytest.mark.parametrize("text, method, expected", [
    ("3 + 4 = 7\n#### 7", "strict", "7"),
    ("#### 1,000", "strict", "1000"),
    ("#### $1,250.", "strict", "1250"),           # dollar and sentence-ending period dropped
    ("#### -3", "strict", "-3"),
    ("first #### 5 then #### 72", "strict", "72"),  # the last one
    ("The answer is 72.", "strict", None),         # strict needs "#### "
    ("The answer is 72.", "flexible", "72"),
    ("costs $1,000,000 in total", "flexible", "1000000"),
    ("between 3 and 4.5, so 4.5.", "flexible", "4.5"),
    ("no number here", "flexible", None),
])
def test_extract_gsm8k_answer(text, method, expected):
    assert extract_gsm8k_answer(text, method) == expected


def test_extract_gsm8k_answer_rejects_unknown_method():
    with pytest.raises(ValueError, match="method='loose'"):
        extract_gsm8k_answer("#### 1", "loose")


def test_gsm8k_strict_scores():
    assert gsm8k_reward("q", "6 * 12 = 72\n#### 72", ground_truth="72") == 1.0
    assert gsm8k_reward("q", "#### 71", ground_truth="72") == 0.0
    assert gsm8k_reward("q", "#### 71", ground_truth="72", format_score=0.1) == 0.1  # extracted but wrong
    assert gsm8k_reward("q", "it is 72", ground_truth="72", format_score=0.1) == 0.0  # nothing extracted
    assert gsm8k_reward("q", "#### 72.0", ground_truth="72") == 1.0                  # compared as numbers
    assert gsm8k_reward("q", "#### 1,000", ground_truth="1000") == 1.0


def test_gsm8k_flexible_takes_the_last_number():
    assert gsm8k_flexible_reward("q", "5 apples and 7 pears make 12", answer="12") == 1.0
    assert gsm8k_flexible_reward("q", "12 apples, then 13", answer="12", format_score=0.2) == 0.2


def test_gsm8k_reference_from_verl_column_or_full_solution():
    verl_row = {"reward_model": {"ground_truth": "18", "style": "rule"}, "data_source": "openai/gsm8k"}
    assert gsm8k_reward("q", "#### 18", **verl_row) == 1.0
    # the raw GSM8K `answer` column is a worked solution ending in "#### 18"
    assert gsm8k_reward("q", "#### 18", answer="16 - 3 - 4 = <<16-3-4=9>>9\n9 * 2 = 18\n#### 18") == 1.0
    assert gsm8k_reward("q", "#### 18") is None


# ---------------------------------------------------------------- math


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),                    # nested braces
    (r"\boxed{1} wait, \boxed{\sqrt{\frac{a}{b}}}", r"\sqrt{\frac{a}{b}}"),  # the last box
    (r"\fbox{x^{2}}", "x^{2}"),
    (r"$\boxed 7$", "7"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),                          # escaped braces are not counted
    (r"\boxed{\frac{1}{2}", None),                               # never closed
    ("no box", None),
    ("", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("pred, truth", [
    ("0.5", r"\frac12"),
    (r"\dfrac{1}{2}", "0.5"),
    (r"\tfrac{3}{4}", ".75"),
    ("x = 5", "5"),
    (r"5\text{ cm}", "5"),
    (r"90^\circ", "90"),
    (r"\$ 1,000", "1000"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"\frac{\sqrt{3}}{2}", r"\sqrt3/2"),
    (r"\text{(B)}", "B"),
    ("10.", "10"),
    (r"50\%", "50"),
])
def test_math_equal_fallback_accepts_equivalent_forms(pred, truth):
    assert math_equal(pred, truth, use_math_verify=False)


@pytest.mark.parametrize("pred, truth", [
    ("0.333", r"\frac13"),    # exact rationals: a rounded decimal is not the fraction
    ("2", "3"),
    (r"\frac{1}{2}", r"\frac{2}{1}"),
    ("", "0"),
    (None, "1"),
])
def test_math_equal_fallback_rejects_different_answers(pred, truth):
    assert not math_equal(pred, truth, use_math_verify=False)


def test_math_reward():
    assert math_reward("q", r"The area is \boxed{\frac{1}{2}}.", ground_truth="0.5") == 1.0
    assert math_reward("q", r"\boxed{3}", ground_truth="4") == 0.0
    assert math_reward("q", r"\boxed{3}", ground_truth="4", format_score=0.1) == 0.1
    assert math_reward("q", "the answer is 4", ground_truth="4", format_score=0.1) == 0.0  # no box
    # MATH's `solution` column is a worked solution with its own box
    assert math_reward("q", r"\boxed{12}", solution=r"Add them: $5+7=\boxed{12}$.") == 1.0
    assert math_reward("q", r"\boxed{12}") is None


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed (optional)")
def test_math_equal_uses_math_verify_when_installed():
    pred, truth = r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}"
    assert not math_equal(pred, truth, use_math_verify=False)  # beyond the plain normaliser
    assert math_equal(pred, truth)
    assert math_equal(pred, truth, use_math_verify=True)
    assert not math_equal("2", "3", use_math_verify=True)
    # math-verify's own time limit uses SIGALRM, which other threads may not set; it still works there
    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(math_equal, pred, truth).result()


def test_math_equal_requires_math_verify_only_when_asked(monkeypatch):
    monkeypatch.setattr(math_normalize, "_math_verify", lambda: None)  # as if it were not installed
    assert math_equal("0.5", r"\frac{1}{2}")                                # the fallback still works
    assert not math_equal(r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}")
    with pytest.raises(ImportError, match="pip install math-verify"):
        math_equal("1", "2", use_math_verify=True)


# ---------------------------------------------------------------- countdown

ROW = {"target": 9, "nums": [1, 2, 3]}


@pytest.mark.parametrize("completion, expected", [
    ("<think>try</think> <answer>(1 + 2) * 3</answer>", 1.0),
    ("<answer>3 * (2 + 1)</answer>", 1.0),
    ("<answer>1 + 2 + 3</answer>", 0.1),                         # valid but 6, not 9
    ("<answer>3 * 3</answer>", 0.1),                             # 3 reused, 1 and 2 unused
    ("<answer>(1 + 2) * 3 * 1</answer>", 0.1),                   # 1 used twice
    ("<answer>(4 + 5)</answer>", 0.1),                           # numbers not given
    ("<answer>(1 + 2) * 3 = 9</answer>", 0.1),                   # "=" is not allowed
    ("<answer>__import__('os').system('echo hacked')</answer>", 0.1),  # never evaluated
    ("<answer>(1 + 2) ** 3</answer>", 0.1),                      # power is not an allowed operator
    ("<answer>9 / (3 - 3)</answer>", 0.1),                       # division by zero
    ("<answer>1.5 * 2 * 3</answer>", 0.1),                       # only whole numbers
    ("<answer>0</answer> then <answer>(1+2)*3</answer>", 1.0),   # the last answer counts
    ("I think:\n(1 + 2) * 3", 1.0),                              # no tags: the last line, if an equation
    ("I give up.", 0.0),                                         # no equation at all
])
def test_countdown(completion, expected):
    assert countdown_reward("q", completion, **ROW) == expected


def test_countdown_reads_verl_ground_truth_and_divides_exactly():
    verl = {"reward_model": {"ground_truth": {"target": 5, "numbers": [6, 3, 9]}}}
    assert countdown_reward("q", "<answer>(6 + 9) / 3</answer>", **verl) == 1.0
    assert countdown_reward("q", "<answer>(6 + 9) / 3 * 1</answer>", **verl) == 0.1  # 1 is not given
    json_truth = {"reward_model": {"ground_truth": '{"target": 2, "numbers": [6, 3]}'}}
    assert countdown_reward("q", "<answer>6 / 3</answer>", **json_truth) == 1.0
    assert countdown_reward("q", "<answer>6 - 3</answer>", **json_truth) == 0.1
    # a float target, a tuple of numbers, a `numbers` column, and format_score from the row
    assert countdown_reward("q", "<answer>6 / 3</answer>", target=2.0, nums=(6, 3)) == 1.0
    assert countdown_reward("q", "<answer>6 - 3</answer>", target=2, numbers=[6, 3], format_score=0.0) == 0.0


def test_countdown_without_a_problem_is_none():
    assert countdown_reward("q", "<answer>1+2</answer>") is None
    assert countdown_reward("q", "<answer>1+2</answer>", target=3) is None


def test_evaluate_equation_is_exact():
    assert evaluate_equation("1 / 3 * 3", [1, 3, 3]) == 1  # rationals: no 0.999...
    assert evaluate_equation("-(1 - 3)", [1, 3]) == 2
    assert evaluate_equation("(" * 400 + "1" + ")" * 400, [1]) is None  # too long to be an equation


# ---------------------------------------------------------------- format and length


def test_format_default_pattern():
    assert format_reward("q", "<think>step 1\nstep 2</think>\n<answer>42</answer>") == 1.0
    assert format_reward("q", "  <think>x</think><answer>42</answer>\n") == 1.0  # outer whitespace ignored
    assert format_reward("q", "<think>x</think>") == 0.0
    assert format_reward("q", "<answer>42</answer>") == 0.0
    assert format_reward("q", "<think>x</think><answer>42</answer> and more") == 0.0


def test_format_pattern_from_row():
    assert format_reward("q", "Answer: 7", pattern=r"Answer: \d+$") == 1.0
    assert format_reward("q", "The Answer: 7", pattern=r"Answer: \d+$") == 0.0


def test_length_penalty_in_characters():
    assert length_penalty_reward("q", "x" * 1000) == 0.0
    assert length_penalty_reward("q", "x" * 1500) == -0.5   # 500 over a budget of 1000
    assert length_penalty_reward("q", "x" * 20, max_chars=10) == -1.0
    assert length_penalty_reward("q", "", max_chars=10) == 0.0
    with pytest.raises(ValueError, match="max_chars=0"):
        length_penalty_reward("q", "x", max_chars=0)


# ---------------------------------------------------------------- combining


def test_combined_reward_weighted_sum_and_parts():
    fn = CombinedReward([("gsm8k", gsm8k_reward), ("format", format_reward)], weights=[1.0, 0.5])
    good = "<think>6*12</think><answer>#### 72</answer>"
    # gsm8k 1.0 * 1.0 + format 1.0 * 0.5
    assert fn("q", good, answer="72") == {"score": 1.5, "gsm8k": 1.0, "format": 1.0}
    # the number is found (gsm8k 1.0) but the tags are missing (format 0.0)
    assert fn("q", "#### 72", answer="72") == {"score": 1.0, "gsm8k": 1.0, "format": 0.0}


def test_combined_reward_default_weights_and_nested_extras():
    fn = CombinedReward([("a", lambda p, c, **r: {"score": 2.0, "fmt": 1.0}), ("b", lambda p, c, **r: 3)])
    assert fn("q", "c") == {"score": 5.0, "a": 2.0, "a/fmt": 1.0, "b": 3.0}


def test_combined_reward_none_and_errors_are_the_whole_sample():
    none = CombinedReward([("ok", lambda p, c, **r: 1.0), ("gsm8k", gsm8k_reward)])
    assert none("q", "#### 1") is None  # gsm8k has no reference: the sample cannot be scored
    bad = CombinedReward([("ok", lambda p, c, **r: 1.0), ("broken", lambda p, c, **r: math.nan)])
    with pytest.raises(ValueError, match="'broken' returned nan"):
        bad("q", "c")
    result = score_completions(bad, ["q"], ["c"], [{}], error_score=-1.0)
    assert result.scores == [-1.0] and result.errors == 1


@pytest.mark.parametrize("functions, weights, message", [
    ([], None, "at least one"),
    ([("a", length), ("a", length)], None, "unique"),
    ([("score", length)], None, "unique and not 'score'"),
    ([("a", length), ("b", length)], [1.0], "2 finite numbers"),
    ([("a", length)], [math.inf], "finite"),
])
def test_combined_reward_checks_its_arguments(functions, weights, message):
    with pytest.raises(ValueError, match=message):
        CombinedReward(functions, weights)


def test_combined_reward_refuses_async_parts():
    async def fn(prompt, completion, **row):
        return 1.0

    with pytest.raises(ValueError, match="not async"):
        CombinedReward([("a", fn)])


def test_build_reward_single_list_and_file(tmp_path):
    assert build_reward("gsm8k") is gsm8k_reward
    path = tmp_path / "my_build_reward.py"
    path.write_text(textwrap.dedent("""
        def bonus(prompt, completion, **row):
            return 0.25
    """))
    fn = build_reward(["gsm8k", f"{path}:bonus", f"{path}:bonus"], weights=[2.0, 1.0, 4.0])
    assert isinstance(fn, CombinedReward)
    # parts are named by built-in name or function name; a repeated name gets a suffix
    assert fn("q", "#### 3", answer="3") == {"score": 2.0 + 0.25 + 1.0, "gsm8k": 1.0, "bonus": 0.25,
                                               "bonus_2": 0.25}
    single_weighted = build_reward("length", weights=[0.5])
    assert single_weighted("q", "abcd") == {"score": 2.0, "length": 4.0}
    with pytest.raises(ValueError, match="(?i)did you mean 'gsm8k'"):
        build_reward(["gsm8kk"])
    with pytest.raises(ValueError, match="non-empty list"):
        build_reward([])


def test_build_reward_routes_by_data_source():
    fn = build_reward("exact_match", routes={"openai/gsm8k": "gsm8k", "countdown": ["countdown", "format"]})
    assert isinstance(fn, RoutedReward)
    assert fn("q", "#### 4", data_source="openai/gsm8k", answer="4") == {
        "score": 1.0, "openai/gsm8k/score": 1.0, "route": "openai/gsm8k"}
    # a combined route: its parts are logged under the route's name
    out = fn("q", "<think>x</think><answer>1+2</answer>", data_source="countdown", target=3, nums=[1, 2])
    assert out == {"score": 2.0, "countdown/score": 2.0, "countdown/countdown": 1.0, "countdown/format": 1.0,
                   "route": "countdown"}
    # other sources (or none) use the default
    assert fn("q", "4", data_source="other", answer="4")["route"] == "default"
    assert fn("q", "5", answer="4") == {"score": 0.0, "default/score": 0.0, "route": "default"}


def test_routed_rewards_log_per_source_means_through_scoring():
    fn = build_reward("exact_match", routes={"gsm8k": "gsm8k"})
    rows = [{"data_source": "gsm8k", "answer": "4"}, {"data_source": "gsm8k", "answer": "5"},
            {"data_source": "toy", "answer": "x"}]
    result = score_completions(fn, ["q"] * 3, ["#### 4", "#### 4", "x"], rows)
    assert result.scores == [1.0, 0.0, 1.0]
    m = result.metrics()
    assert m["reward/gsm8k/score/mean"] == 0.5 and m["reward/default/score/mean"] == 1.0
    assert not any("route" == k.split("/")[1] for k in m)  # the text "route" entry is not a metric
