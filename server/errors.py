"""Typed API errors and their OpenAI-shaped bodies.

Every error the HTTP layer can answer with is an `ApiError` subclass. The app maps
them to responses in one place (`server.app`), so no handler formats error JSON itself.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI error body."""

    status: int = 500
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        error.update(self.extra)
        return {"error": error}


class InvalidRequest(ApiError):
    """400: malformed JSON, wrong types, unsupported values. `param` names the field."""

    status = 400
    type = "invalid_request_error"


class ContextOverflow(InvalidRequest):
    """400: the prompt cannot fit in a slot's context.

    NOTE: clients decide from the message text whether to compress the history and retry.
    The message carries llama-server's wording ("exceeds the available context size"), which
    litellm maps to ContextWindowExceededError and hermes-agent to context overflow, and
    "context size is N", from which hermes-agent reads the real limit. Its `type` is
    llama-server's too."""

    type = "exceed_context_size_error"

    def __init__(self, n_prompt_tokens: int, n_ctx: int, *, param: str = "messages") -> None:
        super().__init__(
            f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), "
            f"try increasing it: a slot's context size is {n_ctx} tokens; shorten the prompt, or start "
            "the server with a larger --ctx-size or fewer --parallel slots",
            param=param,
            code="exceed_context_size_error",
            extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx},
        )


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"

    def __init__(self, message: str = "invalid or missing API key") -> None:
        super().__init__(message, code="invalid_api_key")


class Forbidden(ApiError):
    """403: the key is valid, but the route is for the admin key."""

    status = 403
    type = "permission_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="admin_key_required")


class NotFound(ApiError):
    status = 404
    type = "not_found_error"


class NotSupported(ApiError):
    """501: an endpoint this server was started without (llama-server's status for it)."""

    status = 501
    type = "not_supported_error"


class ModelNotFound(NotFound):
    """404 for a model id the server does not serve, as OpenAI answers it."""

    type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist", param="model", code="model_not_found")


class MethodNotAllowed(ApiError):
    status = 405
    type = "invalid_request_error"


class Unavailable(ApiError):
    """503: the model is still loading, or the waiting queue is full."""

    status = 503
    type = "unavailable_error"

    def __init__(self, message: str, *, retry_after: int = 1, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


def shutting_down(message: str = "the server is shutting down; retry on another instance or later") -> Unavailable:
    return Unavailable(message, retry_after=1, code="shutting_down")


class RequestTimeout(ApiError):
    """408: the request passed its deadline (`timeout` in the body, --request-timeout)."""

    status = 408
    type = "timeout_error"

    def __init__(self, message: str) -> None:
        # NOTE: OpenAI's clients retry a 408 unless told not to; the same request would
        # only pass the same deadline again
        super().__init__(message, code="request_timeout", headers={"x-should-retry": "false"})


class ClientClosed(ApiError):
    """499 (nginx's "client closed request"): the client left; nothing reaches it, the
    status only shows in the access log and the request counters."""

    status = 499
    type = "client_closed_request"


class ServerError(ApiError):
    status = 500
    type = "server_error"
