"""ToolRunner: every misbehaving tool call ends within its limit as a clear message, and the runner goes on.

Wall-time bounds are loose (limit + SLACK) so a loaded 2-core machine does not make them flaky; what
they catch is a turn that waits for a hung call, which would never end.
"""

import json
import os
import textwrap
import time

import pytest

from grpoflow.data.tool_format import ToolCall
from grpoflow.trajectories.tool_runner import STATUSES, ToolResult, ToolRunner
from grpoflow.trajectories.tools import load_tools, tool_from_function

TIMEOUT = 1.0
SLACK = 2.0
MEMORY_MB = 200
MAX_CHARS = 1000

USER_TOOLS = textwrap.dedent('''
    import os, time

    def behave(how: str) -> object:
        """A tool that misbehaves as asked.

        Args:
            how: What to do.
        """
        if how == "raise":
            raise ValueError("no such city")
        if how == "hang":
            time.sleep(100)
        if how == "spin":
            while True:
                pass
        if how == "allocate":
            return len(bytearray(10**9))  # 1 GB, over the memory limit
        if how == "big":
            return "x" * 5000
        if how == "dict":
            return {"pid": os.getpid(), "ok": True}
        if how == "exit":
            os._exit(3)
        if how == "interval":  # when it ran, to see calls overlap
            start = time.time()
            time.sleep(0.5)
            return [start, time.time(), os.getpid()]
        return how

    def trusted(how: str) -> str:
        """The same, run in the trainer's process.

        Args:
            how: What to do.
        """
        if how == "hang":
            time.sleep(30)  # abandoned after the timeout; a daemon thread, ends with the test process
        if how == "big":
            return "y" * 5000
        if how == "pid":
            return str(os.getpid())
        if how == "raise":
            raise KeyError("missing")
        return how
''')


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "runner_tools.py"
    path.write_text(USER_TOOLS)
    behave, trusted = load_tools([f"{path}:behave", f"{path}:trusted"])
    return [behave, tool_from_function(trusted.fn, sandboxed=False), *load_tools(["calculator", "python"])]


@pytest.fixture(scope="module")
def runner(tools):
    with ToolRunner(tools, timeout_s=TIMEOUT, cpu_time_s=TIMEOUT, memory_mb=MEMORY_MB, max_output_chars=MAX_CHARS,
                    workers=2) as runner:
        yield runner


def run(runner, *calls):
    start = time.monotonic()
    results = runner.run([ToolCall(name, args) for name, args in calls])
    return results, time.monotonic() - start


def behave(how):
    return "behave", {"how": how}


def test_ok_results_in_order_and_json_for_dicts(runner):
    results, _ = run(runner, behave("a"), ("calculator", {"expression": "6 * 7"}), behave("dict"),
                     ("python", {"code": "print('hi')\n1 + 1"}), ("trusted", {"how": "b"}))
    assert [r.status for r in results] == ["ok"] * 5
    assert [results[i].content for i in (0, 1, 3, 4)] == ["a", "42", "hi\n2\n", "b"]
    pid = json.loads(results[2].content)["pid"]  # ran in a process forked by a worker for this call alone
    assert pid not in [os.getpid()] + runner.worker_pids


def test_trusted_tools_run_in_this_process(runner):
    (result,), _ = run(runner, ("trusted", {"how": "pid"}))
    assert result == ToolResult(str(os.getpid()), "ok")


def test_sandboxed_calls_run_concurrently(runner):
    results, _ = run(runner, behave("interval"), behave("interval"))
    (start1, end1, pid1), (start2, end2, pid2) = (eval(r.content) for r in results)
    assert pid1 != pid2 and start2 < end1 and start1 < end2  # two workers, overlapping in time


def test_a_tool_that_raises(runner):
    results, _ = run(runner, behave("raise"), ("trusted", {"how": "raise"}), ("calculator", {"expression": "1/0"}))
    assert results == [
        ToolResult("error: tool 'behave' raised ValueError: no such city", "error"),
        ToolResult("error: tool 'trusted' raised KeyError: 'missing'", "error"),
        ToolResult("error: tool 'calculator' raised ValueError: division by zero.", "error"),
    ]


