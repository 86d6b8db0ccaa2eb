"""The dashboard (SPEC §8): static HTML, CSS and ES modules in ``dashboard/``, served by
the API's own process. Nothing is loaded from elsewhere: the page's Content-Security-Policy
allows its own origin only, and no inline script or style (run data is shown as text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

DIR = Path(__file__).resolve().parent / "dashboard"
# the dashboard's own addresses (one page: its modules route on the path)
PAGES = ("/", "/approvals", "/runs/{run_id}", "/workflows", "/workflows/{name}")
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

    async def get_response(self, path: str, scope: Any) -> Any:
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
