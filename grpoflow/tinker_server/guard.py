"""What every request to the Tinker server passes through before and after its route (pure ASGI middleware).

Before: the API key; a body of at most `max_bytes` as sent and, when zstd-compressed (the SDK's
`Content-Encoding: zstd`), at most `max_bytes` decompressed (a small compressed bomb is refused while it
decompresses, not after), handed to the route decompressed.
After: a request that did not succeed (an unknown route such as `save_weights_external`, a body that does not
parse, a refused parameter, a bug) but names a training model and a `seq_id` passes that number through the
model's sequence gate (futures.SeqGate.skip), so the client's later requests run. A route that raises answers 500
in the SDK's error shape (`{"error", "category": "server"}`) instead of a plain-text page.
"""

from __future__ import annotations

import io
import json
import logging
import traceback
from typing import Any, Awaitable, Callable

log = logging.getLogger("grpoflow.tinker")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
PROTOBUF = "application/x-protobuf"


class TooLarge(Exception):
    """A request body over the limit."""


def decompress_zstd(body: bytes, limit: int) -> bytes:
    """`body` zstd-decompressed, refusing (TooLarge) as soon as the output passes `limit` bytes."""
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body))
    out: list[bytes] = []
    size = 0
    while True:
        chunk = reader.read(1 << 20)
        if not chunk:
            return b"".join(out)
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request body decompresses to more than {limit} bytes")
        out.append(chunk)


def sequence_number(body: bytes, media: str) -> tuple[str, int] | None:
    """(model_id, seq_id) of a training request's body, read leniently (it may be the reason it was refused)."""
    if media == PROTOBUF:
        from tinker.proto import tinker_public_pb2 as pb

        msg = pb.ForwardBackwardRequest()
        try:
            msg.ParseFromString(body)
        except Exception:  # not a ForwardBackwardRequest at all: nothing to read
            return None
        return (msg.model_id, msg.seq_id) if msg.model_id and msg.seq_id else None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    model_id, seq_id = data.get("model_id"), data.get("seq_id")
    if isinstance(model_id, str) and isinstance(seq_id, int) and not isinstance(seq_id, bool):
        return model_id, seq_id
    return None


def json_error(status: int, message: str, category: str = "user") -> tuple[int, bytes]:
    return status, json.dumps({"error": message, "category": category}).encode()


class Guard:
    """The Tinker app behind the checks above. `skip(model_id, seq_id)` passes a refused request's number."""

    def __init__(self, app: Callable, *, api_key: str | None, max_bytes: int, skip: Callable[[str, int], None],
                 open_paths: tuple[str, ...] = ()) -> None:
        self.app, self.api_key, self.max_bytes, self.skip, self.open_paths = app, api_key, max_bytes, skip, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope["path"] not in self.open_paths \
                and headers.get("x-api-key") != self.api_key:
            await _answer(send, *json_error(401, "wrong or missing API key: set TINKER_API_KEY to the key this "
                                                 "server was started with (tinker.api_key)."))
            return
        try:
            body = await self._body(receive, headers)
        except TooLarge as e:
            await _answer(send, *json_error(413, f"{e}; this server takes at most {self.max_bytes} bytes per "
                                                 "request (tinker.max_request_mb): send fewer or shorter datums."))
            return
        if headers.get("content-encoding", "").lower() == "zstd":
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"content-encoding"]}
        status = await self._run(scope, body, receive, send)
        if status >= 400 and body:
            found = sequence_number(body, headers.get("content-type", "").split(";")[0].strip().lower())
            if found is not None:
                self.skip(*found)

    async def _body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise TooLarge(f"the request body has {declared} bytes")
        parts, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_bytes:
                raise TooLarge(f"the request body has more than {self.max_bytes} bytes")
            more = message.get("more_body", False)
        body = b"".join(parts)
        if headers.get("content-encoding", "").lower() == "zstd":
            try:
                body = decompress_zstd(body, self.max_bytes)
            except TooLarge:
                raise
            except Exception as e:  # zstandard.ZstdError: not a zstd frame
                log.info("a zstd body did not decompress: %s", e)
                body = b"\x00not zstd"  # the route refuses it as a body that does not parse
        return body

    async def _run(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> int:
        """Run the app on the (decompressed) body; the response status (500 in the SDK's shape if it raised)."""
        sent = False
        status = 500

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()  # after the body: the client's disconnect, whenever it comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        started = False

        async def watch(message: dict) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            await self.app(scope, replay, watch)
        except Exception as e:
            log.error("%s %s failed:\n%s", scope.get("method"), scope.get("path"), traceback.format_exc())
            if started:
                raise
            await _answer(send, *json_error(500, f"{type(e).__name__}: {e}", "server"))
            return 500
        return status


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
