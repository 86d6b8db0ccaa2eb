"""The server's own endpoints: its health, who the caller is, Prometheus metrics."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import yaml
from fastapi import APIRouter, Response

import interlock
from interlock.support import METRICS_CONTENT_TYPE, owner_gone, redact, sqlite_file

from ._deps import Reader, Srv
from ._guard import Problemed
from ._models import Health, Me

router = APIRouter()


@router.get("/api/health", response_model=Health)
async def health(server: Srv) -> dict[str, object]:
    return {"status": "ok", "store": redact(server.st.url),
            "store_file": sqlite_file(server.st.url),
            "version": interlock.__version__, "workflows": len(server.workflows),
            "workers": server.options.workers, "running": server.runs.running}

@router.get("/api/me", response_model=Me)
async def me(who: Reader) -> dict[str, object]:
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


PRICES_ENV = "INTERLOCK_PRICES"


def read_prices(path: str) -> dict[str, dict[str, float]]:
    """The price table at ``path`` (YAML or JSON): ``{model: {input: USD, output: USD}}``,
    each the price of a million prompt (``input``) or completion (``output``) tokens.
    A mistake is a `ValueError` naming the file, the model and what is expected."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{PRICES_ENV}={path}: cannot read the price table: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{PRICES_ENV}={path}: the price table is a mapping of model names "
                         "to {input: USD per 1M prompt tokens, output: USD per 1M "
                         "completion tokens}")
    out: dict[str, dict[str, float]] = {}
    for model, price in data.items():
        ok = isinstance(price, dict) and set(price) <= {"input", "output"} and price and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0 for v in price.values())
        if not ok:
            raise ValueError(f"{PRICES_ENV}={path}: model {model!r}: expected {{input: USD, "
                             f"output: USD}} per million tokens (numbers >= 0), got {price!r}")
        out[str(model)] = {k: float(v) for k, v in price.items()}
    return out


@router.get("/api/prices", responses={200: {"description": "`{model: {input, output}}`: "
                                                         "USD per million prompt/completion "
                                                         "tokens, from INTERLOCK_PRICES"}})
async def prices(who: Reader) -> dict[str, dict[str, float]]:
    """The price table the dashboard computes an agent call's cost with: the file
    ``INTERLOCK_PRICES`` names (read on each request, so an edit needs no restart);
    ``{}`` when it is not set -- then no cost is shown, only tokens."""
    path = os.environ.get(PRICES_ENV, "").strip()
    if not path:
        return {}
    try:
        return read_prices(path)
    except ValueError as exc:
        raise Problemed(500, "Internal Server Error", str(exc)) from None


@router.get("/api/workers", responses={200: {"description": "`{now, workers: [{owner, gone, "
                                                          "runs: [{run_id, workflow, status, "
                                                          "lease_until, lease_left}]}]}`"}})
async def workers(server: Srv, who: Reader) -> dict[str, object]:
    """Who holds which run now (the store's claims): each owner (``host:pid[:suffix]``:
    a worker, a server, a CLI run), whether its process is known to be gone (on this
    host), and per run the lease's expiry and the seconds left (negative: expired, the
    run may be taken over)."""
    now = time.time()
    by: dict[str, list[dict[str, Any]]] = {}
    for lease in await server.st.leases():
        until = lease["lease_until"]
        by.setdefault(lease["owner"], []).append(
            {**lease, "lease_left": None if until is None else round(until - now, 3)})
    return {"now": now, "workers": [{"owner": o, "gone": owner_gone(o), "runs": runs}
                                    for o, runs in sorted(by.items())]}
