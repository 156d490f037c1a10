"""The OpenAI chat-completions wire format: requests checked and turned into template messages, replies and
errors shaped as the official client expects (no server here; endpoint.py serves it).

What a request may hold (anything else the client sends, e.g. `seed`, `presence_penalty`, is ignored):

    model        the served name (rollout.agent.model); another name is 404 model_not_found
    messages     system / developer / user / assistant / tool messages; text content only
    tools        function schemas, passed to the chat template's `tools=`
    tool_choice  "auto" or "none" (no tool calls are parsed from the reply); others are 400
    max_tokens   (or max_completion_tokens) capped by the sample's remaining budget
    stop         up to 4 strings: the reply is cut after the token that completes one (its text before it)
    temperature, top_p   checked, but training samples at rollout.temperature / top_p, the values the
                 trainer's log-probs assume (validation at rollout.val_temperature)
    n            1 only;  logprobs: true returns each token's log-prob (top_logprobs 0)
    stream       true: the reply, generated whole, is sent as server-sent chunks (`stream_events`: one delta with
                 the text and tool calls, one with finish_reason, a usage chunk when
                 stream_options.include_usage, then [DONE]), as agents that always stream expect
    user         the episode id, when the X-Episode-Id header is absent

Assistant messages are rendered as the text the model wrote: a message carrying tool calls this endpoint
returned is replaced by the reply it came from (so the conversation renders to the sampled ids); other tool
calls are written in the endpoint's tool format (rollout.multi_turn.tool_parser, data/tool_format.py). A tool
message gets its tool's `name` from its `tool_call_id`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from grpoflow.data.tool_format import HERMES, ParsedCalls, ToolCall, ToolFormat

ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error reply: HTTP `status` and OpenAI's {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    """A checked request: the conversation as chat-template messages, and what shapes the reply."""
    messages: list[dict]
    tools: list[dict] | None = None
    parse_tools: bool = False           # tools given and tool_choice is not "none"
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    stream: bool = False                # answer as server-sent chunks (stream_events)
    include_usage: bool = False         # stream_options.include_usage: a last chunk with the usage


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def parse_request(body: Any, *, model_name: str, raw_text: dict[str, str], tool_names: dict[str, str],
                  tool_format: ToolFormat = HERMES) -> ChatRequest:
    """The request `body` (parsed JSON) checked; `raw_text` / `tool_names` map the episode's tool-call ids to the
    reply text they came from and to their tool's name; other tool calls are written in `tool_format`. Raises
    APIError naming the bad field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("you must provide a model parameter.", "model")
    if model != model_name:
        raise APIError(404, f"The model `{model}` does not exist; this endpoint serves `{model_name}`.",
                       param="model", code="model_not_found")
    n = body.get("n")
    if n not in (None, 1):
        raise bad(f"n={n!r} is not supported: the endpoint returns one choice per request (run the agent "
                  "rollout.n times instead).", "n", "unsupported_value")
    stream, options = body.get("stream"), body.get("stream_options")
    if stream not in (None, True, False) or (options is not None and not isinstance(options, dict)):
        raise bad("stream must be true or false, and stream_options an object like {\"include_usage\": true}.",
                  "stream", "invalid_value")
    if body.get("top_logprobs") not in (None, 0):
        raise bad("top_logprobs is not supported (logprobs=true returns each sampled token's log-prob).",
                  "top_logprobs", "unsupported_value")
    for key, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not low <= value <= high):
            raise bad(f"{key}={value!r} must be a number in [{low:g}, {high:g}].", key, "invalid_value")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad(f"max_tokens={max_tokens!r} must be an integer >= 1.", "max_tokens", "invalid_value")
    tools = parse_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad(f"tool_choice={choice!r} is not supported; use \"auto\" or \"none\".", "tool_choice",
                  "unsupported_value")
    return ChatRequest(messages=template_messages(body.get("messages"), raw_text, tool_names, tool_format),
                       tools=tools,
                       parse_tools=bool(tools) and choice != "none", max_tokens=max_tokens,
                       stop=parse_stop(body.get("stop")), logprobs=bool(body.get("logprobs")),
                       stream=bool(stream), include_usage=bool(stream and (options or {}).get("include_usage")))


def parse_tools(tools: Any) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise bad('tools must be a list of {"type": "function", "function": {"name": ..., "parameters": ...}}.',
                  "tools", "invalid_value")
    return tools or None


