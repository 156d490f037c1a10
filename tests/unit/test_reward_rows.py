"""Issue 52 items 1, 3, 4 at the scorer: every call gets its own copy of its rows (in this process and in reward
worker processes); TRL-shaped functions are called once per step with the step's lists; what TRL and verl accept
as scores is accepted (grpoflow/rewards/values.py, batched.py, shapes.py)."""

import fractions
import logging

import numpy as np
import pytest
import torch

from grpoflow.config import ConfigError, load_config
from grpoflow.config.checks import check_config_values
from grpoflow.controller.reward_health import RewardHealth
from grpoflow.errors import UserError
from grpoflow.rewards import RewardScorer, Scores, batched, build_reward
from grpoflow.rewards.shapes import SampleContext, TrainerState, detect_style
from grpoflow.rewards.values import plain_score, plain_scores

REWARDS = '''
import time
import numpy as np

def counter(prompt, completion, extra_info, **row):
    extra_info["count"] += 1          # a dict column of the row, changed
    return float(extra_info["count"])

def appender(completions, tags, **kwargs):
    for t in tags:                    # TRL's column list, each entry changed
        t.append("seen")
    return [float(len(t)) for t in tags]

def verl_changer(data_source, solution_str, ground_truth, extra_info=None):
    extra_info["calls"] += 1
    return float(extra_info["calls"] - 1)

def changer(prompt, completion, extra_info, **row):
    extra_info["count"] = 100
    return 0.0

def reader(prompt, completion, extra_info, **row):
    return float(extra_info["count"])

def relative(completions, **kwargs):
    longest = max(len(c) for c in completions)
    return [1 - len(c) / longest for c in completions]

def sizes(completions, **kwargs):
    return [float(len(completions))] * len(completions)

def only_ids(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]

def logs(completions, log_metric, log_extra, **kwargs):
    log_metric("share_a", sum(c == "a" for c in completions) / len(completions))
    log_extra("chars", [len(c) for c in completions])
    log_extra("texts", completions)   # text: not a number, kept out of the reward parts
    return [1.0] * len(completions)

def bools(completions, **kwargs):
    return [c == "a" for c in completions]

def ones(completions, **kwargs):
    return np.ones(len(completions))

def generated(completions, **kwargs):
    return (float(len(c)) for c in completions)

def verl_numpy(data_source, solution_str, ground_truth, extra_info=None):
    return np.float32(1.0)

def holes(completions, **kwargs):
    return [None, "x", 1.0, True][:len(completions)]

def short(completions, **kwargs):
    return [1.0]

def raises(completions, **kwargs):
    raise ValueError("the batch broke")

def sleeps(completions, **kwargs):
    time.sleep(30)
    return [1.0] * len(completions)

def any_shape(*args, **kwargs):
    return [float(len(c)) for c in kwargs["completions"]]

def plain(prompt, completion, **row):
    return 1.0
'''


