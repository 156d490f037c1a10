"""Tools: schemas from typed functions, clear errors for undescribable ones, loading specs, the calculator."""

import re
import textwrap
from typing import Literal, Optional

import pytest

from grpoflow.trajectories.builtin_tools import calculator, python
from grpoflow.trajectories.tools import TOOLS, load_tools, register_tool, tool_from_function


def search_flights(origin: str, max_stops: int, cabin: Literal["economy", "business"] = "economy",
                   budget: Optional[float] = None) -> list[str]:
    """Find flights leaving a city.

    Args:
        origin: The airport code to leave from.
        max_stops: How many stops are acceptable.
        cabin: The cabin class.
        budget: The most to pay, in euros.
    """
    return []


def test_schema_of_a_typed_function():
    tool = tool_from_function(search_flights)
    assert tool.name == "search_flights" and tool.fn is search_flights and tool.sandboxed
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Find flights leaving a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "description": "The airport code to leave from."},
                    "max_stops": {"type": "integer", "description": "How many stops are acceptable."},
                    "cabin": {"type": "string", "enum": ["economy", "business"], "description": "The cabin class."},
                    "budget": {"type": "number", "nullable": True, "description": "The most to pay, in euros."},
                },
                "required": ["origin", "max_stops"],  # the arguments without a default
            },
            "return": {"type": "array", "items": {"type": "string"}},
        },
    }


def test_name_and_sandboxed_can_be_set():
    tool = tool_from_function(search_flights, sandboxed=False, name="flights")
    assert tool.name == "flights" and tool.schema["function"]["name"] == "flights" and not tool.sandboxed


def test_the_schema_renders_in_a_chat_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"?": 0}, unk_token="?")))
    tokenizer.chat_template = ("{% for t in tools %}{{ t.function.name }}"
                               "({{ t.function.parameters.required | join(',') }});{% endfor %}")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                         tools=[tool_from_function(search_flights).schema], tokenize=False)
    assert text == "search_flights(origin,max_stops);"


def no_hint(city, days: int) -> str:
    """Weather.

    Args:
        city: The city.
        days: How many days.
    """
    return ""


def no_docstring(city: str) -> str:
    return city


def no_args_section(city: str) -> str:
    """Weather in a city."""
    return city


@pytest.mark.parametrize("fn, what", [
    (no_hint, "missing a type hint"),
    (no_docstring, "Write a Google-style docstring"),
    (no_args_section, "no description for the argument 'city'"),
])
def test_a_function_that_cannot_be_described_is_a_clear_error(fn, what):
    with pytest.raises(ValueError, match=f"tool {fn.__name__} \\(.*test_tools.py:\\d+\\) cannot be described "
                                         f"to the model") as info:
        tool_from_function(fn)
    assert what in str(info.value)


USER_TOOLS = textwrap.dedent('''
    from grpoflow.trajectories.tools import register_tool

    def word_count(text: str) -> int:
        """Count the words in a text.

        Args:
            text: The text.
        """
        return len(text.split())

    @register_tool("shout", sandboxed=False)
    def upper(text: str) -> str:
        """Upper-case a text.

        Args:
            text: The text.
        """
        return text.upper()
''')


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):  # one file for the module: its @register_tool("shout") may run only once
    path = tmp_path_factory.mktemp("tools") / "my_tools.py"
    path.write_text(USER_TOOLS)
    return path


def test_load_tools_from_a_file_and_by_name(user_file):
    tools = load_tools([f"{user_file}:word_count", "calculator", f"{user_file}:upper"])
    assert [t.name for t in tools] == ["word_count", "calculator", "shout"]
    assert [t.sandboxed for t in tools] == [True, False, False]  # a file function is sandboxed unless registered so
    assert tools[0].fn("a b c") == 3 and tools[2].fn("hi") == "HI"
    assert tools[0].schema["function"]["parameters"]["required"] == ["text"]
    assert load_tools(["shout"])[0].fn is tools[2].fn  # loading the file registered its decorated tool


def test_load_tools_from_a_module():
    (tool,) = load_tools(["grpoflow.trajectories.builtin_tools:calculator"])
    assert tool.name == "calculator" and tool.fn is calculator and not tool.sandboxed  # registered trusted


def test_duplicate_tool_names_are_an_error(user_file, tmp_path):
    other = tmp_path / "other.py"
    other.write_text(USER_TOOLS.split("@register_tool")[0])  # another word_count, without the registered one
    with pytest.raises(ValueError, match="two tools are named 'word_count'"):
        load_tools([f"{user_file}:word_count", f"{other}:word_count"])
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        load_tools(["calculator", "calculator"])


def test_unknown_tool_names_the_closest():
    with pytest.raises(ValueError, match="Unknown tool 'calculater'; did you mean 'calculator'"):
        load_tools(["calculater"])
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_tools(["grpoflow.trajectories.builtin_tools:nope"])


def test_builtins_are_registered():
    assert {"calculator", "python"} <= set(TOOLS.names())
    assert TOOLS.meta("python") == {"sandboxed": True} and TOOLS.meta("calculator") == {"sandboxed": False}
    assert [t.name for t in load_tools(["python"])] == ["python"]


def test_register_tool_refuses_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        register_tool("calculator")(no_docstring)


# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize("expression, value", [
    ("1 + 2 * 3", "7"),            # precedence
    ("(1 + 2) * 3", "9"),
    ("7 / 2", "3.5"),
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),             # floor, as in Python
    ("-3 % 5", "2"),
    ("2 ** 10", "1024"),
    ("2 ** -2", "0.25"),
    ("+-+4", "-4"),
    ("1.5 * 4", "6.0"),
    (" 12345678901234567890 * 98765432109876543210 ", "1219326311370217952237463801111263526900"),  # exact ints
    ("10 ** 99", "1" + "0" * 99),  # 100 digits: the largest allowed
])
def test_calculator_values(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("9 ** 9 ** 9", "exponent 387420489 is too large"),     # refused before computing
    ("2 ** 1001", "exponent 1001 is too large"),
    ("7 ** 200", "about 169 digits; the limit is 100"),
    ("10 ** 60 * 10 ** 60", "more than 100 digits"),        # checked after every operation
    ("1e308 * 10", "not a finite number"),
    ("10.0 ** 400", "too large for a floating-point number"),
    ("(-8) ** 0.5", "complex number"),
    ("__import__('os').system('true')", "unsupported syntax"),
    ("x + 1", "unsupported syntax 'x'"),
    ("True + 1", "unsupported syntax 'True'"),
    ("'a' * 3", "unsupported syntax"),
    ("2 < 3", "unsupported syntax"),
    ("3 +", "cannot parse '3 +'"),
    ("1" * 1001, "the limit is 1000"),
])
def test_calculator_refusals(expression, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        calculator(expression)


# ---------------------------------------------------------------- python (in this process; the runner sandboxes it)


def test_python_returns_what_was_printed_and_the_last_expression():
    assert python("print('a')\nx = 6\nx * 7") == "a\n42\n"
    assert python("x = 1") == ""
    assert python("None") == ""


def test_python_returns_the_programs_traceback():
    out = python("print('before')\ndef f():\n    return 1 / 0\nf()")
    assert out.startswith("before\nTraceback (most recent call last):\n")
    assert 'File "<code>", line 4, in <module>' in out and out.endswith("ZeroDivisionError: division by zero\n")
    assert "builtin_tools" not in out  # only the program's own lines
    assert python("1 +").rstrip().endswith("SyntaxError: invalid syntax")
    assert python("raise SystemExit(3)").endswith("SystemExit: 3\n")