def parse_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop must be a non-empty string or a list of at most 4 of them.", "stop", "invalid_value")
    return stops


def text_of(content: Any, at: int) -> str:
    """A message's content as text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad(f"messages[{at}].content must be a string or a list of text parts; other content (images, audio) "
              "is not supported.", f"messages[{at}].content", "invalid_value")


def template_messages(messages: Any, raw_text: dict[str, str], tool_names: dict[str, str],
                      tool_format: ToolFormat = HERMES) -> list[dict]:
    """The OpenAI messages as chat-template messages ({"role", "content"[, "name"]})."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of chat messages.", "messages",
                  "missing_required_parameter" if messages is None else "invalid_value")
    out = []
    for at, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"messages[{at}] must be an object with a role in {list(ROLES)}.", f"messages[{at}].role",
                      "invalid_value")
        role = "system" if m["role"] == "developer" else m["role"]
        calls = m.get("tool_calls") or []
        if role == "assistant" and calls:
            out.append({"role": "assistant", "content": assistant_text(m, calls, at, raw_text, tool_format)})
        elif role == "tool":
            message = {"role": "tool", "content": text_of(m.get("content"), at)}
            name = m.get("name") or tool_names.get(m.get("tool_call_id") or "")
            if name:
                message["name"] = name
            out.append(message)
        else:
            if m.get("content") is None:
                raise bad(f"messages[{at}].content is missing.", f"messages[{at}].content",
                          "missing_required_parameter")
            out.append({"role": role, "content": text_of(m["content"], at)})
    return out


def assistant_text(message: dict, calls: Any, at: int, raw_text: dict[str, str], tool_format: ToolFormat) -> str:
    """The text of an assistant message with tool calls: the reply they came from when this endpoint made them,
    else its content followed by each call as `tool_format` renders it."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                              for c in calls):
        raise bad(f"messages[{at}].tool_calls must be a list of {{\"id\", \"type\": \"function\", \"function\": "
                  "{\"name\", \"arguments\"}}.", f"messages[{at}].tool_calls", "invalid_value")
    sources = {raw_text.get(c.get("id") or "") for c in calls}
    if len(sources) == 1 and None not in sources:
        return sources.pop()  # type: ignore[return-value]
    text = text_of(message.get("content") or "", at)
    for c in calls:
        arguments = c["function"].get("arguments") or "{}"
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise bad(f"messages[{at}].tool_calls: arguments {arguments[:80]!r} are not JSON.",
                      f"messages[{at}].tool_calls", "invalid_value") from None
        text += tool_format.render(ToolCall(str(c["function"].get("name")), arguments))
    return text


@dataclass
class Reply:
    """What the engine gave one call, ready to be shaped."""
    text: str
    finish_reason: str                  # stop | length | tool_calls
    prompt_tokens: int
    token_texts: list[str]
    log_probs: list[float]
    calls: ParsedCalls | None = None    # the tool calls parsed from `text` (None: not parsed)
    content: str | None = None          # with calls: the text outside them (the format's strip; None: nothing)
    call_ids: list[str] = field(default_factory=list)


def completion_body(reply: Reply, *, model_name: str, logprobs: bool) -> dict[str, Any]:
    """The chat.completion object for `reply`."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.calls is not None and reply.calls.calls:
        message["content"] = reply.content
        message["tool_calls"] = [{"id": i, "type": "function",
                                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                 for i, c in zip(reply.call_ids, reply.calls.calls)]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
    if logprobs:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                          for t, lp in zip(reply.token_texts, reply.log_probs)]}
    completion = len(reply.log_probs)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "choices": [choice],
            "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": completion,
                      "total_tokens": reply.prompt_tokens + completion}}


def stream_events(completion: dict[str, Any], *, include_usage: bool) -> list[str]:
    """A chat.completion object as the server-sent events of a streamed reply: one chunk whose delta holds the
    whole message (role, content, tool calls with their `index`), one with the finish_reason, the usage chunk
    when asked for, and `[DONE]`. The official client's stream accumulator rebuilds the same message."""
    (choice,) = completion["choices"]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                    "logprobs": choice["logprobs"]}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"],
                                    "logprobs": None}]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]


def models_body(model_name: str) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(model_name)]}


def model_object(model_name: str) -> dict[str, Any]:
    return {"id": model_name, "object": "model", "created": 0, "owned_by": "grpoflow"}
