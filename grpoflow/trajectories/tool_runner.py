"""Running the model's tool calls: every call bounded, every failure a short message the model can read.

`ToolRunner(tools, timeout_s=, cpu_time_s=, memory_mb=, max_output_chars=, workers=)` runs one
assistant turn's calls concurrently and returns one `ToolResult(content, status)` per call, in
order. `content` is the tool message for the model; `status` is what the agent loop counts:

    ok       the tool returned; content is its result (str as is, dict/list as JSON, else str())
    error    unknown tool, arguments that do not bind to its signature, the tool raised, its
             output (return value, or for `python` everything it printed) is over
             `max_output_chars` (reported with its size, never silently cut), or its worker died
    timeout  it ran past `timeout_s` of wall-clock time
    killed   it exceeded its CPU-time (`cpu_time_s`) or memory (`memory_mb`) limit

Where a call runs depends on its Tool's `sandboxed` flag:

- sandboxed (untrusted code, e.g. `python`): in one of `workers` worker processes
  (grpoflow/user_code.py, shared with reward scoring, with `sandbox=True`): RLIMIT_CPU and a hard
  RLIMIT_AS, no fork, a minimal environment, a folder of its own, a uid of its own (never root)
  (grpoflow/sandbox.py). Its reply is JSON data checked to be a (status, content) pair, never
  unpickled. A worker that times out, dies, exceeds a limit or breaks the reply protocol is SIGKILLed
  and replaced, and the other calls go on. It can still read world-readable files and use the network
  (docs/multi-turn.md, "What the sandbox stops").
- trusted (`sandboxed=False`, e.g. `calculator`): in a daemon thread of this process, bounded by
  the same wall-clock timeout. Python cannot stop a thread, so on timeout the thread is abandoned:
  it runs on in the background (logged), holding what it holds, until it returns or the process ends.
  Mark a tool trusted only if it cannot hang or misbehave.

Each call's `timeout_s` counts from when it starts; with more sandboxed calls than `workers`, later
ones wait for a free worker, so a turn of n calls takes at most ceil(n / workers) * timeout_s (+ the
start of replacement workers).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from grpoflow.data.tool_format import ToolCall
from grpoflow.errors import UserError
from grpoflow.trajectories.tools import Tool
from grpoflow.user_code import Outcome, ResourceLimits, UserCodeProcesses, dumps_function

log = logging.getLogger("grpoflow.tools")

STATUSES = ("ok", "error", "timeout", "killed")
_MESSAGE_CHARS = 500  # an exception's text in an error message is cut here (it is ours to shorten)


@dataclass
class ToolResult:
    """What one call gives back: `content` for the model's tool message, `status` in STATUSES."""

    content: str
    status: str


