"""ASGI middleware that keeps every answer in its API's shape and every connection usable.

- `error_shape`: an error's status and body as the API of the path words it; an API whose
  errors are not OpenAI's registers its shape for its paths (`register_error_shape`).
- `ErrorGuard`: an exception no handler knew answers 500 with an error body and is not
  raised further.
- `BodyLimit`: a request body beyond `--max-body` answers 413, from Content-Length before
  anything is read, or as soon as a streamed (chunked) body passes the limit.

NOTE: Starlette hands an `Exception` handler to its outermost `ServerErrorMiddleware`, which
sends the handler's response and then raises the exception again (so that servers can log
it). uvicorn then closes the connection, even though the response was complete, and a
keep-alive client's next request on it is reset. `ErrorGuard` sits inside that middleware
and swallows what it answered.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from ..errors import ApiError, ServerError

log = logging.getLogger("warmslot.server")


class PayloadTooLarge(ApiError):
    status = 413
    type = "invalid_request_error"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than {limit} bytes; raise the server's --max-body to send more",
            code="request_too_large",
            headers={"Connection": "close"},
        )


# how an API words an error: its status and body
ErrorShape = Callable[[ApiError], tuple[int, dict]]
_SHAPES: dict[str, ErrorShape] = {}  # by path: the path and the paths under it


def register_error_shape(paths: Iterable[str], shape: ErrorShape) -> None:
    """Errors on `paths` (and on the paths under them) take the shape of the API serving
    them (the Messages API registers Anthropic's); every other path answers OpenAI's."""
    for path in paths:
        _SHAPES[path] = shape


def error_shape(path: str, error: ApiError) -> tuple[int, dict]:
    """The status and body of `error` as the API of `path` words it."""
    for prefix, shape in _SHAPES.items():
        if path == prefix or path.startswith(prefix + "/"):
            return shape(error)
    return error.status, error.body()


async def send_error(send, error: ApiError, path: str = "") -> None:
    """Answer an ApiError as a complete JSON response through a raw ASGI `send`."""
    status, shaped = error_shape(path, error)
    body = json.dumps(shaped).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ErrorGuard:
    """Answer an unexpected exception with an OpenAI-shaped 500 and end the request there."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - answered here, so the connection stays usable
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise  # part of a response is out: only closing the connection can end it
            await send_error(send, ServerError(f"internal error: {type(exc).__name__}"), scope.get("path", ""))


class BodyLimit:
    """Refuse request bodies larger than `limit` bytes (0: no limit) with a 413."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.limit <= 0:
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            return await send_error(send, PayloadTooLarge(self.limit), scope.get("path", ""))
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # raised inside the handler's body read: the app's ApiError handler answers
                    raise PayloadTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
