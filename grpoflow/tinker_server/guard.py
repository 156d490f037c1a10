"""What every request to the Tinker server passes through before and after its route (pure ASGI middleware).

Before: the API key; a body of at most `max_bytes` as sent and, when zstd-compressed (the SDK's
`Content-Encoding: zstd`), at most `max_bytes` decompressed (a small compressed bomb is refused while it
decompresses, not after), handed to the route decompressed.
After: a request that did not succeed (an unknown route such as `save_weights_external`, a body that does not
parse or is too large, a refused parameter, a bug) but names a training model and a `seq_id` passes that number
through the model's sequence gate (futures.SeqGate.skip), so the client's later requests run. A protobuf
`forward_backward` too large to read still names them: its first two fields are model_id and seq_id. A route that
raises answers 500 in the SDK's error shape (`{"error", "category": "server"}`) instead of a plain-text page.
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


PREFIX_BYTES = 4096  # what is kept of a refused oversize body: enough for its model_id and seq_id


class TooLarge(Exception):
    """A request body over the limit; `prefix` is its first bytes (decompressed where it was compressed)."""

    def __init__(self, message: str, prefix: bytes = b"") -> None:
        super().__init__(message)
        self.prefix = prefix


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
        out.append(chunk)
        if size > limit:
            raise TooLarge(f"the request body decompresses to more than {limit} bytes",
                           b"".join(out)[:PREFIX_BYTES])


def zstd_prefix(data: bytes) -> bytes:
    """The first bytes that a prefix of a zstd stream decompresses to (b"" if it does not)."""
    import zstandard

    try:  # read at most PREFIX_BYTES out: the prefix may belong to a bomb
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read(PREFIX_BYTES)
    except zstandard.ZstdError:
        return b""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A protobuf varint at `at`: (value, the position after it); IndexError past the end."""
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def leading_ids(body: bytes) -> tuple[str, int] | None:
    """model_id (field 1) and seq_id (field 2) from the start of a serialized ForwardBackwardRequest, which
    protobuf writes first, so a prefix of the body is enough."""
    model_id, seq_id, at = None, None, 0
    try:
        while at < len(body) and (model_id is None or seq_id is None):
            tag, at = _varint(body, at)
            if tag == (1 << 3) | 2:                  # field 1, length-delimited
                size, at = _varint(body, at)
                model_id = body[at:at + size].decode()
                at += size
            elif tag == (2 << 3) | 0:                # field 2, varint
                seq_id, at = _varint(body, at)
            else:
                break
    except (IndexError, UnicodeDecodeError):
        return None
    return (model_id, seq_id) if model_id and seq_id else None


def sequence_number(body: bytes, media: str) -> tuple[str, int] | None:
    """(model_id, seq_id) of a training request's body, read leniently (it may be the reason it was refused)."""
    if media == PROTOBUF:
        return leading_ids(body)
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
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            body = await self._body(receive, headers)
        except TooLarge as e:
            await _answer(send, *json_error(413, f"{e}; this server takes at most {self.max_bytes} bytes per "
                                                 "request (tinker.max_request_mb): send fewer or shorter datums."))
            found = sequence_number(e.prefix, media) if media == PROTOBUF else None
            if found is not None:
                self.skip(*found)
            return
        if headers.get("content-encoding", "").lower() == "zstd":
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"content-encoding"]}
        status = await self._run(scope, body, receive, send)
        if status >= 400 and body:
            found = sequence_number(body, media)
            if found is not None:
                self.skip(*found)

    async def _body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        zstd = headers.get("content-encoding", "").lower() == "zstd"
        declared = headers.get("content-length", "")
        declared_n = int(declared) if declared.isdigit() else 0
        parts: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_bytes or declared_n > self.max_bytes:
                prefix = b"".join(parts)[:PREFIX_BYTES]
                raise TooLarge(f"the request body has {max(size, declared_n)} bytes",
                               zstd_prefix(prefix) if zstd else prefix)
            more = message.get("more_body", False)
        body = b"".join(parts)
        if zstd:
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