class ToolRunner:
    """Runs tool calls with limits; see the module docstring. Owns worker processes: `close()` it
    (or use it as a context manager); they are also killed on garbage collection or interpreter exit.

    Args:
        tools: the tools the model may call (names must be unique).
        timeout_s: wall-clock limit of one call, in seconds.
        cpu_time_s: CPU-time limit of one sandboxed call, in seconds (user + system time of its worker).
        memory_mb: address-space limit of a sandboxed worker process, interpreter and imports included
            (a bare worker reserves about 100 MB, most of it unused; tools that import numpy or torch need
            far more).
        max_output_chars: the most characters a result may have; a longer one is an error.
        workers: worker processes for sandboxed tools (started only if there is one).
    """

    def __init__(self, tools: list[Tool], *, timeout_s: float = 10.0, cpu_time_s: float = 10.0,
                 memory_mb: int = 1024, max_output_chars: int = 10_000, workers: int = 2):
        if not timeout_s > 0:
            raise UserError(f"tool timeout_s={timeout_s!r} must be a positive number of seconds.")
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise UserError(f"max_output_chars={max_output_chars!r} must be a positive int.")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UserError(f"tool workers={workers!r} must be an int >= 1.")
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise UserError(f"two tools are named {tool.name!r}; the model calls tools by name, so names must "
                                f"be unique.")
            self.tools[tool.name] = tool
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars
        limits = ResourceLimits(cpu_time_s=cpu_time_s, memory_mb=memory_mb)
        self._trusted = {t.name: t.fn for t in tools if not t.sandboxed}
        self._pool = _start_pool([t for t in tools if t.sandboxed], max_output_chars, limits, workers)
        self._lock = threading.Lock()  # the pool serves one run at a time

    @property
    def schemas(self) -> list[dict]:
        """The tools' schemas, for `tokenizer.apply_chat_template(..., tools=runner.schemas)`."""
        return [tool.schema for tool in self.tools.values()]

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the sandbox workers (empty without sandboxed tools); a replaced worker gets a new one."""
        return self._pool.pids if self._pool is not None else []

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """One ToolResult per call, in order; the calls run concurrently, each bounded by `timeout_s`.

        Thread-safe, but runs from several threads take turns: to use every worker, pass the calls
        of all trajectories of a turn in one run().
        """
        with self._lock:
            return self._run(calls)

    def _run(self, calls: list[ToolCall]) -> list[ToolResult]:
        results: list[ToolResult | None] = [None] * len(calls)
        threads: list[tuple[int, _ThreadCall]] = []
        sandboxed: list[int] = []
        for i, call in enumerate(calls):
            problem = self._problem(call)
            if problem is not None:
                results[i] = ToolResult(problem, "error")
            elif call.name in self._trusted:
                threads.append((i, _ThreadCall(self._trusted, self.max_output_chars, call)))
            else:
                sandboxed.append(i)
        if sandboxed:
            assert self._pool is not None  # a sandboxed tool exists, so the pool was started
            outcomes = self._pool.run([((calls[i].name, calls[i].arguments), {}) for i in sandboxed], self.timeout_s)
            for i, outcome in zip(sandboxed, outcomes):
                results[i] = self._from_outcome(calls[i].name, outcome)
        for i, thread in threads:
            results[i] = thread.result(self.timeout_s)
        return results  # type: ignore[return-value]  # every slot is filled above

    def close(self) -> None:
        """Kill the worker processes; the runner cannot run sandboxed tools afterwards."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> "ToolRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _problem(self, call: ToolCall) -> str | None:
        """The error message for a call to an unknown tool or with arguments its signature does not take."""
        tool = self.tools.get(call.name)
        if tool is None:
            available = ", ".join(sorted(self.tools)) or "none"
            return f"error: unknown tool {call.name!r}; available: {available}"
        try:
            inspect.signature(tool.fn).bind(**call.arguments)
        except TypeError as e:
            return f"error: bad arguments for tool {call.name!r}: {e}; it takes {_signature(tool)}"
        return None

    def _from_outcome(self, name: str, outcome: Outcome) -> ToolResult:
        kind, info = outcome
        if kind == "ok":
            status, content = info
            return ToolResult(content, status)
        if kind == "timeout":
            return ToolResult(f"error: tool {name!r} timed out after {self.timeout_s:g} s", "timeout")
        if kind == "killed":
            return ToolResult(f"error: tool {name!r} was stopped: {info}", "killed")
        last_line = str(info).strip().splitlines()[-1] if str(info).strip() else "no details"
        return ToolResult(f"error: tool {name!r} failed: {_clip(last_line)}", "error")


