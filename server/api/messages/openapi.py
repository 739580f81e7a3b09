"""The Messages routes in /openapi.json (the app registers them with `server/openapi.py`):
Anthropic's request and reply shapes, and its error body on every error status."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
INT32_MAX = 2**31 - 1

_TEXT_BLOCK = {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}, "cache_control": {"type": "object"},
}}
_TOOL_REFERENCE = {"type": "object", "required": ["type", "tool_name"], "description": "shows a deferred tool's definition", "properties": {
    "type": {"type": "string", "enum": ["tool_reference"]}, "tool_name": {"type": "string"},
}}
_BLOCK = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["text", "tool_use", "tool_result", "thinking", "redacted_thinking"]},
    "text": {"type": "string"}, "id": {"type": "string"}, "name": {"type": "string"}, "input": {"type": "object"},
    "tool_use_id": {"type": "string"},
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"oneOf": [_TEXT_BLOCK, _TOOL_REFERENCE]}}]},
    "is_error": {"type": "boolean"}, "thinking": {"type": "string"}, "signature": {"type": "string"},
    "cache_control": {"type": "object"},
}}
_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"type": "string", "enum": ["user", "assistant", "system"]},
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]},
}}
_TOOL = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "description": {"type": "string"}, "input_schema": {"type": "object"},
    "cache_control": {"type": "object"},
    "type": {"type": "string", "description": "custom; a server tool's type (web_search_20250305, ...) leaves it out"},
    "defer_loading": {"type": "boolean", "description": "callable, but listed only where a tool_reference shows it"},
}}
_FORMAT = {"type": "object", "required": ["type", "schema"], "properties": {
    "type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object"},
}}
_PROMPT = {
    "model": {"type": "string", "minLength": 1, "description": "any name: the loaded model answers"},
    "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]},
    "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
    "tools": {"type": "array", "items": _TOOL},
    "tool_choice": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
        "disable_parallel_tool_use": {"type": "boolean"},
    }},
    "thinking": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]},
        "budget_tokens": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
    }},
    "output_config": {"type": "object", "properties": {
        "effort": {"type": "string", "description": "low, medium, high: the reasoning budget with adaptive thinking"},
        "format": _FORMAT,
    }},
    "output_format": _FORMAT,
    "context_management": {"type": "object", "description": "accepted, changes nothing"},
}
_REQUEST = {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
    **_PROMPT,
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": INT32_MAX},
    "stop_sequences": {"type": "array", "maxItems": 16, "items": {"type": "string"}},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
    "stream": {"type": "boolean"},
    "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}},
}}
_USAGE = {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
    name: {"type": "integer", "minimum": 0}
    for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
}}
_MESSAGE_REPLY = {"type": "object", "required": ["id", "type", "role", "content", "stop_reason", "usage"], "properties": {
    "id": {"type": "string"}, "type": {"type": "string", "enum": ["message"]}, "role": {"type": "string", "enum": ["assistant"]},
    "model": {"type": "string"}, "content": {"type": "array", "items": {"type": "object", "required": ["type"]}},
    "stop_reason": {"type": "string", "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
    "stop_sequence": {"type": "string", "nullable": True}, "usage": _USAGE,
}}
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"}, "data": {"type": "string", "description": "the event's JSON, its `type` repeating the event name"},
}}
ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"type": "string", "enum": ["error"]},
    "error": {"type": "object", "required": ["type", "message"], "properties": {"type": {"type": "string"}, "message": {"type": "string"}}},
}}
_WORDS = {
    400: "invalid_request_error (the message names the field)", 401: "authentication_error: missing or wrong API key",
    408: "timeout_error: the request passed its timeout", 413: "request_too_large: the body is larger than --max-body",
    500: "api_error: the model failed to load, or an internal error",
    529: "overloaded_error: queue full, KV cache full, loading or shutting down (retry-after says when to retry)",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": _WORDS[s], "content": {JSON: {"schema": ERROR}}} for s in statuses}


def paths() -> dict[str, Any]:
    create = {"post": {
        "summary": "a message (Anthropic's Messages API), plain or streamed as Messages events",
        "requestBody": {"required": True, "content": {JSON: {"schema": _REQUEST}}},
        "responses": {
            "200": {"description": "the message; with stream: message_start, content blocks, message_delta, message_stop (an error event if one happens after the start)",
                    "content": {JSON: {"schema": _MESSAGE_REPLY}, "text/event-stream": {"schema": _SSE_EVENT}}},
            **_errors(400, 401, 408, 413, 500, 529),
        },
    }}
    count = {"post": {
        "summary": "the prompt tokens a Messages request would take (rendered and tokenized as /v1/messages does)",
        "requestBody": {"required": True, "content": {JSON: {"schema": {"type": "object", "required": ["model", "messages"], "properties": _PROMPT}}}},
        "responses": {
            "200": {"description": "the count", "content": {JSON: {"schema": {"type": "object", "required": ["input_tokens"], "properties": {
                "input_tokens": {"type": "integer", "minimum": 0}}}}}},
            **_errors(400, 401, 408, 413, 500, 529),
        },
    }}
    return {"/v1/messages": create, "/messages": create, "/v1/messages/count_tokens": count, "/messages/count_tokens": count}
