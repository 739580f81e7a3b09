"""The last requests that ended, every tenant's, for the admin key (`GET /engine/requests`).

Each generation request leaves one summary as it ends, what its log line says: where its
prompt came from and why not more of it. Redacted as `/slots` and `/engine` show slots:
tenants and images by hash, the miss explanation's positions without its text, so the view
shows the admin every tenant's traffic and none of its words. Kept in memory, the newest
RECENT_REQUESTS only, and touched on the event loop only (added as a request ends, read by
the route), so it needs no lock.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Iterable

from warmslot.slots import MediaSpan, Reuse, Usage, tenant_hash

from . import explain
from .prompt.builder import Prompt

RECENT_REQUESTS = 50


@dataclasses.dataclass(frozen=True, slots=True)
class RequestSummary:
    id: str  # the engine request's id, as /slots shows a running one
    ended: float  # Unix seconds
    route: str  # the path it came in on
    tenant: str  # a short hash, as /slots shows a slot's tenant ("" for the anonymous tenant)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: int
    images: tuple[dict[str, Any], ...]  # each image's or clip's run: hash, kind, start, n_tokens
    explanation: dict[str, Any]  # explain.redacted: source, slot, matched, divergence, reason

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(
    req_id: str, route: str, tenant: str, reuse: Reuse | None, usage: Usage, prompt: Prompt | None, media: Iterable[MediaSpan],
) -> RequestSummary:
    """One ended request, redacted (nothing of its text, its images by hash)."""
    images = tuple(
        {"hash": s.chunk.media_id[:16], "kind": s.chunk.kind, "start": s.start, "n_tokens": s.chunk.n_tokens} for s in media
    )
    return RequestSummary(
        req_id, round(time.time(), 3), route, tenant_hash(tenant), usage.prompt_tokens, usage.cached_tokens,
        usage.completion_tokens, round(usage.ttft_s * 1000), images, explain.redacted(reuse, usage.prompt_tokens, prompt),
    )


class RecentRequests:
    """The newest summaries, oldest first as added."""

    def __init__(self, limit: int = RECENT_REQUESTS) -> None:
        self._items: collections.deque[RequestSummary] = collections.deque(maxlen=limit)

    def add(self, summary: RequestSummary) -> None:
        """Mutates: the oldest summary leaves past the limit."""
        self._items.append(summary)

    def newest_first(self, n: int | None = None) -> list[RequestSummary]:
        """Does not mutate."""
        items = list(reversed(self._items))
        return items[:n] if n is not None else items
