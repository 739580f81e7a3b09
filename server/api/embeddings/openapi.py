"""The embeddings routes in /openapi.json (/v1/embeddings, llama-server's /embeddings)."""

from __future__ import annotations

from typing import Any

from ...openapi_schemas import errors, nullable, post

_REQUEST = {"type": "object", "required": ["input"], "properties": {
    "model": {"type": "string"},
    "input": {"oneOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer", "minimum": 0}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
        {"type": "array", "items": {"type": "object", "required": ["content"], "description": "llama-server's form: text parts, joined",
                                    "properties": {"content": {"type": "array", "items": {"type": "object"}}}}},
    ]},
    "encoding_format": nullable({"type": "string", "enum": ["float", "base64"]}),
    "dimensions": nullable({"type": "integer", "minimum": 1}),
}}

_REPLY = {"type": "object", "required": ["object", "data", "usage"], "properties": {
    "object": {"type": "string", "enum": ["list"]}, "model": {"type": "string"},
    "data": {"type": "array", "items": {"type": "object", "required": ["embedding", "index"]}},
    "usage": {"type": "object"},
}}


def paths() -> dict[str, Any]:
    embeddings = post(_REQUEST, _REPLY, "embeddings of texts or token ids (with --embeddings)")
    embeddings["post"]["responses"].update(errors(501))
    return {"/v1/embeddings": embeddings, "/embeddings": embeddings}