def test_unknown_tool_and_bad_arguments(runner):
    results, _ = run(runner, ("search", {"q": "x"}), ("calculator", {}), ("calculator", {"expression": "1", "x": 2}))
    assert results == [
        ToolResult("error: unknown tool 'search'; available: behave, calculator, python, trusted", "error"),
        ToolResult("error: bad arguments for tool 'calculator': missing a required argument: 'expression'; "
                   "it takes calculator(expression: string)", "error"),
        ToolResult("error: bad arguments for tool 'calculator': got an unexpected keyword argument 'x'; "
                   "it takes calculator(expression: string)", "error"),
    ]


def test_a_hung_call_times_out_and_its_worker_is_replaced(runner):
    before = set(runner.worker_pids)
    results, wall = run(runner, behave("hang"), behave("a"))
    assert wall < TIMEOUT + SLACK
    assert results == [ToolResult(f"error: tool 'behave' timed out after {TIMEOUT:g} s", "timeout"),
                       ToolResult("a", "ok")]
    assert len(before - set(runner.worker_pids)) == 1  # the hung worker was killed and replaced
    results, wall = run(runner, behave("b"), behave("c"))  # the replacement serves the next calls
    assert [r.content for r in results] == ["b", "c"] and wall < SLACK


def test_a_hung_trusted_call_times_out_and_its_thread_is_abandoned(runner):
    results, wall = run(runner, ("trusted", {"how": "hang"}), ("trusted", {"how": "a"}))
    assert wall < TIMEOUT + SLACK
    assert results == [ToolResult(f"error: tool 'trusted' timed out after {TIMEOUT:g} s", "timeout"),
                       ToolResult("a", "ok")]


def test_a_busy_loop_is_killed_at_its_cpu_limit(tools):
    with ToolRunner(tools, timeout_s=20.0, cpu_time_s=1.0, workers=1) as runner:
        results, wall = run(runner, behave("spin"), ("python", {"code": "while True: pass"}))
        stopped = "error: tool '{}' was stopped: it exceeded its CPU-time limit of 1 s"
        assert results == [ToolResult(stopped.format(name), "killed") for name in ("behave", "python")]
        assert wall < 20.0  # stopped by the CPU limit, long before the wall-clock timeout
        (again,), _ = run(runner, behave("after"))  # one worker: the replacement serves the next call
        assert again == ToolResult("after", "ok")


def test_code_that_turns_off_the_cpu_timer_still_meets_rlimit_cpu(tools):
    with ToolRunner(tools, timeout_s=20.0, cpu_time_s=0.5, workers=1) as runner:
        code = "import signal\nsignal.setitimer(signal.ITIMER_PROF, 0)\nwhile True: pass"
        (result,), wall = run(runner, ("python", {"code": code}))
    # RLIMIT_CPU counts whole seconds and is set one second past the timer: stopped after at most ~2 CPU s
    assert result == ToolResult("error: tool 'python' was stopped: it exceeded its CPU-time limit of 0.5 s", "killed")
    assert wall < 20.0


def test_an_allocation_over_the_memory_limit_is_killed_and_the_runner_goes_on(runner):
    before = set(runner.worker_pids)
    results, wall = run(runner, behave("allocate"), ("python", {"code": "x = bytearray(10**9)"}))
    assert results == [
        ToolResult(f"error: tool 'behave' was stopped: it exceeded its memory limit of {MEMORY_MB} MB", "killed"),
        ToolResult(f"error: tool 'python' was stopped: it exceeded its memory limit of {MEMORY_MB} MB", "killed")]
    assert wall < TIMEOUT + SLACK and before - set(runner.worker_pids)  # the workers that hit the limit were replaced
    (again,), _ = run(runner, ("python", {"code": "len(bytearray(10**6))"}))  # 1 MB is fine
    assert again == ToolResult("1000000\n", "ok")


