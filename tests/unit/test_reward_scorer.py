"""RewardScorer: worker processes with a per-call timeout, async functions, and the in-process fallback.

Wall-time bounds are loose (timeout + SLACK) so a loaded 2-core machine does not make them flaky;
what they catch is a step that waits for a hung call (which would never finish).
"""

import asyncio
import logging
import os
import textwrap
import time

import pytest

from grpoflow.rewards import (CombinedReward, RewardScorer, Scores, build_reward, exact_match, length,
                              load_reward_function, score_completions)

TIMEOUT = 0.5
SLACK = 3.0

USER_FUNCTIONS = textwrap.dedent("""
    import os, subprocess, time

    def behave(prompt, completion, **row):
        '''Scores len(completion) after `delay` seconds, or misbehaves as the completion says.'''
        time.sleep(row.get("delay", 0.0))
        if completion == "sleep":
            time.sleep(1e9)
        if completion == "spin":
            while True:
                pass
        if completion == "raise":
            raise RuntimeError("cannot parse this one")
        if completion == "none":
            return None
        if completion == "nan":
            return float("nan")
        if completion == "exit":
            os._exit(3)
        if completion == "exit_python":
            raise SystemExit(1)
        if completion == "child":  # start a subprocess, then hang: both must be stopped
            proc = subprocess.Popen(["sleep", "1000"])
            with open(row["pid_file"], "w") as f:
                f.write(str(proc.pid))
            time.sleep(1e9)
        return {"score": float(len(completion)), "pid": float(os.getpid())}
""")


