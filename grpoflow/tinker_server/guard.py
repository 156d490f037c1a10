"""What every request to the Tinker server passes through before and after its route (pure ASGI middleware).

Before: the API key; a body of at most `max_bytes` as sent and, when zstd-compressed (the SDK's
`Content-Encoding: zstd`), at most `max_bytes` decompressed (a small compressed bomb is refused while it
decompresses, not after), handed to the route decompressed; a body received in full within `body_timeout_s`
(else 408 and its bytes are dropped: a client that stalls mid-body holds nothing); a body that fits the shared
budget (budget.py: else, once its first bytes have said which model and seq_id it is for, 429 with Retry-After,
its bytes read and dropped). The route finds the request's `Caller` in `request.state.caller`: a digest of its API
key (the owner of what it creates: service.py) and its budget ticket, which a queued job keeps.
After: a request that did not succeed (an unknown route such as `save_weights_external`, a body that does not
parse or is too large, a refused parameter, a bug) but names a training model of the caller and a `seq_id` passes
that number through the model's sequence gate (futures.SeqGate.skip), so the client's later requests run; a 429
or 408 does not (the SDK sends that request again, with the same number). A protobuf `forward_backward` too large
to read still names them: its first two fields are model_id and seq_id. A route that raises answers 500 in the
SDK's error shape (`{"error", "category": "server"}`) instead of a plain-text page.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from grpoflow.tinker_server.budget import RETRY_AFTER_S, Budget, Busy, Ticket

log = logging.getLogger("grpoflow.tinker")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
PROTOBUF = "application/x-protobuf"


PREFIX_BYTES = 4096  # what is kept of a refused oversize body: enough for its model_id and seq_id
SMALL_BODY = 64 * 1024  # bodies up to this size are not counted against the budget (budget.py)


def counted(n_bytes: int) -> int:
    """What a body of `n_bytes` counts against the budget: nothing when small (long polls, optim_step, a short
    prompt: each connection holds that much in the HTTP server's buffers anyway), else all of it."""
    return n_bytes if n_bytes > SMALL_BODY else 0


class BodyTimeout(Exception):
    """The client did not send its whole body in time."""


RETRIED = (408, 429)  # answers the SDK sends the same request again after: its seq_id stays unused


@dataclass
class Caller:
    """Who sent a request (`client`: a digest of its API key, never the key) and its share of the budget."""
    client: str
    ticket: Ticket


def client_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


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
    """The Tinker app behind the checks above. `skip(model_id, seq_id, client)` passes a refused request's number
    (for the model's owner only); `unblocks(model_id, seq_id, client)` says whether the model's queued requests wait
    for this one (admitted past the budget)."""

    def __init__(self, app: Callable, *, api_key: str | None, max_bytes: int, body_timeout_s: float, budget: Budget,
                 skip: Callable[[str, int, str], None], unblocks: Callable[[str, int, str], bool],
                 open_paths: tuple[str, ...] = ()) -> None:
        self.app, self.api_key, self.max_bytes, self.skip, self.open_paths = app, api_key, max_bytes, skip, open_paths
        self.body_timeout_s, self.budget, self.unblocks = body_timeout_s, budget, unblocks

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
        caller = Caller(client_of(headers.get("x-api-key", "")), self.budget.ticket())
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        try:
            await self._guarded(scope, receive, send, headers, media, caller, deadline)
        finally:
            if not caller.ticket.kept:
                caller.ticket.release()

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], media: str,
                       caller: Caller, deadline: float) -> None:
        try:
            body = await self._body(receive, headers, media, caller, deadline)
        except TooLarge as e:
            await _answer(send, *json_error(413, f"{e}; this server takes at most {self.max_bytes} bytes per "
                                                 "request (tinker.max_request_mb): send fewer or shorter datums."),
                          close=True)
            found = sequence_number(e.prefix, media) if media == PROTOBUF else None
            if found is not None:
                self.skip(*found, caller.client)
            return
        except BodyTimeout as e:
            await _answer(send, *json_error(408, str(e)), close=True)
            return
        except Busy as e:
            caller.ticket.release()
            await _answer(send, *json_error(429, str(e)), retry_after=True)
            return
        if headers.get("content-encoding", "").lower() == "zstd":
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"content-encoding"]}
        scope = {**scope, "state": {**scope.get("state", {}), "caller": caller}}
        status = await self._run(scope, body, receive, send)
        if status >= 400 and status not in RETRIED and body:
            found = sequence_number(body, media)
            if found is not None:
                self.skip(*found, caller.client)

    async def _body(self, receive: Receive, headers: dict[str, str], media: str, caller: Caller,
                    deadline: float) -> bytes:
        """The body, decompressed; its bytes taken from the budget once its first PREFIX_BYTES say which model's
        request it is (TooLarge, BodyTimeout, Busy)."""
        zstd = headers.get("content-encoding", "").lower() == "zstd"
        declared = headers.get("content-length", "")
        declared_n = int(declared) if declared.isdigit() else 0
        parts: list[bytes] = []
        size, more, force = 0, True, None
        while more:
            message = await _receive(receive, deadline, self.body_timeout_s, size, declared_n)
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes or declared_n > self.max_bytes:
                prefix = b"".join(parts)[:PREFIX_BYTES]
                raise TooLarge(f"the request body has {max(size, declared_n)} bytes",
                               zstd_prefix(prefix) if zstd else prefix)
            if force is None and (size >= PREFIX_BYTES or not more):
                prefix = b"".join(parts)[:PREFIX_BYTES]
                found = sequence_number(zstd_prefix(prefix) if zstd else prefix, media)
                force = found is not None and self.unblocks(*found, caller.client)
                await _take(caller.ticket, counted(max(size, declared_n)), force, receive if more else None, deadline)
            elif force is not None and counted(size) > caller.ticket.bytes:  # a body longer than it said
                await _take(caller.ticket, counted(size) - caller.ticket.bytes, force, receive if more else None,
                            deadline)
        body = b"".join(parts)
        if zstd:
            try:
                body = decompress_zstd(body, self.max_bytes)
            except TooLarge:
                raise
            except Exception as e:  # zstandard.ZstdError: not a zstd frame
                log.info("a zstd body did not decompress: %s", e)
                body = b"\x00not zstd"  # the route refuses it as a body that does not parse
            if counted(len(body)) > caller.ticket.bytes:
                caller.ticket.add(n_bytes=counted(len(body)) - caller.ticket.bytes, force=bool(force))
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