def test_output_over_the_limit_is_an_error_naming_its_size(runner):
    results, _ = run(runner, behave("big"), ("trusted", {"how": "big"}), ("python", {"code": "print('z' * 2000)"}))
    assert results == [
        ToolResult(f"error: tool 'behave' output was 5000 chars, over the limit of {MAX_CHARS} chars; "
                   f"ask for less output", "error"),
        ToolResult(f"error: tool 'trusted' output was 5000 chars, over the limit of {MAX_CHARS} chars; "
                   f"ask for less output", "error"),
        ToolResult(f"error: tool 'python' output was 2001 chars, over the limit of {MAX_CHARS} chars; "
                   f"ask for less output", "error"),  # printed text counts, with its newline
    ]


def test_a_worker_that_dies_is_an_error_and_is_replaced(runner):
    results, _ = run(runner, behave("exit"), behave("a"))
    assert results[0].status == "error" and "died (exit code 3)" in results[0].content
    assert results[1] == ToolResult("a", "ok")
    (again,), _ = run(runner, behave("b"))
    assert again == ToolResult("b", "ok")


def status_counts(results: list[ToolResult]) -> dict[str, int]:
    """How many results have each status, every status present (0 if none)."""
    return {status: sum(r.status == status for r in results) for status in STATUSES}


def test_status_counts_of_a_mixed_batch_are_exact(runner):
    calls = [behave("a"), behave("raise"), behave("hang"), behave("allocate"), behave("big"),
             ("nope", {}), ("calculator", {"expr": "1"}), ("calculator", {"expression": "2+2"}),
             ("trusted", {"how": "hang"}), ("python", {"code": "while True: pass"}), ("python", {"code": "print(1)"})]
    results, wall = run(runner, *calls)
    # hang, spin and the trusted hang each take up to TIMEOUT; two workers share the sandboxed calls
    assert wall < 3 * TIMEOUT + SLACK
    assert [r.status for r in results] == ["ok", "error", "timeout", "killed", "error", "error", "error", "ok",
                                           "timeout", results[9].status, "ok"]
    assert results[9].status in ("killed", "timeout")  # the CPU limit equals the timeout here: either may come first
    counts = status_counts(results)
    assert counts["ok"] == 3 and counts["error"] == 4 and counts["killed"] + counts["timeout"] == 4
    assert sum(counts.values()) == len(calls) and set(counts) == {"ok", "error", "timeout", "killed"}


def test_runs_from_several_threads_take_turns(runner):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as threads:
        results = list(threads.map(lambda i: runner.run([
            ToolCall("behave", {"how": f"t{i}"}), ToolCall("calculator", {"expression": f"{i} * 2"})]), range(6)))
    assert results == [[ToolResult(f"t{i}", "ok"), ToolResult(str(i * 2), "ok")] for i in range(6)]


def test_no_calls_and_only_trusted_tools_start_no_workers(tools):
    with ToolRunner([t for t in tools if not t.sandboxed]) as runner:
        assert runner.worker_pids == [] and runner.run([]) == []
        assert [s["function"]["name"] for s in runner.schemas] == ["trusted", "calculator"]


def test_a_sandboxed_tool_that_cannot_be_sent_is_a_clear_error():
    def local(x: int) -> int:
        """Local.

        Args:
            x: A number.
        """
        return x

    with pytest.raises(ValueError, match="sandboxed tool 'local' cannot be sent to a worker process"):
        ToolRunner([tool_from_function(local)])


def test_duplicate_names_and_bad_settings_are_errors(tools):
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        ToolRunner([tools[2], tools[2]])
    for kwargs, message in [({"timeout_s": 0}, "timeout_s=0"), ({"workers": 0}, "workers=0"),
                            ({"max_output_chars": 0}, "max_output_chars=0"), ({"cpu_time_s": -1}, "cpu_time_s=-1")]:
        with pytest.raises(ValueError, match=message):
            ToolRunner(tools[1:3], **kwargs)


def test_close_kills_the_workers(tools):
    runner = ToolRunner(tools, workers=2)
    pids = runner.worker_pids
    runner.close()
    for pid in pids:
        deadline = time.monotonic() + 3
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}")
