"""Anthropic's error shape on its routes: `{"type": "error", "error": {"type", "message"}}`.

The server's errors are typed once (`server/errors.py`); this module only words them as
Anthropic does, by status: 400 `invalid_request_error`, 401 `authentication_error`, 403
`permission_error`, 404 `not_found_error`, 413 `request_too_large`, 529 `overloaded_error`
(the server is busy, loading or draining: Anthropic's clients retry a 529 after
`retry-after`), 500 `api_error`. A prompt that cannot fit starts with Anthropic's own
wording ("prompt is too long: N tokens > M maximum"), which Claude Code reads to compact
its history.
"""

from __future__ import annotations

from typing import Any

from ...errors import ApiError, ContextOverflow, Unavailable

PATHS = ("/v1/messages", "/messages")  # with the paths under them: errors take this shape
OVERLOADED = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}


def status_of(error: ApiError) -> int:
    return OVERLOADED if isinstance(error, Unavailable) else error.status


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error")


def message_of(error: ApiError) -> str:
    text = error.message
    if isinstance(error, ContextOverflow):
        n_prompt, n_ctx = error.extra.get("n_prompt_tokens"), error.extra.get("n_ctx")
        text = f"prompt is too long: {n_prompt} tokens > {n_ctx} maximum; {text}"
    if error.param:
        text = f"{error.param}: {text}"
    return text


def error_body(error: ApiError) -> dict[str, Any]:
    """The body of `error` on a Messages route (the param is named in the message)."""
    return {"type": "error", "error": {"type": error_type(status_of(error)), "message": message_of(error)}}


def shaped(error: ApiError) -> tuple[int, dict[str, Any]]:
    """The status and body of `error` on a Messages route (registered with the error guard)."""
    return status_of(error), error_body(error)