@pytest.fixture(scope="module")
def rewards(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "rewards.py"
    path.write_text(REWARDS)
    return lambda *names: [f"{path}:{n}" for n in names] if len(names) > 1 else f"{path}:{names[0]}"


def group(row, n=4):
    """One prompt's group: n samples that share one row object, as a step's batch holds them."""
    return [row] * n


def two_steps(spec, rows, workers, completions=("a", "bb", "ccc", "a"), **kw):
    with RewardScorer(build_reward(spec, **kw), workers=workers) as scorer:
        assert scorer.uses_processes == (workers > 0)
        return [scorer.score(["p"] * len(rows), list(completions), rows) for _ in range(2)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_reward_that_changes_its_row_changes_no_other_call(rewards, workers):
    shared = {"count": 0, "calls": 0}
    tags: list = []
    rows = group({"extra_info": shared, "tags": tags, "data_source": "mine", "answer": "1"})
    for spec, score in [(rewards("counter"), 1.0), (rewards("appender"), 1.0),
                        (rewards("counter", "appender", "verl_changer"), 2.0)]:  # 1 + 1 + 0
        steps = two_steps(spec, rows, workers)
        assert [s.scores for s in steps] == [[score] * 4] * 2, spec  # the next sample and the next step
        assert [s.errors for s in steps] == [0, 0]
    assert {p["verl_changer"] for s in steps for p in s.parts} == {0.0}
    assert shared == {"count": 0, "calls": 0} and tags == []      # and the logged rows
    # a part of a combination does not see what the part before it changed
    steps = two_steps(rewards("changer", "reader"), group({"extra_info": {"count": 3}}), workers)
    assert [p["reader"] for s in steps for p in s.parts] == [3.0] * 8


def test_an_async_reward_gets_its_own_row_too():
    shared = {"count": 0}

    async def counter(prompt, completion, extra_info, **row):
        extra_info["count"] += 1
        return np.float64(extra_info["count"])

    scorer = RewardScorer(counter)
    for _ in range(2):
        assert scorer.score(["p"] * 3, ["a"] * 3, group({"extra_info": shared}, 3)).scores == [1.0] * 3
    assert shared == {"count": 0}


def test_trl_markers_and_callable_objects_pick_the_trl_shape():
    class Punish:  # e.g. TRL's get_soft_overlong_punishment(64, 16): a callable object of completion_ids
        def __call__(self, completion_ids, **kwargs): ...

    def example_1(completion_ids, **kwargs): ...
    def state(prompts_text, trainer_state, **kwargs): ...
    def extra(texts, log_extra=None, **kwargs): ...
    def metric(texts, log_metric=None, **kwargs): ...
    assert [detect_style(f) for f in (Punish(), example_1, state, extra, metric)] == ["trl"] * 5


@pytest.mark.parametrize("workers", [0, 2])
def test_trl_functions_are_called_once_with_the_whole_step(rewards, workers, caplog):
    rows = group({"data_source": "mine"})
    parts = two_steps(rewards("relative", "sizes"), rows, workers, completions=("a", "bb", "aaaa", "a"))[0].parts
    assert [p["relative"] for p in parts] == [0.75, 0.5, 0.0, 0.75]   # 1 - len / max(len) over the step
    assert {p["sizes"] for p in parts} == {4.0}                       # one call saw all 4 completions
    batched._said.clear()
    with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
        steps = two_steps(rewards("logs"), rows, workers)
    assert steps[1].counts == {"reward/share_a": 0.5}
    assert caplog.text.count("log_extra('texts', ...)") == 1  # text is not kept, and that is said once
    assert [p for p in steps[1].parts] == [{"chars": 1}, {"chars": 2}, {"chars": 3}, {"chars": 1}]


def test_a_routed_trl_function_sees_only_its_sources_samples(rewards):
    rows = [{"data_source": "mine"}, {"data_source": "other"}, {"data_source": "mine"}]
    routed = build_reward(rewards("plain"), routes={"mine": rewards("sizes")})
    scored = RewardScorer(routed).score(["p"] * 3, ["a", "b", "c"], rows)
    assert scored.scores == [2.0, 1.0, 2.0]


def test_completion_ids_and_trainer_state_reach_the_batched_call(rewards):
    ctx = [SampleContext(completion_ids=list(range(k)), trainer_state=TrainerState(global_step=2)) for k in (3, 5)]
    scored = RewardScorer(build_reward(rewards("only_ids"))).score(["p", "p"], ["x", "y"], [{}, {}], ctx)
    assert scored.scores == [3.0, 5.0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batched_call_fails_its_samples_as_a_per_sample_call_would(rewards, workers):
    step = two_steps(rewards("holes"), group({}), workers)[0]
    assert (step.nones, step.errors, step.scores) == (1, 1, [0.0, 0.0, 1.0, 1.0])
    assert "'x' for this completion" in step.first_error
    step = two_steps(rewards("raises"), group({}), workers)[0]
    assert step.errors == 4 and "the batch broke" in step.first_error and "raise ValueError" in step.first_error
    step = two_steps(rewards("short"), group({}), workers)[0]
    assert step.errors == 4 and "one score per completion; for 4 completion(s) it returned [1.0]" in step.first_error


def test_a_batched_call_over_the_timeout_times_out_its_samples(rewards):
    with RewardScorer(build_reward(rewards("sleeps")), timeout_s=0.5) as scorer:
        scored = scorer.score(["p"] * 3, ["a", "b", "c"], [{}] * 3)
    assert scored.timeouts == 3 and scored.scores == [0.0] * 3


def test_reward_style_per_function(rewards, tmp_path):
    fn = build_reward(rewards("any_shape", "plain"), style=["trl", "grpoflow"])
    assert RewardScorer(fn).score(["p", "p"], ["ab", "abc"], [{}, {}]).scores == [3.0, 4.0]
    with pytest.raises(UserError, match="has 1 entries for 2 reward function"):
        build_reward(rewards("any_shape", "plain"), style=["trl"])
    cfg = load_config(None, ["model.path=/m", f"reward.functions=[{rewards('plain')},length]",
                             "reward.style=[grpoflow,auto]"])
    assert cfg.reward.style == ["grpoflow", "auto"]
    check_config_values(cfg)
    with pytest.raises(ConfigError, match="reward.style has 1 entries for 2 reward.functions"):
        check_config_values(load_config(None, ["model.path=/m", f"reward.functions=[{rewards('plain')},length]",
                                               "reward.style=[grpoflow]"]))


@pytest.mark.parametrize("workers", [0, 2])
def test_what_trl_and_verl_accept_as_scores_is_accepted(rewards, workers, caplog):
    rows = group({"data_source": "mine", "reward_model": {"ground_truth": "1"}})
    names = ["bools", "ones", "generated", "verl_numpy"]
    with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
        step = two_steps(rewards(*names), rows, workers)[1]   # as parts of one reward: one pool of workers
        if workers == 0:                                      # and each alone
            assert [two_steps(rewards(n), rows, 0)[1].scores for n in names] == \
                [[1.0, 0.0, 0.0, 1.0], [1.0] * 4, [1.0, 2.0, 3.0, 1.0], [1.0] * 4]
    assert step.errors == 0 and step.scores == [4.0, 4.0, 5.0, 4.0]
    assert step.parts[1] == {"bools": 0.0, "ones": 1.0, "generated": 2.0, "verl_numpy": 1.0}
    assert not caplog.records


def test_plain_values():
    assert [plain_score(v) for v in (True, np.float32(0.5), np.int64(3), np.array([2.0]), np.array(4.0),
                                     torch.tensor(1.5), torch.tensor([True]), fractions.Fraction(1, 4))] == \
        [1.0, 0.5, 3, 2.0, 4.0, 1.5, 1.0, 0.25]
    assert plain_score({"score": np.float64(1.0), "ok": np.bool_(True), "route": "a"}) == \
        {"score": 1.0, "ok": 1.0, "route": "a"}
    assert plain_score(np.ones(2)).shape == (2,)  # two numbers are no score: left for the scorer to report
    assert plain_scores(np.ones(2)) == [1.0, 1.0] and plain_scores(torch.tensor([0, 1])) == [0, 1]
    assert plain_scores(x > 0 for x in (1, -1)) == [1.0, 0.0] and plain_scores((1, None)) == [1, None]
    assert plain_scores(1.0) == 1.0 and plain_scores("ab") == "ab"


def test_a_part_alike_on_every_sample_of_the_first_steps_warns_once():
    def run(rel_values):
        warnings: list[str] = []
        health = RewardHealth("reward.functions=[a, rel]", lambda e: "", 0.5, warnings.append, parts=["a", "rel"])
        for step, rel in enumerate(rel_values, 1):
            parts = [{"a": float(i % 2), "rel": r} for i, r in enumerate(rel)]
            scores = [p["a"] + p["rel"] for p in parts]
            health.check(step, Scores(scores, parts=parts), torch.tensor(scores), torch.tensor([0, 0, 1, 1]))
        return warnings

    warnings = run([[0.0] * 4] * 5)  # `a` varies, `rel` is 0 everywhere
    assert len(warnings) == 1 and "reward part(s) rel (last 0)" in warnings[0] and "a (last" not in warnings[0]
    assert run([[0.0] * 4, [0.0, 0.5, 0.0, 0.0], [0.0] * 4]) == []  # it varied on step 2
