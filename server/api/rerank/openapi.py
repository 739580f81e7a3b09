"""The rerank routes in /openapi.json: both request shapes (Jina's and Cohere's, TEI's) and
both replies."""

from __future__ import annotations

from typing import Any

from ...openapi_schemas import errors, post
from .route import PATHS

_REQUEST = {"type": "object", "required": ["query"], "properties": {
    "model": {"type": "string"},
    "query": {"type": "string"},
    "documents": {"type": "array", "minItems": 1, "items": {"oneOf": [
        {"type": "string"}, {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
    ]}},
    "texts": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    "top_n": {"type": "integer", "minimum": 0},
    "return_documents": {"type": "boolean"},
    "return_text": {"type": "boolean"},
}}

_REPLY = {"oneOf": [
    {"type": "object", "required": ["object", "results", "usage"], "properties": {
        "object": {"type": "string", "enum": ["list"]}, "model": {"type": "string"}, "usage": {"type": "object"},
        "results": {"type": "array", "items": {"type": "object", "required": ["index", "relevance_score"]}},
    }},
    {"type": "array", "items": {"type": "object", "required": ["index", "score"]}},
]}


def paths() -> dict[str, Any]:
    rerank = post(_REQUEST, _REPLY, "relevance scores of documents for a query, best first (with --reranking); with texts, TEI's list")
    rerank["post"]["responses"].update(errors(501))
    return {path: rerank for path in PATHS}
