"""Tools the model can call: a plain typed Python function with a Google-style docstring is a tool.

    def word_count(text: str) -> int:
        '''Count the words in a text.

        Args:
            text: The text to count the words of.
        '''
        return len(text.split())

`tool_from_function(word_count)` gives a `Tool` whose `schema` is the OpenAI/HF function schema
that `tokenizer.apply_chat_template(messages, tools=[tool.schema, ...])` renders into the prompt
(built by transformers' `get_json_schema`, so it is exactly what chat templates expect). Tools are
named in the config as `rollout.multi_turn.tools=[path/to/file.py:word_count, calculator]`: a file spec, a
`package.module:function`, or a name registered with `@register_tool`; `load_tools` resolves them.

`sandboxed` says where a call runs (tool_runner.py): True (the default, for code you do not
trust the model's arguments with, or that may hang or blow up) in a worker process with CPU-time,
memory and output limits; False in a thread of this process, bounded only by the wall-clock timeout.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Callable

from grpoflow.errors import UserError
from grpoflow.trajectories.builtin_tools import calculator, python
from grpoflow.plugins import Registry, fn_name, is_file_spec

TOOLS = Registry("tool")
_MODULE_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<fn>[A-Za-z_]\w*)$")


@dataclass(frozen=True)
class Tool:
    """A function the model can call by `name`, described to it by `schema`."""

    name: str
    fn: Callable
    schema: dict     # {"type": "function", "function": {"name", "description", "parameters", ["return"]}}
    sandboxed: bool  # True: runs in a worker process with resource limits; False: in a thread of this process


def tool_from_function(fn: Callable, *, sandboxed: bool = True, name: str | None = None) -> Tool:
    """The Tool for a typed function with a Google-style docstring (`Args:` describing every argument).

    `name` (default: the function's name) is what the model calls it by. Raises ValueError naming the
    function and what to add when a type hint or the docstring (or one argument's line in it) is missing,
    or a hint has no JSON-schema equivalent.
    """
    from transformers.utils.chat_template_utils import (DocstringParsingException, TypeHintParsingException,
                                                        get_json_schema)

    if not callable(fn):
        raise TypeError(f"a tool must be a function, got {fn!r}.")
    try:
        schema = get_json_schema(fn)
    except TypeHintParsingException as e:
        raise UserError(
            f"tool {_where(fn)} cannot be described to the model: {e}. Give every argument a JSON-compatible "
            f"type hint (str, int, float, bool, list[...], dict[str, ...], Literal[...], Optional[...]).") from None
    except DocstringParsingException as e:
        raise UserError(
            f"tool {_where(fn)} cannot be described to the model: {e}. Write a Google-style docstring: a first "
            f"line saying what the tool does, then an 'Args:' section with one 'name: description' line per "
            f"argument.") from None
    if name is not None:
        schema["function"]["name"] = name
    return Tool(name=schema["function"]["name"], fn=fn, schema=schema, sandboxed=sandboxed)


def register_tool(name: str | None = None, *, sandboxed: bool = True) -> Callable[[Callable], Callable]:
    """Decorator registering a tool function under `name` (default: its own name) for `rollout.multi_turn.tools`.

    The schema is checked when the tool is loaded (`load_tools`), so importing a file stays cheap.
    """
    def decorator(fn: Callable) -> Callable:
        return TOOLS.register(name or fn.__name__, sandboxed=sandboxed)(fn)

    return decorator


def load_tools(specs: list[str]) -> list[Tool]:
    """The tools named by `specs` (registered names, `path/to/file.py:function` or `package.module:function`).

    A tool loaded from a file or module is sandboxed unless it was registered with `sandboxed=False`,
    and is named as registered, else by its function name. Two tools with one name are a ValueError:
    the model calls tools by name.
    """
    tools: list[Tool] = []
    origin: dict[str, str] = {}
    for spec in specs:
        fn = _resolve(spec)
        registered = next((n for n in TOOLS.names() if TOOLS.get(n) is fn and not _is_spec(n)), None)
        sandboxed = TOOLS.meta(registered).get("sandboxed", True) if registered else True
        tool = tool_from_function(fn, sandboxed=sandboxed, name=registered or getattr(fn, "__name__", None))
        if tool.name in origin:
            raise UserError(
                f"two tools are named {tool.name!r} ({origin[tool.name]!r} and {spec!r}); the model calls tools by "
                f"name, so give one another name with @register_tool(name=...) or list it once.")
        origin[tool.name] = spec
        tools.append(tool)
    return tools


def _resolve(spec: str) -> Callable:
    """The function a spec names: a registered name, `file.py:function` or `package.module:function`."""
    if not isinstance(spec, str):
        raise TypeError(f"a tool spec must be a string, got {spec!r}.")
    if is_file_spec(spec) or spec in TOOLS:
        return TOOLS.resolve(spec)
    match = _MODULE_SPEC.match(spec)
    if match is None:
        return TOOLS.get(spec)  # the unknown-name error, with the closest registered name
    try:
        module = importlib.import_module(match["module"])  # runs its @register_tool decorators
    except ImportError as e:
        raise UserError(f"Cannot load tool {spec!r}: {e}.") from None
    fn = getattr(module, match["fn"], None)
    if not callable(fn):
        raise UserError(f"Cannot load tool {spec!r}: module {match['module']!r} has no function {match['fn']!r}.")
    return fn


def _where(fn: Callable) -> str:
    """`name (path/to/file.py:line)` of a function, for messages; `module.name` for other callables."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return fn_name(fn)
    return f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno})"


def _is_spec(name: str) -> bool:
    return is_file_spec(name) or _MODULE_SPEC.match(name) is not None


register_tool(sandboxed=False)(calculator)  # pure arithmetic with bounded sizes: safe to run in a thread
register_tool(sandboxed=True)(python)       # arbitrary code: only in a worker process with limits
