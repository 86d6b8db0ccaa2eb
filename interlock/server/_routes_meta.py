"""The server's own endpoints: its health, who the caller is, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

import interlock
from interlock.support import METRICS_CONTENT_TYPE, redact

from ._deps import Reader, Srv
from ._models import Health, Me

router = APIRouter()


@router.get("/api/health", response_model=Health)
async def health(server: Srv) -> dict[str, Any]:
    return {"status": "ok", "store": redact(server.st.url),
            "version": interlock.__version__, "workflows": len(server.workflows),
            "workers": server.options.workers, "running": server.runs.running}

@router.get("/api/me", response_model=Me)
async def me(who: Reader) -> dict[str, Any]:
    """Who the request's token is (``local`` without --auth): what the dashboard
    shows, and so the page knows a token is needed (401)."""
    return {"name": who.name, "roles": list(who.roles),
            "authenticated": who.authenticated}

@router.get("/metrics", response_class=Response, include_in_schema=False)
async def metrics(server: Srv, who: Reader) -> Response:
    """Prometheus's text format: the store's runs and pending approvals (read now),
    and the node attempts, durations and tokens of the runs this server executed."""
    await server.metrics.refresh(server.st)
    return Response(server.metrics.text(), media_type=METRICS_CONTENT_TYPE)
