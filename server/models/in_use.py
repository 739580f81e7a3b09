"""The requests a model serves, counted from the moment a request picks it until its response
is sent (a stream's last event included), so that a model is never unloaded under one."""

from __future__ import annotations

from typing import Any

SCOPE_KEY = "warmslot.models"  # in the ASGI scope: [(registry, entry, keep_alive)] the request holds


def hold(scope: dict, models: Any, entry: Any, keep_alive: float | None) -> None:
    """The request of `scope` uses `entry` until its response is sent (see ModelsInUse)."""
    scope.setdefault(SCOPE_KEY, []).append((models, entry, keep_alive))


class ModelsInUse:
    """ASGI middleware: after the response (or a failure), the models the request held are
    released, each with the request's keep-alive."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        finally:
            for models, entry, keep_alive in scope.pop(SCOPE_KEY, ()):
                models.release(entry, keep_alive)
