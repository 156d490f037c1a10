"""Issue 53, finding 2: a tool worker that cannot start fails the calls that needed it, not the run.

A replacement worker's start failure (`UserCodeStartError`, e.g. EAGAIN while a fork bomb's processes are reaped)
propagated out of the tool runner and closed its pool: the run ended. Now the slot tries again with backoff and
the calls made meanwhile are tool errors the model reads.
"""

import textwrap
import time

from grpoflow.data.tool_format import ToolCall
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.tools import load_tools

TOOL = textwrap.dedent('''
    import os
    if os.path.exists({marker!r}):
        raise RuntimeError("this worker cannot start (the test's marker file is there)")


    def echo(text: str) -> str:
        """Echo.

        Args:
            text: what to say
        """
        return text


    def nap(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        import time
        time.sleep(seconds)
        return "slept"
''')


def test_a_replacement_that_cannot_start_makes_tool_errors_until_one_starts(tmp_path):
    marker = tmp_path / "broken"
    (tmp_path / "flaky_tool.py").write_text(TOOL.format(marker=str(marker)))
    tools = load_tools([f"{tmp_path}/flaky_tool.py:echo", f"{tmp_path}/flaky_tool.py:nap"])
    with ToolRunner(tools, timeout_s=1.0, workers=1) as runner:
        assert runner.run([ToolCall("echo", {"text": "first"})])[0].content == "first"
        marker.touch()  # from now on a new worker fails while loading the tool
        (timed_out,) = runner.run([ToolCall("nap", {"seconds": 30})])  # its worker is killed; no replacement starts
        assert timed_out.status == "timeout"
        (meanwhile,) = runner.run([ToolCall("echo", {"text": "meanwhile"})])
        assert meanwhile.status == "error" and "no tool worker process is running" in meanwhile.content, meanwhile
        marker.unlink()
        time.sleep(1.2)  # past the second try's backoff (0.5 s, then 1 s)
        assert runner.run([ToolCall("echo", {"text": "again"})])[0].content == "again"
