"""The dashboard: static HTML, CSS and ES modules in ``dashboard/``, served by
the API's own process. Nothing is loaded from elsewhere: the page's Content-Security-Policy
allows its own origin only, and no inline script or style (run data is shown as text).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

DIR = Path(__file__).resolve().parent / "dashboard"
# the dashboard's own addresses (one page: its modules route on the path)
PAGES = ("/", "/approvals", "/runs/{run_id}", "/workflows", "/workflows/{name}", "/schedules",
         "/workers", "/conversations", "/conversations/{run_id}")
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _Files(StaticFiles):
    """The modules and the style sheet, with the page's headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def mount(app: FastAPI) -> None:
    """Serve the page at `PAGES` (no token needed: it holds no data) and its files
    under ``/ui/``."""
    index = (DIR / "index.html").read_bytes()

    async def page() -> Response:
        return Response(index, media_type="text/html; charset=utf-8", headers=HEADERS)

    for path in PAGES:
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)
    app.mount("/ui", _Files(directory=DIR), name="dashboard")
    _mount_docs(app)


# /docs: Swagger UI from the files a Python package ships (fastapi-offline, the server
# extra's), never from a CDN; its page allows inline styles (Swagger UI sets them) and
# nothing else from elsewhere
DOCS_HEADERS = {**HEADERS, "Content-Security-Policy":
                "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                "form-action 'none'; frame-ancestors 'none'"}
DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>interlock API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/ui/favicon.svg">
<script src="/docs/assets/swagger-ui-bundle.js" defer></script>
<script src="/ui/docs.js" defer></script>
</head><body><div id="swagger-ui"></div>
<noscript>The API is described at <a href="/openapi.json">/openapi.json</a>.</noscript>
</body></html>"""
NO_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>interlock API</title></head><body>
<p>The interactive API page needs Swagger UI's files, which the server extra installs
(<code>pip install 'interlock[server]'</code>, or <code>pip install -e '.[server]'</code> in a
checkout: the fastapi-offline package). The API is
described at <a href="/openapi.json">/openapi.json</a>; docs/server.md explains it.</p>
</body></html>"""


def swagger_dir() -> Path | None:
    """Where Swagger UI's files are (fastapi-offline's package data), without importing
    the package; None when it is not installed."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    return static if (static / "swagger-ui-bundle.js").is_file() else None


def _mount_docs(app: FastAPI) -> None:
    assets = swagger_dir()
    body = (DOCS_PAGE if assets is not None else NO_DOCS_PAGE).encode()

    async def docs() -> Response:
        return Response(body, media_type="text/html; charset=utf-8", headers=DOCS_HEADERS)

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    if assets is not None:
        app.mount("/docs/assets", _DocsFiles(directory=assets), name="docs-assets")


class _DocsFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(DOCS_HEADERS)
        return response