def call_tool(tools: dict[str, Callable], max_output_chars: int, name: str, arguments: dict) -> tuple[str, str]:
    """(status, content) of tools[name](**arguments): runs in a worker process or a thread.

    A MemoryError propagates: in a worker it is the memory limit (user_code.py reports "killed").
    """
    try:
        value = tools[name](**arguments)
    except MemoryError:
        raise
    except BaseException as e:  # SystemExit too: a tool must not end the worker or the trainer
        return "error", f"error: tool {name!r} raised {type(e).__name__}: {_clip(str(e))}"
    try:
        content = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)
    except (TypeError, ValueError) as e:
        return "error", (f"error: tool {name!r} returned a {type(value).__name__} that is not JSON ({_clip(str(e))});"
                         f" return a str, or a dict/list of JSON values")
    if len(content) > max_output_chars:
        return "error", (f"error: tool {name!r} output was {len(content)} chars, over the limit of "
                         f"{max_output_chars} chars; ask for less output")
    return "ok", content


class _ThreadCall:
    """One trusted call in a daemon thread (a thread that outlives its timeout is abandoned, not joined)."""

    def __init__(self, tools: dict[str, Callable], max_output_chars: int, call: ToolCall):
        self.name, self.started = call.name, time.monotonic()
        self._done = threading.Event()
        self._result: tuple[str, str] = ("error", f"error: tool {call.name!r} did not finish")
        threading.Thread(target=self._run, args=(tools, max_output_chars, call), daemon=True,
                         name=f"tool-{call.name}").start()

    def _run(self, tools: dict[str, Callable], max_output_chars: int, call: ToolCall) -> None:
        try:
            self._result = call_tool(tools, max_output_chars, call.name, call.arguments)
        except BaseException as e:  # the MemoryError call_tool passes on for workers
            self._result = "error", f"error: tool {call.name!r} raised {type(e).__name__}: {_clip(str(e))}"
        finally:
            self._done.set()

    def result(self, timeout_s: float) -> ToolResult:
        if not self._done.wait(max(0.0, self.started + timeout_s - time.monotonic())):
            log.warning("tool %r ran past its %g s timeout in a thread of this process; the thread is abandoned "
                        "and runs on in the background (run the tool sandboxed so it can be killed).",
                        self.name, timeout_s)
            return ToolResult(f"error: tool {self.name!r} timed out after {timeout_s:g} s", "timeout")
        status, content = self._result
        return ToolResult(content, status)


def _start_pool(tools: list[Tool], max_output_chars: int, limits: ResourceLimits,
                workers: int) -> UserCodeProcesses | None:
    """The worker processes for the sandboxed tools (None if there are none)."""
    if not tools:
        return None
    for tool in tools:
        try:
            dumps_function(tool.fn)
        except Exception as e:  # pickling raises PicklingError, AttributeError or TypeError
            raise UserError(
                f"sandboxed tool {tool.name!r} cannot be sent to a worker process ({e}); define it at module level "
                f"in an importable module or a path/to/file.py, or mark it sandboxed=False to run it in this "
                f"process.") from None
    payload = dumps_function(functools.partial(call_tool, {t.name: t.fn for t in tools}, max_output_chars))
    return UserCodeProcesses(payload, workers, limits=limits, label="tool", sandbox=True,
                      validate=functools.partial(_checked_reply, max_output_chars))


def _checked_reply(max_output_chars: int, value: Any) -> tuple[str, str]:
    """The (status, content) a sandboxed worker sent, if call_tool could have made it; ValueError otherwise."""
    if (not isinstance(value, list) or len(value) != 2 or value[0] not in ("ok", "error")
            or not isinstance(value[1], str) or len(value[1]) > max_output_chars + 2 * _MESSAGE_CHARS):
        raise ValueError(f"{str(value)[:100]!r} is not a (status, content) pair of call_tool")
    return value[0], value[1]


def _signature(tool: Tool) -> str:
    """`name(arg: type, opt?: type)` from the tool's schema, for bad-argument messages."""
    parameters = tool.schema["function"].get("parameters", {})
    required = set(parameters.get("required", []))
    args = [f"{arg}{'' if arg in required else '?'}: {spec.get('type', 'any')}"
            for arg, spec in parameters.get("properties", {}).items()]
    return f"{tool.name}({', '.join(args)})"


def _clip(text: str) -> str:
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."
