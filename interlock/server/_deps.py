"""What the endpoints take through FastAPI's ``Depends``: the server (the app's state),
the caller's identity checked for a role, the run a path names, and the rule that a
path's names hold no control character."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request

from interlock.support import RunRow

from ._auth import DECIDE, OPERATE, READ, Identity
from ._guard import Problemed
from ._service import Server


def _need(what: str) -> Any:
    async def dep(request: Request,
                  authorization: Annotated[str | None, Header()] = None) -> Identity:
        server: Server = request.app.state.interlock
        who = server.identify(authorization)
        if not who.may(what):
            verb = {READ: "read", OPERATE: "start, resume or cancel runs",
                    DECIDE: "decide approvals"}[what]
            needs = {READ: "any role", OPERATE: "operator or admin",
                     DECIDE: "approver or admin"}[what]
            raise Problemed(403, "Forbidden", f"{who.name} (roles: {', '.join(who.roles)}) "
                            f"may not {verb}: that needs the role {needs}")
        return who
    return Depends(dep)


Reader = Annotated[Identity, _need(READ)]
Operator = Annotated[Identity, _need(OPERATE)]
Approver = Annotated[Identity, _need(DECIDE)]


def _server(request: Request) -> Server:
    server: Server = request.app.state.interlock
    return server


Srv = Annotated[Server, Depends(_server)]


async def _existing(run_id: str, server: Srv, who: Reader) -> RunRow:
    """The run's row (404 before an event stream starts)."""
    return await server.st.get_run(run_id)


Existing = Annotated[RunRow, Depends(_existing)]


def _plain(text: str) -> bool:
    """``text`` holds no control character (a NUL, which PostgreSQL cannot store)."""
    return not any(c < " " or c == "\x7f" for c in text)


async def _plain_params(request: Request) -> None:
    """A run id or a workflow name in a path holds no control character: one that does
    names nothing (404), and no store is asked for it."""
    for key, value in request.path_params.items():
        if isinstance(value, str) and not _plain(value):
            raise Problemed(404, "Not Found", f"no {key.removesuffix('_id')} is named "
                            f"{value[:80]!r}: names and ids hold no control character")

