"""The tool-call format: how a model writes a tool call in its text, once per format.

A format is one registry entry, a `ToolFormat` that holds the three things every caller needs together:

    parse(text) -> ParsedCalls    the calls in an assistant message, and one error sentence per malformed call
    render(call) -> str           one call as the model writes it (demonstrations, an agent's earlier calls)
    strip(text) -> str            the message's text outside its calls (an OpenAI reply's `content`)

`TOOL_FORMATS` maps a name (rollout.multi_turn.tool_parser) to a function that returns the format; a user's
format is named as `path/to/file.py:function`, a function of no arguments that returns a `ToolFormat`.
`tool_format(name)` looks one up; an unknown name is an error that lists the known ones. The built-in,
`hermes`, is the Hermes/ChatML format that Qwen2.5, Qwen3 and Hermes chat templates teach the model:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 2"}}
    </tool_call>

anywhere in the assistant's text, any number of times. A call that cannot be used becomes one entry of
`errors`, a sentence meant to go back to the model as a tool message, so that it can correct itself; parsing
never raises on model text. For every format, `parse(prefix + render(a) + render(b))` is `[a, b]` and `strip`
of that text is the prefix (tests/unit/test_tool_format.py).

Standard library only (with `plugins`): demonstrations in `tasks` and trajectories in `trajectories` both use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.errors import UserError
from grpoflow.plugins import Registry

TOOL_FORMATS = Registry("tool format")

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_SNIPPET_CHARS = 80


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the tool's name and its keyword arguments."""

    name: str
    arguments: dict


@dataclass
class ParsedCalls:
    """The well-formed calls of one assistant message, in order, and one message per malformed call."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ToolFormat:
    """How tool calls are written in a model's text (module docstring): read, written, and cut out."""

    name: str
    parse: Callable[[str], ParsedCalls]
    render: Callable[[ToolCall], str]
    strip: Callable[[str], str]


def tool_format(name: str) -> ToolFormat:
    """The format registered as `name` (or returned by the function a `path/to/file.py:function` names).

    Raises:
        UserError: the name is unknown (the message lists the known ones), or the function does not return a
            ToolFormat.
    """
    made = TOOL_FORMATS.resolve(name)()
    if not isinstance(made, ToolFormat):
        raise UserError(f"tool format {name!r} returned {type(made).__name__}, not a ToolFormat: a tool format is a "
                        "function of no arguments returning ToolFormat(name, parse, render, strip) "
                        "(grpoflow/data/tool_format.py).")
    return made


@TOOL_FORMATS.register("hermes")
def hermes() -> ToolFormat:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (module docstring)."""
    return HERMES


def parse_hermes(text: str) -> ParsedCalls:
    """The `<tool_call>` blocks of `text`; "arguments" may be a JSON string.

    A block opened and not closed (before the text ends or the next `<tool_call>`) is an error.
    """
    result = ParsedCalls()
    start = text.find(_OPEN)
    while start != -1:
        number = len(result.calls) + len(result.errors) + 1
        body_start = start + len(_OPEN)
        end, reopen = text.find(_CLOSE, body_start), text.find(_OPEN, body_start)
        if end == -1 or -1 < reopen < end:
            where = "the text ends" if end == -1 else "the next <tool_call>"
            result.errors.append(f"tool call {number}: <tool_call> is not closed by </tool_call> before {where}: "
                                 f"{_snippet(text[body_start:reopen if reopen != -1 else len(text)])}")
            start = reopen
            continue
        call = _call_from_json(text[body_start:end], number)
        if isinstance(call, ToolCall):
            result.calls.append(call)
        else:
            result.errors.append(call)
        start = text.find(_OPEN, end + len(_CLOSE))
    return result


def render_hermes(call: ToolCall) -> str:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as the model writes it. A tag inside an argument
    is written with a JSON escape (`\\u003ctool_call>`, `<\\/tool_call>`), so that it neither opens nor closes a
    block and still parses back to the same string."""
    body = json.dumps({"name": call.name, "arguments": call.arguments})
    body = body.replace(_OPEN, "\\u003c" + _OPEN[1:]).replace(_CLOSE, "<\\/" + _CLOSE[2:])
    return f"{_OPEN}{body}{_CLOSE}"


def strip_hermes(text: str) -> str:
    """`text` without its closed `<tool_call>` blocks, stripped of the space around what is left (an unclosed
    block is kept: it is not a call)."""
    kept, at = [], 0
    while (start := text.find(_OPEN, at)) != -1:
        end = text.find(_CLOSE, start)
        if end == -1:
            break
        kept.append(text[at:start])
        at = end + len(_CLOSE)
    kept.append(text[at:])
    return "".join(kept).strip()


HERMES = ToolFormat("hermes", parse=parse_hermes, render=render_hermes, strip=strip_hermes)


def _call_from_json(body: str, number: int) -> ToolCall | str:
    """The ToolCall in one block's JSON body, or the error message for call `number`."""
    prefix = f"tool call {number}"
    try:
        value: Any = json.loads(body)
    except json.JSONDecodeError as e:
        return f"{prefix}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}): {_snippet(body)}"
    if not isinstance(value, dict):
        return f'{prefix}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {_snippet(body)}'
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return f'{prefix}: missing "name" (the tool\'s name as a string): {_snippet(body)}'
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return f'{prefix} ({name}): "arguments" is a string that is not valid JSON ({e.msg}): {_snippet(body)}'
    if not isinstance(arguments, dict):
        return f'{prefix} ({name}): "arguments" must be a JSON object of argument names to values, ' \
               f'got {_snippet(json.dumps(arguments))}'
    return ToolCall(name=name, arguments=arguments)


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."
