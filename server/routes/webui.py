"""The web page at `/`: a chat with the model and a live view of the slots and the cache.

Three static files shipped inside the package (`server/webui/`), plain JavaScript and CSS with
nothing fetched from elsewhere, so the page works offline and needs no build step. The page
talks to the server through the public routes only (`/v1/chat/completions`, `/engine`,
`/metrics`, `/props`, and `/engine/requests` for the admin key), with the key the user types,
so it shows exactly what that key may see.
`--no-webui` leaves these routes out of the table (404).
"""

from __future__ import annotations

import importlib.resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import NotFound

# name → media type; nothing else under the folder is served
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# the page is small and changes with the package: revalidated on every load
HEADERS = {"cache-control": "no-cache", "x-content-type-options": "nosniff"}


def read(name: str) -> bytes:
    """One of the page's files, as shipped in the package."""
    return importlib.resources.files(__package__.rsplit(".", 1)[0]).joinpath("webui", name).read_bytes()


# the page runs its own script only (inline styles: the bars' widths), nothing from elsewhere;
# images may be data: URLs (the thumbnails of attached images, read in the page)
PAGE_POLICY = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"


async def page(request: Request) -> Response:
    headers = {**HEADERS, "content-security-policy": PAGE_POLICY}
    return Response(read("index.html"), media_type=FILES["index.html"], headers=headers)


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in FILES:
        raise NotFound(f"no file {name!r} in the web page")
    return Response(read(name), media_type=FILES[name], headers=HEADERS)


ROUTES = [Route("/", page), Route("/webui/{name}", asset)]
