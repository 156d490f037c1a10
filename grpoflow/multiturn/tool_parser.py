"""Tool calls parsed from the model's text, and what was wrong with the ones that could not be parsed.

A parser is a function `(text: str) -> ParsedCalls`, registered in `TOOL_PARSERS` (or named as
`path/to/file.py:function`). The default, `hermes`, reads the Hermes/ChatML format that Qwen2.5,
Qwen3 and Hermes chat templates teach the model:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 2"}}
    </tool_call>

anywhere in the assistant's text, any number of times. A call that cannot be used becomes one
entry of `errors`, a sentence meant to go back to the model as a tool message, so that it can
correct itself; parsing never raises on model text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.plugins import Registry

TOOL_PARSERS = Registry("tool parser")

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


def parse_tool_calls(text: str, parser: str = "hermes") -> ParsedCalls:
    """The tool calls in `text`, read by the parser registered as `parser` (or a `file.py:function`)."""
    parse: Callable[[str], ParsedCalls] = TOOL_PARSERS.resolve(parser)
    return parse(text)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedCalls:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; "arguments" may be a JSON string.

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
