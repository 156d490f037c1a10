"""Local HTTP servers that only local programs can use (`grpoflow serve tinker`, `grpoflow view`).

A server on 127.0.0.1 is out of other machines' reach, but not out of a web page's: any page open in a browser on
this machine can send requests to it, and by DNS rebinding (a name of the page's that later resolves to 127.0.0.1)
read the answers. `LocalOnly` refuses what a browser would send and a local program would not:

- a `Host` header that is not the bound address (127.0.0.1, localhost or ::1, and the port when it is known):
  a rebinding page's requests carry its own name;
- with `json_posts`, a POST whose body is not `application/json` (or one of `body_types`, e.g. protobuf): a page
  may send `text/plain`, form and multipart bodies anywhere without asking, but not JSON.

A server bound to a wildcard address (0.0.0.0, ::) was opened to the network on purpose: the Host check is off.
Pure ASGI, standard library only.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


def split_host(value: str) -> tuple[str, int | None]:
    """`name[:port]` or `[v6]:port` as (name, port); a port that is not a number gives port -1."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.partition(":")
    if not port:
        return name, None
    return name, int(port) if port.isdigit() else -1


class LocalOnly:
    """ASGI middleware: refuse foreign Host headers (and, with `json_posts`, POST bodies of other types) with 403 /
    415 and a JSON `{"error": sentence, "category": "user"}`, before the app sees the request."""

    def __init__(self, app: Callable, *, host: str, port: int | None = None, json_posts: bool = False,
                 body_types: tuple[str, ...] = ()) -> None:
        self.app, self.port, self.json_posts = app, port or None, json_posts
        self.any_host = host in WILDCARDS
        self.names = {*LOOPBACK_NAMES, host.strip("[]").lower()}
        self.body_types = ("application/json", *body_types)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self.any_host:
            name, port = split_host(headers.get("host", ""))
            if name not in self.names or (self.port is not None and port not in (None, self.port)):
                return 403, (f"Host {headers.get('host', '')!r} is not this server's address: it answers only "
                             f"requests to {sorted(self.names)} (port {self.port}), as local programs send them.")
        if self.json_posts and scope.get("method") == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media not in self.body_types:
                return 415, (f"a POST body of type {media or 'none'!r} is refused: send "
                             f"{' or '.join(self.body_types)} (Content-Type), as the SDK does.")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.refusal(scope) if scope.get("type") == "http" else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message = refused
        body = json.dumps({"error": message, "category": "user"}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
