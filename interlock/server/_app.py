"""The FastAPI application: the endpoints over one store, assembled -- the edge
(`Guard`), the problem+json exception handlers, one router per resource, the dashboard."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

import interlock
from interlock import (
    ClaimError,
    ConflictError,
    LogError,
    RunExists,
    RunNotFound,
    StoreError,
    UsageError,
)
from interlock.support import NoKey, limits

from . import _dashboard as dashboard
from . import (
    _routes_approvals,
    _routes_chat,
    _routes_messages,
    _routes_meta,
    _routes_runs,
    _routes_workflows,
)
from ._deps import _plain_params
from ._guard import Edge, Guard, Problemed, allowed_hosts
from ._models import Problem
from ._pool import Draining
from ._service import Server, ServerOptions

log = logging.getLogger("interlock.server")

PROBLEM = "application/problem+json"
BODY_SLACK = 64 * 1024  # a body's bytes beyond the input it carries (config, names)


def problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None,
            extra: dict[str, object] | None = None) -> JSONResponse:
    body = {**Problem(title=title, status=status, detail=detail).model_dump(), **(extra or {})}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


_PROBLEMS = {400: {"model": Problem, "description": "a malformed request, or refused"},
             401: {"model": Problem, "description": "no valid token"},
             403: {"model": Problem, "description": "the token's role or approvers: refuse"},
             404: {"model": Problem, "description": "no such run or workflow"},
             409: {"model": Problem, "description": "the run's state refuses it (or its "
                                                    "stored log is broken)"},
             413: {"model": Problem, "description": "the body is larger than is read"},
             415: {"model": Problem, "description": "a POST body that is not "
                                                    "application/json"},
             421: {"model": Problem, "description": "a Host the server does not answer "
                                                    "to (--allowed-host)"},
             422: {"model": Problem, "description": "the body does not fit its schema "
                                                    "(or names a gate the workflow has not)"}}
for _status, _doc in _PROBLEMS.items():
    _doc["content"] = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}


def create_app(options: ServerOptions | None = None, **kwargs: Any) -> FastAPI:
    """The API as an ASGI app (``options``, or `ServerOptions` fields as keywords).

    Workflows and the auth file are read here (a mistake raises `interlock.UsageError`
    before anything listens); the store is opened, and interrupted runs taken over,
    when the app starts (its lifespan).
    """
    opts = options or ServerOptions(**kwargs)
    server = Server(opts)
    mcp = _mcp_endpoint(server)
    if mcp is not None:  # its sessions' manager runs while the service does
        server.alongside.append(mcp.running)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    # FastAPI's /docs and /redoc load their scripts from a CDN: /docs is the dashboard's
    # own (Swagger UI's files from a package, _dashboard.py), no /redoc
    app = FastAPI(title="interlock", version=interlock.__version__, lifespan=lifespan,
                  description="Runs, their logs, live events and approvals (docs/server.md).",
                  responses=_PROBLEMS, docs_url=None, redoc_url=None,  # type: ignore[arg-type]
                  dependencies=[Depends(_plain_params)])
    app.state.interlock = server

    checked = opts.auth is None or bool(opts.allowed_hosts)
    app.add_middleware(
        Guard, edge=Edge(hosts=allowed_hosts(opts.host, opts.allowed_hosts) if checked
                         else None,
                         identify=server.identify if server.tokens is not None else None,
                         limit=lambda: limits.INPUT_BYTES.get() + BODY_SLACK))

    _handlers(app)
    _store_handlers(app)
    _routes(app, mcp)
    return app


def _routes(app: FastAPI, mcp: Any) -> None:
    """The routers, ``/mcp``, then the dashboard (its pages are matched last)."""
    for routes in (_routes_meta, _routes_workflows, _routes_runs, _routes_approvals,
                   _routes_messages, _routes_chat):
        app.include_router(routes.router)
    if mcp is not None:
        app.router.routes.append(mcp.route())
    dashboard.mount(app)


def _mcp_endpoint(server: Server) -> Any:
    """``/mcp`` (`interlock.server._mcp`), or None without the ``mcp`` extra."""
    try:
        from ._mcp import McpEndpoint
    except ImportError:
        return None
    return McpEndpoint(server)


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(Problemed)
    async def _problemed(request: Request, exc: Problemed) -> JSONResponse:
        return problem(exc.status, exc.title, exc.detail, exc.headers, exc.extra)

    @app.exception_handler(RunNotFound)
    async def _not_found(request: Request, exc: RunNotFound) -> JSONResponse:
        # the runs to list are this server's (`run_id`: a client words it for its surface)
        base = str(request.base_url).rstrip("/")
        return problem(404, "Not Found", f"no run {exc.run_id!r} in this server's store "
                       f"(list its runs with `interlock runs --server {base}`, or GET "
                       f"{base}/api/runs)", extra={"run_id": exc.run_id})

    @app.exception_handler(NoKey)
    async def _no_key(request: Request, exc: NoKey) -> JSONResponse:
        # the run this server would execute would fail at an agent: refused, as
        # `interlock run` refuses it, with nothing recorded
        return problem(409, "Conflict", str(exc))

    @app.exception_handler(UsageError)
    async def _usage(request: Request, exc: UsageError) -> JSONResponse:
        return problem(400, "Bad Request", str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":  # the body is not JSON at all
                return problem(422, "Unprocessable Content", _not_json(exc.body, e))
            where = ".".join(str(p) for p in e.get("loc", ()))
            parts.append(f"{where}: {e.get('msg')}")
        return problem(422, "Unprocessable Content",
                       "the request does not fit the API: " + "; ".join(parts))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return problem(exc.status_code, _title(exc.status_code), str(exc.detail),
                       dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem(500, "Internal Server Error",
                       f"the server failed: {type(exc).__name__}: {exc} (see its log)")


def _store_handlers(app: FastAPI) -> None:
    """The store's refusals and failures, and a draining server's."""
    @app.exception_handler(LogError)
    async def _broken(request: Request, exc: LogError) -> JSONResponse:
        # the store's data was changed (a broken chain, a definition that no longer
        # matches its hash): not the caller's mistake (never 400), not a race to retry
        log.error("%s %s refused: %s", request.method, request.url.path, exc)
        return problem(409, "Conflict", str(exc))

    @app.exception_handler(StoreError)
    async def _store(request: Request, exc: StoreError) -> JSONResponse:
        if isinstance(exc, ClaimError | ConflictError | RunExists):
            return problem(409, "Conflict", str(exc))
        return problem(503, "Service Unavailable", str(exc))

    @app.exception_handler(Draining)
    async def _draining(request: Request, exc: Draining) -> JSONResponse:
        return problem(503, "Service Unavailable", str(exc))


def _not_json(body: Any, error: Any) -> str:
    """What is wrong with a request body that is not JSON, and where (line, column)."""
    loc = error.get("loc", ())
    pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    why = (error.get("ctx") or {}).get("error") or "it does not parse"
    where = ""
    if pos is not None and isinstance(body, str | bytes):
        text = body if isinstance(body, str) else body.decode("utf-8", "replace")
        line = text.count("\n", 0, pos) + 1
        where = f" at line {line} column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"
    return (f"the request body is not valid JSON: {why}{where}; send a JSON object "
            "(Content-Type: application/json)")


def _title(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


__all__ = ["ServerOptions", "create_app"]
