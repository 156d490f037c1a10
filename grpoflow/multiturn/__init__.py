"""Multi-turn rollouts: tools the model can call (issue 12).

    tools.py        Tool, tool_from_function (typed function + docstring -> chat-template schema), the
                    tool registry, load_tools(specs); the built-ins are registered from builtin_tools.py
    builtin_tools.py  calculator (safe arithmetic via `ast`) and python (runs code; sandboxed)
    tool_parser.py  ToolCall, ParsedCalls, parse_tool_calls(text, parser) with the Hermes `<tool_call>` parser
    tool_runner.py  ToolResult, ToolRunner: each call under a timeout; sandboxed tools in worker processes
                    with CPU-time, memory and output limits (grpoflow/process_pool.py)

This file imports nothing: tool worker processes import the modules above, and nothing heavier.
"""
