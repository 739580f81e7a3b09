"""llama-server's native completion routes in /openapi.json (/completion, /completions, /infill)."""

from __future__ import annotations

from typing import Any

from ...openapi_schemas import SSE_EVENT, errors

_REQUEST = {"type": "object", "required": ["prompt"], "properties": {
    "prompt": {"oneOf": [{"type": "string"}, {"type": "array"}, {"type": "object"}]},
    "n_predict": {"type": "integer"},
    "n_probs": {"type": "integer"},
    "post_sampling_probs": {"type": "boolean"},
    "return_tokens": {"type": "boolean"},
    "stream": {"type": "boolean"},
    "n_indent": {"type": "integer"},
    "t_max_predict_ms": {"type": "integer"},
}}
_MIXED = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}]}
_INFILL = {"type": "object", "required": ["input_prefix", "input_suffix"], "properties": {
    **{k: v for k, v in _REQUEST["properties"].items() if k != "prompt"},
    "input_prefix": _MIXED,
    "input_suffix": _MIXED,
    "input_extra": {"type": "array", "items": {"type": "object", "required": ["text"], "properties": {
        "filename": {"type": "string"}, "text": {"type": "string"}}}},
    "prompt": {"type": "string"},
}}
_REPLY = {"type": "object", "required": ["content", "stop"], "properties": {
    "content": {"type": "string"}, "tokens": {"type": "array", "items": {"type": "integer"}}, "stop": {"type": "boolean"},
    "stop_type": {"type": "string"}, "tokens_predicted": {"type": "integer"}, "tokens_evaluated": {"type": "integer"},
    "timings": {"type": "object"}, "generation_settings": {"type": "object"},
}}


def paths() -> dict[str, Any]:
    completion = {"post": {
        "summary": "llama-server's native completion: one reply object, a list for several prompts; with stream: data lines",
        "requestBody": {"required": True, "content": {"application/json": {"schema": _REQUEST}}},
        "responses": {
            "200": {"description": "the reply (a list for several prompts)",
                    "content": {"application/json": {"schema": {"oneOf": [_REPLY, {"type": "array", "items": _REPLY}]}},
                                "text/event-stream": {"schema": SSE_EVENT}}},
            **errors(400, 401, 408, 413, 500, 503),
        },
    }}
    infill = {"post": {
        "summary": "llama-server's fill-in-the-middle completion (code editors): the text at the cursor, from the model's FIM tokens",
        "requestBody": {"required": True, "content": {"application/json": {"schema": _INFILL}}},
        "responses": {
            "200": {"description": "the reply", "content": {"application/json": {"schema": _REPLY},
                                                            "text/event-stream": {"schema": SSE_EVENT}}},
            **errors(400, 401, 408, 413, 500, 503),
        },
    }}
    return {"/completions": completion, "/completion": completion, "/infill": infill}
