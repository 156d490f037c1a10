"""Tool formats: each registered format round-trips (render -> parse, strip); an unknown name lists the known ones;
the Hermes parser gives well-formed calls in order, one clear error per malformed call, and never raises."""

import pytest

from grpoflow.data.tool_format import TOOL_FORMATS, ParsedCalls, ToolCall, ToolFormat, tool_format
from grpoflow.errors import UserError


def parse_tool_calls(text: str) -> ParsedCalls:
    return tool_format("hermes").parse(text)


CALLS = [ToolCall("calculator", {"expression": "2 + 2"}), ToolCall("now", {}),
         ToolCall("search", {"query": "caf\u00e9 \"quoted\" </tool_call> <tool_call>?", "k": [1, 2],
                             "deep": {"x": None}})]


@pytest.mark.parametrize("name", TOOL_FORMATS.names())
@pytest.mark.parametrize("prefix", ["", "Let me compute that.\n", "  spaced  "])
def test_every_format_round_trips(name, prefix):
    fmt = tool_format(name)
    assert fmt.name == name
    text = prefix + "".join(fmt.render(c) for c in CALLS)
    assert fmt.parse(text) == ParsedCalls(calls=CALLS, errors=[])
    assert fmt.strip(text) == prefix.strip()
    assert fmt.parse(prefix) == ParsedCalls() and fmt.strip(prefix) == prefix.strip()  # no calls: text kept


def test_an_unknown_format_names_the_known_ones():
    with pytest.raises(UserError, match=r"Unknown tool format 'hermez'; did you mean 'hermes'\? Valid names: "
                                        r"\['hermes'\]"):
        tool_format("hermez")


def test_one_call():
    text = ('Let me compute that.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n'
            '</tool_call>')
    assert parse_tool_calls(text) == ParsedCalls(calls=[ToolCall("calculator", {"expression": "2 + 2"})], errors=[])


def test_two_calls_in_order_with_text_between():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and then '
            '<tool_call>{"name": "b", "arguments": {"y": [1, 2], "z": {"k": null}}}</tool_call> done')
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2], "z": {"k": None}})]
    assert parsed.errors == []


def test_no_calls():
    assert parse_tool_calls("The answer is 4.") == ParsedCalls([], [])
    assert parse_tool_calls("") == ParsedCalls([], [])
    assert parse_tool_calls("a stray </tool_call> closes nothing") == ParsedCalls([], [])


def test_arguments_given_as_a_json_string():
    text = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"3*3\\"}"}</tool_call>'
    assert parse_tool_calls(text).calls == [ToolCall("calculator", {"expression": "3*3"})]


def test_missing_arguments_mean_none():
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>').calls == [ToolCall("now", {})]


def test_malformed_json_is_an_error_and_the_good_calls_still_count():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'    # one brace short
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("b", {})]
    assert parsed.errors == [
        "tool call 1: invalid JSON (Expecting ',' delimiter at line 1 column 36): "
        "{\"name\": \"a\", \"arguments\": {\"x\": 1}"]


@pytest.mark.parametrize("body, message", [
    ('{"arguments": {"x": 1}}', 'tool call 1: missing "name" (the tool\'s name as a string): {"arguments": {"x": 1}}'),
    ('{"name": 3, "arguments": {}}', 'tool call 1: missing "name"'),
    ('{"name": "", "arguments": {}}', 'tool call 1: missing "name"'),
    ('["calculator"]', 'tool call 1: expected a JSON object {"name": ..., "arguments": {...}}, got ["calculator"]'),
    ('{"name": "a", "arguments": [1, 2]}', 'tool call 1 (a): "arguments" must be a JSON object of argument names to '
                                           'values, got [1, 2]'),
    ('{"name": "a", "arguments": "not json"}', 'tool call 1 (a): "arguments" is a string that is not valid JSON'),
    ('{"name": "a", "arguments": "[1]"}', 'tool call 1 (a): "arguments" must be a JSON object'),
    ('', "tool call 1: invalid JSON (Expecting value at line 1 column 1)"),
])
def test_malformed_calls(body, message):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == [] and len(parsed.errors) == 1
    assert parsed.errors[0].startswith(message)


def test_unclosed_tag_at_the_end_is_an_error():
    parsed = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "argu')
    assert parsed.calls == [ToolCall("a", {})]
    assert parsed.errors == ['tool call 2: <tool_call> is not closed by </tool_call> before the text ends: '
                             '{"name": "b", "argu']


def test_unclosed_tag_before_the_next_call_is_an_error_and_the_next_call_counts():
    parsed = parse_tool_calls('<tool_call>{"name": "a"}\n<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert parsed.calls == [ToolCall("b", {})]
    assert parsed.errors == ['tool call 1: <tool_call> is not closed by </tool_call> before the next <tool_call>: '
                             '{"name": "a"}']


def test_long_bodies_are_shortened_in_messages():
    parsed = parse_tool_calls("<tool_call>{" + "x" * 500 + "</tool_call>")
    assert len(parsed.errors[0]) < 200 and parsed.errors[0].endswith("...")


def test_formats_are_pluggable(tmp_path):
    path = tmp_path / "my_format.py"
    path.write_text("from grpoflow.data.tool_format import ParsedCalls, ToolCall, ToolFormat\n"
                    "def lines():\n"
                    "    return ToolFormat('lines', parse=lambda text: ParsedCalls([ToolCall(line[5:], {}) for line in "
                    "text.splitlines() if line.startswith('CALL ')], []), render=lambda call: f'\\nCALL {call.name}', "
                    "strip=lambda text: '\\n'.join(x for x in text.splitlines() "
                    "if not x.startswith('CALL ')).strip())\n"
                    "def not_a_format():\n"
                    "    return len\n")
    fmt = tool_format(f"{path}:lines")
    assert isinstance(fmt, ToolFormat)
    text = "hi" + fmt.render(ToolCall("a", {})) + fmt.render(ToolCall("b", {}))
    assert fmt.parse(text).calls == [ToolCall("a", {}), ToolCall("b", {})] and fmt.strip(text) == "hi"
    with pytest.raises(UserError, match="returned builtin_function_or_method, not a ToolFormat"):
        tool_format(f"{path}:not_a_format")
