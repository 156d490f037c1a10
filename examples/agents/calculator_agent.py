"""A tool-calling agent written against the plain OpenAI client: no grpoflow import.

It answers "347*29"-style questions. The model may call a `calculator` tool (the agent runs it, here, and
sends the result back); its final message is the answer. The episode's reward is 1.0 when the answer is
right. Pointed at any OpenAI-compatible server it runs as is:

    import asyncio, openai
    asyncio.run(run({"prompt": "347*29", "answer": "10063"},
                    openai.AsyncOpenAI(base_url="http://localhost:8000/v1", api_key="...")))

grpoflow trains it with `rollout.agent.program=examples/agents/calculator_agent.py:run` (docs/agents.md,
examples/agents/calculator_agent.yaml): each call reaches the policy through grpoflow's endpoint, and
the episode becomes training samples.
"""

import ast
import json
import operator

MODEL = "policy"        # the name grpoflow's endpoint serves (rollout.agent.model)
MAX_TURNS = 2           # a tool call, then the answer
TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Exact arithmetic on numbers with + - * / and parentheses.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string", "description": "e.g. 347*29"}},
                       "required": ["expression"]},
    },
}]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The calculator tool: + - * / over numbers, evaluated from the syntax tree (never eval)."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"unsupported expression: {expression!r}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(result)) if float(result).is_integer() else str(result)


async def run(row: dict, client) -> float:
    """One episode: ask, run the tool calls the model makes, score its final answer."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=128)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)
                result = calculate(str(arguments["expression"])) if call.function.name == "calculator" else \
                    f"error: unknown tool {call.function.name!r}"
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                result = f"error: bad arguments: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = (messages[-1].get("content") or "").strip() if messages[-1]["role"] == "assistant" else ""
    return 1.0 if answer == row["answer"] else 0.0
