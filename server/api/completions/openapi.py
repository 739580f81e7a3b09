"""The text completion route in /openapi.json (/v1/completions; llama-server's /completions
is the native API's)."""

from __future__ import annotations

from typing import Any

from ...openapi_schemas import ENVELOPE, GENERATION, generation, nullable

_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            {"type": "array", "minItems": 1, "maxItems": 16, "description": "a batch of prompts", "items": {"oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            ]}},
        ]},
        "logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 5}),
        "echo": nullable({"type": "boolean"}),
        **GENERATION,
    },
}

_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        **ENVELOPE,
        "object": {"type": "string", "enum": ["text_completion"]},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["index", "text", "finish_reason"],
            "properties": {
                "index": {"type": "integer"},
                "text": {"type": "string"},
                "finish_reason": {"type": "string", "enum": ["stop", "length"]},
                "logprobs": {"type": "object", "nullable": True},
            },
        }},
    },
}

SCHEMAS = {"CompletionRequest": _REQUEST, "TextCompletion": _COMPLETION}


def paths() -> dict[str, Any]:
    return {"/v1/completions": generation("CompletionRequest", "TextCompletion", "a text completion (OpenAI API)")}