@pytest.fixture(scope="module")
def behave(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward_fns") / "scorer_user_fns.py"
    path.write_text(USER_FUNCTIONS)
    return load_reward_function(f"{path}:behave")


def run(scorer, completions, rows=None):
    rows = rows if rows is not None else [{} for _ in completions]
    start = time.monotonic()
    result = scorer.score(["p"] * len(completions), completions, rows)
    return result, time.monotonic() - start


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, within: float = 3.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- worker processes


def test_pool_scores_in_input_order_with_all_workers(behave):
    completions = [f"{'x' * (i % 7)}" for i in range(24)]
    # later samples finish first, so results arrive out of order
    rows = [{"delay": 0.02 * ((24 - i) % 4)} for i in range(24)]
    with RewardScorer(behave, timeout_s=10.0, workers=2) as scorer:
        assert scorer.uses_processes
        result, _ = run(scorer, completions, rows)
    assert result.scores == [float(len(c)) for c in completions]
    assert result.errors == result.nones == result.timeouts == 0
    assert len({int(p) for p in result.extras["pid"]}) == 2  # both workers took samples
    assert all(int(p) != os.getpid() for p in result.extras["pid"])


def test_hung_calls_time_out_without_stalling_the_step(behave, caplog):
    completions = ["ab", "sleep", "abc", "spin", "a"]
    with RewardScorer(behave, timeout_s=TIMEOUT, workers=2, error_score=-1.0) as scorer:
        with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
            result, wall = run(scorer, completions)
    assert wall < TIMEOUT + SLACK
    assert result.scores == [2.0, -1.0, 3.0, -1.0, 1.0]
    assert result.timeouts == 2 and result.errors == 0 and result.nones == 0
    assert result.metrics()["reward/timeouts"] == 2.0
    assert any("timed out on 2 of 5" in r.getMessage() for r in caplog.records)


def test_pool_keeps_working_after_timeouts(behave):
    with RewardScorer(behave, timeout_s=TIMEOUT, workers=2) as scorer:
        before = set(scorer.worker_pids)
        result, wall = run(scorer, ["sleep", "sleep", "x"])
        assert result.timeouts == 2 and result.scores[2] == 1.0
        assert wall < 2 * TIMEOUT + SLACK  # two hung calls on two workers, at most two rounds
        replaced = before - set(scorer.worker_pids)
        assert replaced and all(wait_dead(pid) for pid in replaced)  # the hung workers were killed
        for _ in range(2):  # later batches run on the replacements, with no timeouts
            result, wall = run(scorer, ["abc", "de", "f", "ghij"])
            assert result.scores == [3.0, 2.0, 1.0, 4.0] and result.timeouts == 0
            assert wall < SLACK


def test_failures_in_workers_are_counted(behave, caplog):
    completions = ["raise", "none", "nan", "ok", "exit_python", "exit", "abc"]
    with RewardScorer(behave, timeout_s=5.0, workers=2, error_score=-2.0) as scorer:
        with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
            result, _ = run(scorer, completions)
        assert result.scores == [-2.0, -2.0, -2.0, 2.0, -2.0, -2.0, 3.0]
        # raise, nan, SystemExit and a dead process (os._exit) are errors; None is counted apart
        assert result.errors == 4 and result.nones == 1 and result.timeouts == 0
        text = "\n".join(r.getMessage() for r in caplog.records)
        assert "failed on 4 of 7" in text and "cannot parse this one" in text
        again, _ = run(scorer, ["xy"])  # the worker that died was replaced
        assert again.scores == [2.0]


def test_timeout_also_stops_subprocesses_of_the_call(behave, tmp_path):
    pid_file = tmp_path / "pid"
    with RewardScorer(behave, timeout_s=TIMEOUT + 0.5, workers=1) as scorer:
        result, wall = run(scorer, ["child"], [{"pid_file": str(pid_file)}])
    assert result.timeouts == 1 and wall < TIMEOUT + 0.5 + SLACK
    assert wait_dead(int(pid_file.read_text()))


def test_close_kills_the_workers(behave):
    scorer = RewardScorer(behave, timeout_s=1.0, workers=2)
    pids = scorer.worker_pids
    assert all(alive(pid) for pid in pids)
    scorer.close()
    assert all(wait_dead(pid) for pid in pids)


def test_builtin_and_combined_functions_run_in_workers(behave):
    fn = build_reward(["gsm8k", "format"], weights=[1.0, 0.5])
    with RewardScorer(fn, timeout_s=5.0, workers=1) as scorer:
        assert scorer.uses_processes
        result, _ = run(scorer, ["<think>.</think><answer>#### 4</answer>", "#### 5"], [{"answer": "4"}] * 2)
    assert result.scores == [1.5, 0.0]
    assert result.extras == {"gsm8k": [1.0, 0.0], "format": [1.0, 0.0]}
    # a file-loaded function inside a CombinedReward is sent by its file path
    combined = CombinedReward([("length", length), ("exact_match", exact_match), ("behave", behave)])
    with RewardScorer(combined, timeout_s=5.0, workers=1) as scorer:
        assert scorer.uses_processes
        result, _ = run(scorer, ["abc"], [{"answer": "abc"}])
    assert result.scores == [3.0 + 1.0 + 3.0]


def test_unpicklable_function_falls_back_to_this_process(caplog):
    offset = 10.0
    with caplog.at_level(logging.WARNING, logger="grpoflow.reward"):
        scorer = RewardScorer(lambda prompt, completion, **row: offset + len(completion), timeout_s=1.0, workers=2)
    assert not scorer.uses_processes
    assert any("cannot be sent to worker processes" in r.getMessage() for r in caplog.records)
    result, _ = run(scorer, ["a", "bb"])
    assert result.scores == [11.0, 12.0]


def test_a_timeout_alone_starts_the_worker_it_needs(behave):
    # A user who asks for a timeout expects it to work (it used to be refused without reward.workers).
    with RewardScorer(behave, timeout_s=TIMEOUT, error_score=-1.0) as scorer:
        assert scorer.workers == 1
        result, wall = run(scorer, ["ab", "sleep", "a"])
    assert wall < TIMEOUT + SLACK
    assert result.scores == [2.0, -1.0, 1.0] and result.timeouts == 1
    assert all(int(p) != os.getpid() for p in result.extras["pid"])  # scored in the worker process


@pytest.mark.parametrize("kwargs, message", [({"workers": -1}, "workers=-1"), ({"timeout_s": 0}, "timeout_s=0")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardScorer(lambda p, c, **r: 1.0, **kwargs)


def test_in_process_default_is_serial_and_keeps_order():
    seen = []

    def fn(prompt, completion, **row):
        seen.append(completion)
        return float(row["i"])

    scorer = RewardScorer(fn)
    assert not scorer.uses_processes
    result, _ = run(scorer, ["a", "b", "c"], [{"i": 0}, {"i": 1}, {"i": 2}])
    assert result.scores == [0.0, 1.0, 2.0] and seen == ["a", "b", "c"]


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="got 2, 1 and 2"):
        RewardScorer(lambda p, c, **r: 1.0).score(["p", "p"], ["c"], [{}, {}])


# ---------------------------------------------------------------- async functions


async def slow_len(prompt, completion, **row):
    await asyncio.sleep(row.get("delay", 0.2))
    if completion == "raise":
        raise RuntimeError("async failure")
    if completion == "none":
        return None
    return float(len(completion))


def test_async_function_runs_concurrently_in_order():
    completions = [f"{'y' * i}" for i in range(10)]
    rows = [{"delay": 0.3 - 0.02 * i} for i in range(10)]  # later ones finish first
    result, wall = run(RewardScorer(slow_len), completions, rows)
    assert result.scores == [float(i) for i in range(10)]
    assert wall < 0.3 * 10 / 2  # concurrent: far less than the 1.5 s that calling them in turn takes


def test_async_timeout_and_failures():
    rows = [{"delay": 0.01}, {"delay": 100.0}, {"delay": 0.01}, {"delay": 0.01}]
    scorer = RewardScorer(slow_len, timeout_s=TIMEOUT, error_score=-1.0)
    result, wall = run(scorer, ["ab", "forever", "raise", "none"], rows)
    assert wall < TIMEOUT + SLACK
    assert result.scores == [2.0, -1.0, -1.0, -1.0]
    assert result.timeouts == 1 and result.errors == 1 and result.nones == 1


def test_async_workers_bound_calls_in_flight():
    state = {"now": 0, "max": 0}

    async def fn(prompt, completion, **row):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        return 1.0

    result, _ = run(RewardScorer(fn, workers=3), ["c"] * 12)
    assert result.scores == [1.0] * 12 and state["max"] == 3


def test_async_function_scored_from_inside_a_running_event_loop():
    async def main():
        return RewardScorer(slow_len, timeout_s=5.0).score(["p", "p"], ["a", "bcd"], [{"delay": 0.01}] * 2)

    assert asyncio.run(main()).scores == [1.0, 3.0]


def test_score_completions_accepts_async_functions():
    assert score_completions(slow_len, ["p"], ["abc"], [{"delay": 0.0}]).scores == [3.0]


# ---------------------------------------------------------------- Scores


def test_merge_adds_timeouts():
    merged = Scores([1.0], timeouts=1, errors=1).merge(Scores([0.0, 2.0], timeouts=2, nones=1))
    assert merged.scores == [1.0, 0.0, 2.0]
    assert (merged.timeouts, merged.errors, merged.nones) == (3, 1, 1)
    assert merged.metrics()["reward/timeouts"] == 3.0
