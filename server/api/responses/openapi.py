"""The Responses routes in /openapi.json: a response (plain or streamed), its input tokens,
and the stored responses by id."""

from __future__ import annotations

from typing import Any

from ...openapi_schemas import JSON, SSE_EVENT, errors, input_tokens, json_body, nullable, number
from ...request.protocol import INT32_MAX

_REQUEST = {"type": "object", "required": ["input"], "properties": {
    "model": {"type": "string"},
    "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "instructions": nullable({"type": "string"}),
    "tools": nullable({"type": "array", "items": {"type": "object"}}),
    "tool_choice": nullable({"oneOf": [{"type": "string"}, {"type": "object"}]}),
    "text": nullable({"type": "object"}),
    "max_output_tokens": nullable({"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "stream": nullable({"type": "boolean"}),
    "store": nullable({"type": "boolean"}),
    "previous_response_id": nullable({"type": "string"}),
}}

_RESPONSE = {"type": "object", "required": ["id", "object", "status", "output"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]}, "status": {"type": "string"},
    "output": {"type": "array", "items": {"type": "object"}}, "usage": {"type": "object", "nullable": True},
}}


def paths() -> dict[str, Any]:
    create = {"post": {
        "summary": "a response (OpenAI's Responses API), plain or streamed as Responses events",
        "requestBody": {"required": True, "content": {JSON: {"schema": _REQUEST}}},
        "responses": {
            "200": {"description": "the response; with stream: server-sent Responses events",
                    "content": {JSON: {"schema": _RESPONSE}, "text/event-stream": {"schema": SSE_EVENT}}},
            **errors(400, 401, 408, 413, 500, 503),
        },
    }}
    by_id = {
        method: {
            "summary": summary,
            "parameters": [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": json_body({"type": "object"}, summary), **errors(401, 404, 500)},
        }
        for method, summary in (("get", "a stored response"), ("delete", "delete a stored response"))
    }
    count = input_tokens(_REQUEST)
    return {
        "/v1/responses": create, "/responses": create,
        "/v1/responses/input_tokens": count, "/responses/input_tokens": count,
        "/v1/responses/{response_id}": by_id,
    }
