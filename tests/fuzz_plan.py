"""Where tests/api/test_fuzz.py spends its requests: cases per request schema, by what they can vary.

The server's document lists 47 operations, but many share what a request to them carries.
Some are one route under other paths (aliases: /v1/rerank, /rerank, /v1/reranking and
/reranking are one operation, one handler); some are other routes that take the same request
(a chat completion and its /input_tokens count; /tokenize and /apply-template). Drawing from
all operations at once spread the requests about evenly over operations, and unevenly over
what they test: the four rerank paths took a fifth of the requests (and, each pair of a query
and a document computing logits over Gemma's 262k-token vocabulary, most of the server's
time), a chat completion request with its ~90 schema nodes got no more than the slot action
with 7, a route with nothing to vary (GET /health) was drawn again and again into the same
request, and a chat request was generated separately for each route that takes one.

A plan groups the routes by method and request (parameters and body): a group's generated
cases go to each of its routes, on its paths in turn. A group whose requests can vary gets
`floor` cases and a share of the rest in proportion to the size of what they can vary: the
schema nodes of the parameters and body, `$ref`s followed. A group with nothing to vary gets
one case on each path: any other would be the same request. The fuzzer splits a group's cases between
requests that break the schema (negative) and requests that follow it (positive), and never
sends a request it has sent already (`request_key`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
IGNORED = ("description", "summary", "example", "examples", "title")  # words, not something a request varies


@dataclass(frozen=True)
class Group:
    """Routes of one method that take the same request: each route's paths (aliases; the route
    with the most first), and how many cases to generate for them. Each case goes to every
    route; the cases are generated on the first route's paths in turn (`lanes`)."""

    method: str  # upper case, as schemathesis labels operations
    routes: tuple[tuple[str, ...], ...]
    cases: int

    @property
    def requests(self) -> int:
        """The requests the plan asks for: each lane's cases, on every route."""
        return sum(n for _, n in self.lanes()) * len(self.routes)

    @property
    def labels(self) -> list[str]:
        return [f"{self.method} {path}" for paths in self.routes for path in paths]

    def lanes(self) -> list[tuple[tuple[str, ...], int]]:
        """For each path of the first route: the path on each route that its cases go to
        (the first is where they are generated), and how many cases (at least one)."""
        n = len(self.routes[0])
        return [(tuple(paths[k % len(paths)] for paths in self.routes), max(1, self.cases // n + (k < self.cases % n)))
                for k in range(n)]


def schema_size(node: Any, components: dict[str, Any], seen: tuple[str, ...] = ()) -> int:
    """Schema nodes under `node` (each object counts one), a `$ref` followed once per chain."""
    if isinstance(node, list):
        return sum(schema_size(item, components, seen) for item in node)
    if not isinstance(node, dict):
        return 0
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        return 1 if name in seen else schema_size(components.get(name, {}), components, (*seen, name))
    return 1 + sum(schema_size(value, components, seen) for key, value in node.items() if key not in IGNORED)


def request_of(operation: dict[str, Any]) -> dict[str, Any]:
    """What a request to `operation` carries: its parameters and request body."""
    return {part: operation[part] for part in ("parameters", "requestBody") if part in operation}


def plan(document: dict[str, Any], total: int, floor: int) -> list[Group]:
    """About `total` requests over the document's routes, grouped by request: a group whose
    requests can vary gets `floor` cases and a share of the rest by size; one with nothing to
    vary, one case (on each of its paths)."""
    components = document.get("components", {}).get("schemas", {})
    routes: dict[tuple[str, str], list[str]] = {}  # (method, the operation's JSON) -> its paths
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                routes.setdefault((method.upper(), json.dumps(operation, sort_keys=True)), []).append(path)
    grouped: dict[tuple[str, str], list[tuple[str, ...]]] = {}  # (method, the request's JSON) -> routes
    sizes: dict[tuple[str, str], int] = {}
    for (method, operation), paths in routes.items():
        request = request_of(json.loads(operation))
        key = (method, json.dumps(request, sort_keys=True) if request else operation)  # nothing to vary: a group each
        grouped.setdefault(key, []).append(tuple(paths))
        sizes[key] = schema_size(list(request.values()), components)
    varied = [key for key in grouped if sizes[key] > 0]
    fixed = [key for key in grouped if sizes[key] == 0]
    left = max(0, total - sum(len(grouped[key]) for key in fixed) - sum(floor * len(grouped[key]) for key in varied))
    weight = sum(sizes[key] * len(grouped[key]) for key in varied) or 1
    return [
        Group(key[0], tuple(sorted(grouped[key], key=len, reverse=True)),
              1 if key in fixed else floor + round(left * sizes[key] / weight))
        for key in grouped
    ]


def request_key(case) -> str:
    """What makes a request the same request: method, path, query, headers and body."""
    body = case.body if not isinstance(case.body, bytes) else case.body.hex()
    return json.dumps([case.method, case.formatted_path, case.query, dict(case.headers or {}), case.cookies, body],
                      sort_keys=True, default=repr)
