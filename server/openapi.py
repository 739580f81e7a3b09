"""The OpenAPI 3.0 document served at /openapi.json: every route, with the request bodies the
parsers accept and the bodies the handlers answer.

Each API owns its part (the `openapi.py` of its package: its paths and the component schemas
they refer to) and the composition root (`server.app`) registers it here; the pieces the parts
share (the error body, the chat message, the generation fields) are in `openapi_schemas`. This
module lists the core's own routes and assembles the document.

The schemas say what a valid request looks like; the parsers check more than a schema can
(token ids within the vocabulary, a prompt that fits a slot, grammars llama.cpp can compile)
and answer those with a 400. The fuzzing suite (tests/api/test_fuzz.py) generates requests from
this document and checks every response against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .openapi_schemas import SCHEMAS, get


@dataclass(frozen=True)
class OpenApiPart:
    """What one API adds to the document: its paths and the component schemas they refer to."""

    paths: dict[str, Any]
    schemas: dict[str, Any] = field(default_factory=dict)


_PARTS: dict[str, OpenApiPart] = {}  # by API name, in the order registered
_DOCUMENT: dict[str, Any] | None = None  # the served document, built on the first request


def register(name: str, paths: dict[str, Any], schemas: dict[str, Any] | None = None) -> None:
    """Add the part of the API `name` to the document (again: replace it)."""
    global _DOCUMENT
    _PARTS[name] = OpenApiPart(paths, schemas or {})
    _DOCUMENT = None


def _core_paths() -> dict[str, Any]:
    """The routes of the core itself."""
    return {
        "/metrics": get({"type": "string"}, "Prometheus metrics", 401, media="text/plain"),
        "/openapi.json": get({"type": "object"}, "this document"),
    }


def _merged(kind: str, base: dict[str, Any], parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    merged = dict(base)
    for name, entries in parts:
        taken = sorted(set(merged) & set(entries))
        if taken:
            raise ValueError(f"the OpenAPI part of {name} repeats {kind} {', '.join(taken)}")
        merged.update(entries)
    return merged


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    """The document of the core's routes and every registered part."""
    paths = _merged("paths", _core_paths(), [(name, part.paths) for name, part in _PARTS.items()])
    schemas = _merged("schemas", SCHEMAS, [(name, part.schemas) for name, part in _PARTS.items()])
    return {
        "openapi": "3.0.3",
        "info": {"title": "warmslot", "version": version, "description": "An OpenAI-compatible llama.cpp server that never recomputes a prefix it has seen."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "--api-key; health, models and this document need none"}},
        },
    }


async def openapi_endpoint(request) -> Any:
    from starlette.responses import JSONResponse

    from .version import version_info

    global _DOCUMENT
    if _DOCUMENT is None:
        _DOCUMENT = openapi_document(version_info()["version"])
    return JSONResponse(_DOCUMENT)
