"""The sandboxed `python` tool's cost: a ToolRunner's start and its time per call (`print(1)`, one worker).

    python bench/sandbox_call.py [--calls 50] [--rounds 5]

Prints the start (the pool's first worker, with the sandbox's checks) and the milliseconds per call of each round
of `--calls` calls in a row, and their median. docs/performance.md, "The sandboxed tool's cost per call", has the
figures; run it under `flock /tmp/grpoflow-cpu.lock` with OMP_NUM_THREADS=1, and compare trees by PYTHONPATH.
"""

from __future__ import annotations

import argparse
import statistics
import time

from grpoflow.data.tool_format import ToolCall
from grpoflow.trajectories.builtin_tools import python
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.tools import Tool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tool = Tool("python", python, {"type": "function", "function": {"name": "python"}}, sandboxed=True)
    call = ToolCall("python", {"code": "print(1)"})
    began = time.perf_counter()
    with ToolRunner([tool], workers=1) as runner:
        start_ms = (time.perf_counter() - began) * 1000
        runner.run([call])  # the first call after the start is not timed
        rounds = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            for _ in range(args.calls):
                (result,) = runner.run([call])
                assert result.content == "1\n", result
            rounds.append((time.perf_counter() - t) / args.calls * 1000)
    print(f"start {start_ms:.0f} ms; ms per call by round: {[round(r, 2) for r in rounds]}; "
          f"median {statistics.median(rounds):.2f} ms")


if __name__ == "__main__":
    main()
