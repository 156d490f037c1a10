"""What the agent endpoint refuses before it works for a request (endpoint.py calls these).

Agents are programs the trainer runs but does not trust to be careful, so each request is bounded before it
costs anything: the body is read in chunks and refused past `max_body_bytes` (413, never read whole) or when it
has not all arrived within `BODY_TIMEOUT_S` (408: a stalled client's half body is dropped, not kept); it must be
JSON of bounded nesting whose strings are text (400, never a 500 with a traceback: a lone UTF-16 surrogate such
as "\\ud800" parses in Python but cannot be encoded); the rendered prompt is refused past
`max_prompt_tokens` (400 `context_length_exceeded`, OpenAI's code), before it reaches the engine. Rendering
runs in a worker thread (endpoint.py), so one huge conversation does not stall the other episodes' calls,
and the renderers built for distinct `tools` lists live in a bounded LRU cache (`RendererCache`).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

from grpoflow.trajectories.openai_api import APIError

MAX_BODY_BYTES = 4 * 2**20   # a request body over this is refused (413): 4 MiB is about a million tokens of text
BODY_TIMEOUT_S = 30.0        # a request body not all received within this is refused (408)
RENDERER_CACHE = 32          # renderers kept for distinct `tools` lists (least recently used ones go)

T = TypeVar("T")


async def read_json_body(request: Any, max_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> Any:
    """The request's JSON body, read at most `max_bytes` far within `timeout_s`; APIError 413 past that size, 408
    past that time, 400 if it is not JSON or holds a string that is not text (a lone surrogate)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(int(declared), max_bytes)
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > max_bytes:
                raise too_large(len(body), max_bytes)

    from starlette.requests import ClientDisconnect

    try:
        await asyncio.wait_for(read(), timeout_s)
    except ClientDisconnect:  # the agent went away mid-body: nothing to answer, nothing to log
        raise APIError(499, f"the client closed the connection before its request body arrived ({len(body)} bytes "
                            "read).", code="client_closed") from None
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s ({len(body)} bytes read); send "
                            "it whole.", code="request_timeout") from None
    try:
        value = json.loads(body)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate ("\ud800") raises here
    except UnicodeEncodeError as e:
        raise APIError(400, f"the request body holds a string that is not text (a lone UTF-16 surrogate, "
                            f"{e.object[e.start:e.end]!a}); send valid Unicode.") from None
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "the request body is not valid JSON.") from None
    except RecursionError:
        raise APIError(400, "the request body nests JSON too deeply.") from None
    return value


def too_large(size: int, max_bytes: int) -> APIError:
    return APIError(413, f"the request body is over {max_bytes} bytes ({size} read); send a shorter conversation.",
                    code="request_too_large")


def check_prompt_length(prompt_ids: list[int], max_tokens: int) -> None:
    """APIError 400 `context_length_exceeded` for a rendered prompt over `max_tokens`."""
    if len(prompt_ids) > max_tokens:
        raise APIError(400, f"This model's maximum context length for a prompt is {max_tokens} tokens; the messages "
                            f"render to {len(prompt_ids)} tokens. Shorten the conversation.", param="messages",
                       code="context_length_exceeded")


class RendererCache(Generic[T]):
    """`get(key, build)`: the value built for `key`, built once; at most `size` kept (least recently used go)."""

    def __init__(self, size: int = RENDERER_CACHE) -> None:
        self.size = size
        self._values: OrderedDict[str, T] = OrderedDict()

    def get(self, key: str, build: Callable[[], T]) -> T:
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = build()
        self._values[key] = value
        while len(self._values) > self.size:
            self._values.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._values)
