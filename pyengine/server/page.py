"""The chat page: ``GET /`` from a browser, and the two files it loads.

A browser (an Accept header that names text/html) gets static/index.html; programs
(curl, client libraries probing whether the server is up) keep the plain-text answer.
The page holds no secrets, so it is served without the API key; every API call it
makes carries the key the user typed into its settings. Its headers forbid inline
script, other origins and framing: model text that slipped into markup could not run.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

router = APIRouter()

RUNNING_TEXT = "pyengine is running"
# URL path -> (file under static/, content type). Nothing else under static/ is reachable.
ASSETS = {
    "/static/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/static/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
PAGE = ("index.html", "text/html; charset=utf-8")
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate, so an upgraded server's page is picked up
}


def wants_html(accept: str | None) -> bool:
    """Whether an Accept header asks for text/html (with a non-zero quality)."""
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() not in ("text/html", "application/xhtml+xml"):
            continue
        quality = next((p.split("=", 1)[1] for p in params if p.lower().startswith("q=")), "1")
        try:
            if float(quality) > 0:
                return True
        except ValueError:
            continue
    return False


@functools.cache
def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _file_response(name: str, content_type: str) -> Response:
    # HEAD gets the same headers; the ASGI server leaves the body out.
    return Response(_read(name), headers=PAGE_HEADERS, media_type=content_type)


@router.api_route("/", methods=["GET", "HEAD"])
async def root(request: Request) -> Response:
    """The chat page for browsers, the plain "is running" text (which Ollama clients probe) for the rest."""
    if wants_html(request.headers.get("accept")):
        response = _file_response(*PAGE)
    else:
        response = PlainTextResponse(RUNNING_TEXT)
    response.headers["Vary"] = "Accept"
    return response


def _asset_route(path: str, name: str, content_type: str) -> None:
    async def asset() -> Response:
        return _file_response(name, content_type)

    router.add_api_route(path, asset, methods=["GET", "HEAD"], name=f"asset {name}")


for _path, (_name, _type) in ASSETS.items():
    _asset_route(_path, _name, _type)


__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "RUNNING_TEXT", "router", "wants_html"]
