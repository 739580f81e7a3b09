"""Vertex AI's settings, read from the environment of a custom prediction container.

The process reads them, not the Vertex API (api/vertex/route.py): the port must be known before
anything heavy is imported (cli.py binds it first) and it overrides --port; the routes' paths
then go to the API with the config.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Vertex:
    port: int
    predict_route: str
    health_route: str | None


def from_env(env: Mapping[str, str] | None = None) -> Vertex | None:
    """Vertex AI's settings, when the container runs in its prediction mode."""
    env = os.environ if env is None else env
    if env.get("AIP_MODE") != "PREDICTION":
        return None

    def route(name: str, default: str | None) -> str | None:
        value = env.get(name) or default
        return value if value is None or value.startswith("/") else "/" + value

    return Vertex(port=int(env.get("AIP_HTTP_PORT") or 8080), predict_route=route("AIP_PREDICT_ROUTE", "/predict"),
                  health_route=route("AIP_HEALTH_ROUTE", None))
