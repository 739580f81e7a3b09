"""CORS, with llama-server's flags and meaning, so that web pages on other origins can call
the server from a browser.

- `--cors-origins` (default `*`): with `*` and credentials on (the default) the request's
  `Origin` is echoed back, so any page may call the server, as llama-server allows;
  `localhost` echoes only origins on this machine (localhost, 127.0.0.1, [::1], any port);
  otherwise a comma-separated list of origins, each echoed when it is the request's.
- A preflight (`OPTIONS`, any path) is answered 200 at once, before the API key is checked
  (browsers send none there), with `--cors-methods`, `--cors-headers` and whether
  credentials are allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$", re.IGNORECASE)


@dataclass(frozen=True)
class CorsPolicy:
    origins: str = "*"
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = "*"
    credentials: bool = True

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request from `origin` (None: none)."""
        if self.origins == "*":
            return origin if self.credentials and origin else "*"
        if not origin:
            return None
        if self.origins == "localhost":
            return origin if LOCAL_ORIGIN.match(origin) else None
        allowed = {o.strip() for o in self.origins.split(",") if o.strip()}
        return origin if origin in allowed else None


class Cors:
    """ASGI middleware: preflights answered, the allowed origin added to every response."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed = self.policy.allow_origin(Headers(scope=scope).get("origin"))
        extra = [(b"Access-Control-Allow-Origin", allowed.encode("latin-1"))] if allowed else []
        if scope["method"] == "OPTIONS":
            p = self.policy
            extra += [
                (b"Access-Control-Allow-Credentials", b"true" if p.credentials else b"false"),
                (b"Access-Control-Allow-Methods", p.methods.encode("latin-1")),
                (b"Access-Control-Allow-Headers", p.headers.encode("latin-1")),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": extra})
            await send({"type": "http.response.body", "body": b""})
            return
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_origin(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), *extra])
            await send(message)

        await self.app(scope, receive, send_with_origin)
