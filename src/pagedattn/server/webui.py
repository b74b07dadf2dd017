"""The browser pages: a chat page at ``/`` and a live view of the KV cache at ``/kv``.

Plain HTML, CSS and JavaScript shipped in the package (``static/``), read once at start and
served with a strict Content-Security-Policy (scripts and styles from this origin only, no
inline script, nothing from elsewhere). The pages hold no server data: they call the same
routes any client calls (``/v1/models``, ``/v1/chat/completions``, ``/v1/kv/state``), with the
API key the page asks for when the server has one, so without the key a page shows nothing
but its login prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

STATIC = Path(__file__).with_name("static")
#: route -> file of static/
PAGES = {"/": "index.html", "/kv": "kv.html"}
ASSET_PREFIX = "/webui/"
ASSETS = ("style.css", "common.js", "markdown.js", "chat.js", "kv.js", "favicon.svg")
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _handler(body: bytes, media_type: str) -> Callable[[], Coroutine[Any, Any, Response]]:
    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return serve


def add_webui(app: FastAPI) -> None:
    """Serve the pages and their assets (GET, no authentication: they carry no data).

    Raises:
        FileNotFoundError: an asset is missing from the package.
    """
    files = {route: name for route, name in PAGES.items()}
    files.update({ASSET_PREFIX + name: name for name in ASSETS})
    for route, name in files.items():
        body = (STATIC / name).read_bytes()
        media_type = MEDIA_TYPES[Path(name).suffix]
        app.add_api_route(
            route, _handler(body, media_type), methods=["GET"], include_in_schema=False
        )
