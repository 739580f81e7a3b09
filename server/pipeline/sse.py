"""The one SSE loop: a generation's typed events, rendered by an API's stream renderer.

Once the first byte of a stream is sent its status cannot change, so every failure after
that (an engine error, a deadline, a bug while a chunk is built) goes inside the stream as
the API's own terminal event (`Renderer.fail`), and the stream still ends properly. A client
that leaves cancels the generator; the request is aborted in `finally` and logged.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Iterable, Protocol

from sse_starlette.sse import EventSourceResponse

from ..errors import ApiError, ServerError
from .events import StreamEvent
from .generation import Generation

log = logging.getLogger("warmslot.server")

PING_S = 15  # a comment line while nothing else is sent, so proxies keep the stream open

SseItem = str | dict[str, Any]  # a data line, or {"event": ..., "data": ...}


class Renderer(Protocol):
    """How one API words a stream."""

    def start(self) -> Iterable[SseItem]:
        """What opens the stream (before the first event)."""

    def render(self, event: StreamEvent) -> Iterable[SseItem]:
        """What one event becomes; the `End` event's items close the stream."""

    def fail(self, error: ApiError) -> Iterable[SseItem]:
        """The API's terminal event(s) for a stream that failed after it started."""


def as_api_error(exc: Exception) -> ApiError:
    """An ApiError as it is; anything else is a bug, logged, and a 500-shaped error."""
    if isinstance(exc, ApiError):
        return exc
    log.error("unhandled error in a stream", exc_info=exc)
    return ServerError(f"internal error: {type(exc).__name__}")


def encoded(item: SseItem) -> SseItem | bytes:
    """A one-line data item as the bytes sse_starlette would make of it (`data: ...`, then
    an empty line, CRLF-separated), without its per-item event object; anything else as it is.

    NOTE: on a 2-core CPU the HTTP thread's work per token competes with llama.cpp's two
    threads for the cores, so the per-token path is kept short."""
    if type(item) is str and "\n" not in item and "\r" not in item:
        return f"data: {item}\r\n\r\n".encode()
    return item


async def stream(generation: Generation, renderer: Renderer) -> AsyncIterator[SseItem | bytes]:
    try:
        for item in renderer.start():
            yield encoded(item)
        async for event in generation.events():
            for item in renderer.render(event):
                yield encoded(item)
    except asyncio.CancelledError:
        generation.log_gone()
        raise
    except Exception as exc:  # noqa: BLE001 - the stream started: the error goes inside it
        for item in renderer.fail(as_api_error(exc)):
            yield item
    finally:
        generation.abort()  # no-op once every choice finished


class _EventStream(EventSourceResponse):
    """sse_starlette's response, without a cancel scope around every send when no send
    timeout is set (a client that stops reading is ended by the disconnect and the request's
    own deadline, not by a send timeout)."""

    async def _send_with_timeout(self, send, message) -> None:
        if self.send_timeout is not None:
            await super()._send_with_timeout(send, message)
        else:
            await send(message)


def sse_response(generation: Generation, renderer: Renderer) -> EventSourceResponse:
    generation.stop_watching()
    return _EventStream(stream(generation, renderer), headers=generation.headers, ping=PING_S)