async def _receive(receive: Receive, deadline: float, timeout_s: float, size: int, declared: int) -> dict:
    """The next message of the body, or BodyTimeout once `deadline` (the event loop's clock) has passed."""
    try:
        return await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
    except asyncio.TimeoutError:
        of = f" of {declared}" if declared else ""
        raise BodyTimeout(f"the request body did not arrive within {timeout_s:g} s (tinker.body_timeout_s): "
                          f"{size}{of} bytes came; it was dropped, send the request again.") from None


async def _take(ticket: Ticket, n_bytes: int, force: bool, rest: Receive | None, deadline: float) -> None:
    """`ticket.add(n_bytes)`; where it raises Busy, the rest of the body (if `rest`) is read and dropped first, so
    the client gets to read the 429 (until `deadline`)."""
    try:
        ticket.add(n_bytes=n_bytes, force=force)
    except Busy:
        more = rest is not None
        while more and rest is not None:
            try:
                message = await _receive(rest, deadline, 0.0, 0, 0)
            except BodyTimeout:
                break
            more = message["type"] == "http.request" and message.get("more_body", False)
        raise


async def _answer(send: Send, status: int, body: bytes, retry_after: bool = False, close: bool = False) -> None:
    """A JSON answer; `close`: and close the connection after it (a body is left unread: the server frees it)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
