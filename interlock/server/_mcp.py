"""``/mcp``: the registered workflows as MCP tools over streamable HTTP, in
the API's process and behind its tokens and roles.

Every request to ``/mcp`` must carry a token the server knows when it has ``--auth``
(401 otherwise, before the MCP layer reads anything); each tool call then checks the
token's roles as the API does: ``operator`` (or ``admin``) to call a workflow -- a
refused call starts no run --, any role for ``interlock_run_status``, ``approver`` (or
``admin``) for a gate answered through elicitation. Runs execute in the server's pool,
as the API's starts do, and a call follows its run through the server's `Hub`.

The MCP SDK's session manager keeps each client's session in this process (stateful
streamable HTTP: a session can carry a server-to-client elicitation); it runs for the
app's lifespan (`McpEndpoint.running`). Its own Host/Origin check is off: `Guard` has
already applied the server's.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import interlock
from interlock import Decision
from interlock.mcp import Caller, Refused, tools_server
from interlock.support import trace_pages

from ._auth import Identity
from ._guard import Problemed, _answer
from ._models import DecisionIn
from ._service import Server

if TYPE_CHECKING:
    from interlock import Workflow
    from interlock.mcp import Progress

_IDENTITY = "interlock.identity"  # the ASGI scope's key for the caller's `Identity`
STOPPED = frozenset({"COMPLETED", "FAILED", "REJECTED", "CANCELLED", "WAITING_APPROVAL",
                     "WAITING_INPUT"})


class ServerRuns:
    """The tools' runs in the server: started as the API starts them."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.workflows: Mapping[str, Workflow] = server.workflows
        self.public_url: str | None = server.options.public_url
        # the CLI decides through this server (with $INTERLOCK_TOKEN under --auth)
        self.store_hint = (f" --server {shlex.quote(self.public_url)}"
                           if self.public_url else "")

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        who = _identity(self.server, ctx)
        return Caller(who.name, who.roles if who.authenticated else None)

    async def call(self, workflow: str, data: dict[str, Any], caller: Caller,
                   progress: Progress) -> dict[str, Any]:
        started = await self.server.begin(workflow, data)
        return await self._follow(started.run_id, 0, progress)

    async def decide(self, run_id: str, decision: Decision, caller: Caller,
                     progress: Progress) -> dict[str, Any]:
        seq = (await self.server.st.get_run(run_id)).summary.last_seq
        await self.decide_soon(run_id, decision, caller)
        return await self._follow(run_id, seq, progress)

    async def decide_soon(self, run_id: str, decision: Decision, caller: Caller) -> None:
        """As the API's decision: executed in the pool, refusals raised here."""
        from ._routes_approvals import decide

        server = self.server
        who = Identity(caller.name, caller.roles or ("admin",),
                       authenticated=caller.roles is not None)
        fields: dict[str, Any] = {"decision": decision.kind, "comment": decision.comment,
                                  "node": decision.node, "data": decision.data,
                                  "by": caller.name}
        if "via" in DecisionIn.model_fields:  # (the per-gate decision path records it)
            fields["via"] = "mcp"
        body = DecisionIn(**fields)
        try:
            await decide(run_id, body, server, who)
        except Problemed as exc:
            raise Refused(exc.detail) from None

    async def start(self, workflow: str, data: dict[str, Any], caller: Caller
                    ) -> dict[str, Any]:
        return (await self.server.begin(workflow, data)).to_json()

    async def cancel(self, run_id: str, caller: Caller) -> None:
        async with self.server.lock(run_id):
            await interlock.cancel(run_id, by=caller.name, store=self.server.st, wait=0)

    async def times(self, run_id: str) -> tuple[float, float]:
        row = await self.server.st.get_run(run_id)
        return row.created_at, row.summary.updated_at or row.created_at

    async def message(self, run_id: str, text: str, caller: Caller,
                      progress: Progress) -> dict[str, Any]:
        """As ``POST /api/runs/{id}/messages`` does: the turn runs in the pool (recorded
        for workers with ``--workers 0``), followed here until it stops."""
        server = self.server
        row = await server.st.get_run(run_id)
        server.refuse_unkeyed(row.workflow, "the message was not taken")
        seq = row.summary.last_seq

        async def turn(listen: Any, st: Any) -> Any:
            return await interlock.send(run_id, text, by=caller.name, store=st,
                                        workflow=server.workflows.get(row.workflow),
                                        listener=listen, detach=server.records_only)

        async with server.lock(run_id):
            await server.launch(f"message to run {run_id}", run_id, row.workflow, turn)
        return await self._follow(run_id, seq, progress)

    async def status(self, run_id: str, caller: Caller) -> dict[str, Any]:
        return await self.server.run_object(run_id)

    async def _follow(self, run_id: str, seq: int, progress: Progress) -> dict[str, Any]:
        """The run's records after ``seq`` to ``progress`` as they are committed, until
        it stops (ends, or waits for a person): its run object then."""
        server = self.server
        while True:
            waiter = server.hub.waiter(run_id)  # before reading: a commit after it wakes us
            async for page in trace_pages(run_id, store=server.st, after=seq):
                for rec in page:
                    seq = rec["seq"]
                    with contextlib.suppress(Exception):  # a client gone stops nothing
                        await progress(rec)
            summary = (await server.st.get_run(run_id)).summary
            if (summary.status in STOPPED and summary.last_seq <= seq) or \
                    server.hub.stopping.is_set():
                return await server.run_object(run_id)
            await server.hub.wait(waiter, server.options.poll)


def _identity(server: Server, ctx: ServerRequestContext[Any, Any]) -> Identity:
    request = ctx.request
    scope = getattr(request, "scope", None)
    found = scope.get(_IDENTITY) if isinstance(scope, dict) else None
    if isinstance(found, Identity):
        return found
    headers = getattr(request, "headers", None) or {}
    try:
        return server.identify(headers.get("authorization"))
    except Problemed as exc:
        raise Refused(exc.detail) from None


class McpEndpoint:
    """The ``/mcp`` route of a server and the MCP session manager behind it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        mcp = tools_server(ServerRuns(server))
        self.manager = StreamableHTTPSessionManager(
            app=mcp, security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=False))
        self._inner = StreamableHTTPASGIApp(self.manager)

    def route(self) -> Route:
        return Route("/mcp", endpoint=self, methods=["GET", "POST", "DELETE"],
                     include_in_schema=False)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            who = self.server.identify(_header(scope, b"authorization"))
        except Problemed as exc:
            await _answer(send, exc)
            return
        scope[_IDENTITY] = who
        await self._inner(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None
