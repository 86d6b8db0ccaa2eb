"""An agent's MCP tools: ``tools: [{mcp: {url | command}, tools, confirm,
prefix}]``.

When the node first runs (each visit), every MCP server it names is asked for its tools
and the list offered -- the names ``tools:`` keeps, each with its description and input
schema -- is journaled (``ctx.once("mcp-tools-<i>")``, and an ``mcp.tools`` record naming
the server and every tool). A re-run of the visit (a retry, a resume after a crash)
offers the model that recorded list, whatever the server offers now; a call to a tool
the server no longer has is the server's error, a tool error like any other.

Sessions. A visit opens its own session to each server, on its first call (a replayed
listing needs none), and closes it when the visit ends: no session is shared between
nodes or visits, so two nodes running at once never share one (the SDK's client session
is not documented as safe for concurrent requests from separate tasks, and its anyio
task group must be left by the task that entered it -- the trouble other frameworks
report). A call whose connection fails (the server was restarted, its process died) is
sent once more on a new session; a second failure, or a server that cannot be reached
at all, fails the node with the server's address and the cause (`ToolUnavailable`).
Because a call is sent again only when its connection failed, a server killed in the
middle of a call may have acted: a guarded tool's decision applies to the call, as
``confirm: true``'s does.

A tool's answer is its structured content (JSON) when it gives one, else its text; an
answer marked ``isError``, or a JSON-RPC error from the server, is a tool error
(`McpToolError`: ``tool_errors: return`` tells the model, ``raise`` fails the node).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel

from ._errors import AgentConfigError, AgentEnvironmentError, ToolUnavailable
from ._spec import McpServerSpec, ToolSpec
from ._tools import Tool, json_object

if TYPE_CHECKING:
    from mcp import Client

    from .._engine._context import Context
    from ._spec import AgentSpec

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LISTED_AT_MOST = 1000  # tools one server may offer (pages of its listing read)


class McpToolError(Exception):
    """The MCP server answered a call with an error (``isError``, or a JSON-RPC error)."""


class _NoArgs(BaseModel):
    """(An MCP tool's arguments are checked by its server, against its own schema.)"""


@dataclass(frozen=True, slots=True)
class McpTool(Tool):
    """A tool of an MCP server, as one visit offers it."""

    server: str = ""  # the server's address (its URL or command line)
    remote: str = ""  # the tool's name on the server (``name`` may carry a prefix)
    link: _Link | None = field(default=None, compare=False)

    def parse(self, arguments: str) -> tuple[dict[str, Any], Any]:
        raw = json_object(arguments)
        return raw, raw

    async def invoke(self, kwargs: dict[str, Any]) -> Any:
        assert self.link is not None
        return await self.link.call(self.remote, kwargs)

    def origin(self) -> dict[str, Any]:
        return {"server": self.server} if self.remote == self.name else \
            {"server": self.server, "server_tool": self.remote}


class Visited(Protocol):
    """What a visit needs of the agent (`_node._Agent`): a copy of it gets the tools."""

    name: str
    spec: AgentSpec
    tools: dict[str, Tool]
    tool_schemas: list[dict[str, Any]] | None
    visiting: bool


A = TypeVar("A", bound=Visited)


@contextlib.asynccontextmanager
async def mcp_visit(agent: A, ctx: Context) -> AsyncIterator[A]:
    """The agent for one visit: its tools with the MCP servers' (listed, or replayed from
    the journal), its sessions closed when the visit ends."""
    links: list[_Link] = []
    tools: dict[str, Tool] = dict(agent.tools)
    delegates = getattr(agent, "delegates", {})  # workflow and agent tools
    where = {name: "a workflow or agent tool" if name in delegates else "a Python tool"
             for name in tools}
    try:
        for i, entry in enumerate(t for t in agent.spec.tools if t.mcp is not None):
            assert entry.mcp is not None
            link = _Link(entry.mcp, agent.name)
            links.append(link)
            listed = await ctx.once(f"mcp-tools-{i}", link.listing, ctx, entry)
            for t in listed:
                name = f"{entry.prefix}_{t['name']}" if entry.prefix else str(t["name"])
                if name in tools:
                    raise AgentConfigError(
                        f"node {agent.name!r}: two tools are named {name!r} ({where[name]} "
                        f"and a tool of the MCP server {link.address}); a model calls tools "
                        "by name: give the server's entry a prefix: NAME, or leave one out "
                        "of its tools: [...]")
                where[name] = f"a tool of the MCP server {link.address}"
                confirm = isinstance(entry.confirm, list) and t["name"] in entry.confirm
                tools[name] = McpTool(
                    name, _unused, confirm, str(t.get("description") or ""), _NoArgs, (),
                    dict(t.get("input_schema") or {"type": "object"}), True,
                    server=link.address, remote=str(t["name"]), link=link)
        visit = copy.copy(agent)
        visit.visiting = True
        visit.tools = tools
        visit.tool_schemas = [t.schema() for t in tools.values()] or None
        yield visit
    finally:
        for link in links:
            await link.aclose()


def _unused(**kwargs: Any) -> Any:  # (an McpTool is invoked through its link)
    raise AssertionError("an MCP tool is called through its server")


class _Link:
    """One visit's session to one MCP server, opened on first use."""

    def __init__(self, spec: McpServerSpec, node: str) -> None:
        self.spec, self.node = spec, node
        self.address = spec.address
        self._session: _Session | None = None

    async def listing(self, ctx: Context, entry: ToolSpec) -> list[dict[str, Any]]:
        """The tools offered to the model (those ``entry.tools`` keeps), for the journal;
        an ``mcp.tools`` record names them."""
        session = await self._connected()

        async def pages(client: Client) -> list[Any]:
            found: list[Any] = []
            cursor: str | None = None
            while len(found) < _LISTED_AT_MOST:
                page = await client.list_tools(cursor=cursor)
                found += page.tools
                cursor = page.next_cursor
                if cursor is None:
                    break
            return found

        try:
            found = await session.run(pages)
        except Exception as exc:
            raise self._unavailable("listing its tools", exc) from exc
        offered = [{"name": t.name, "description": t.description or "",
                    "input_schema": t.input_schema} for t in found
                   if entry.tools is None or t.name in entry.tools]
        names = {t["name"] for t in offered}
        missing = [n for n in entry.tools or () if n not in names]
        if missing:
            raise AgentConfigError(
                f"node {self.node!r}: the MCP server {self.address} has no tool "
                f"{', '.join(map(repr, missing))} (tools: names it); it offers: "
                f"{', '.join(sorted(t.name for t in found)) or 'none'}")
        guarded = entry.confirm if isinstance(entry.confirm, list) else []
        unknown = [n for n in guarded if n not in names]
        if unknown:
            raise AgentConfigError(
                f"node {self.node!r}: confirm: names {', '.join(map(repr, unknown))}, which "
                f"the MCP server {self.address} does not offer here")
        await ctx.log("mcp.tools", {"server": self.address,
                                    "tools": [t["name"] for t in offered]})
        return offered

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The tool's answer; a connection that fails is replaced once."""
        from mcp.shared.exceptions import MCPError
        from mcp_types.jsonrpc import CONNECTION_CLOSED

        for attempt in (1, 2):
            session = await self._connected()
            try:
                result = await session.run(lambda c: c.call_tool(name, arguments))
            except MCPError as exc:
                if exc.code != CONNECTION_CLOSED:  # the server's answer: a tool error
                    raise McpToolError(f"{name}: {exc.error.message}") from None
                cause: BaseException = exc
            except Exception as exc:  # the transport: the process or the socket is gone
                cause = exc
            else:
                return _answer(name, result)
            await self.aclose()
            if attempt == 2:
                raise self._unavailable(f"calling {name!r} (the connection failed, and "
                                        "again on a new session)", cause)
        raise AssertionError("unreachable")

    async def _connected(self) -> _Session:
        if self._session is not None and self._session.alive:
            return self._session
        await self.aclose()
        try:
            from mcp import Client  # noqa: F401 (the extra is installed)
        except ImportError as exc:
            from .._extras import install_hint

            raise AgentEnvironmentError(f"node {self.node!r}: MCP tools need the mcp extra: "
                                        f"{install_hint('mcp')} ({exc})") from None
        session = _Session()
        transport = self._transport()  # (a header's unset ${VAR}: AgentEnvironmentError)
        try:
            await session.open(transport)
        except Exception as exc:
            raise self._unavailable("connecting", exc) from exc
        self._session = session
        return session

    def _transport(self) -> Any:
        if self.spec.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = {k: _expand(v, k, self.address) for k, v in self.spec.headers.items()}
            http = httpx2.AsyncClient(headers=headers,
                                      timeout=httpx2.Timeout(30, read=300))
            return _owning(streamable_http_client(self.spec.url, http_client=http), http)
        from mcp import StdioServerParameters

        prog, *args = self.spec.command or [""]
        return StdioServerParameters(command=prog, args=args, cwd=os.getcwd())

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _unavailable(self, doing: str, exc: BaseException) -> ToolUnavailable:
        return ToolUnavailable(f"node {self.node!r}: the MCP server {self.address} failed "
                               f"while {doing}: {_cause(exc)}")


class _Session:
    """An SDK client that lives in a task of its own: it is entered and left there (its
    anyio task group and cancel scopes never cross into the node's task, and sessions
    of one visit close in any order), and the node's requests are run there, one at a
    time."""

    _CLOSE_WAIT = 5.0  # seconds a closing session may take before its task is cancelled

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future[Any]] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def open(self, transport: Any) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._own(transport, ready))
        await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            ready.result()  # (raises the connection's failure)
            return
        self._task.result()  # it ended before it was ready: its failure
        raise ConnectionError("the session ended before it was ready")

    async def _own(self, transport: Any, ready: asyncio.Future[None]) -> None:
        from mcp import Client

        pending: list[asyncio.Future[Any]] = []
        try:
            async with Client(transport) as client:
                ready.set_result(None)
                while (item := await self._queue.get()) is not None:
                    fn, future = item
                    pending.append(future)
                    try:
                        value = await fn(client)
                    except Exception as exc:
                        if not future.done():
                            future.set_exception(exc)
                    else:
                        if not future.done():
                            future.set_result(value)
                    pending.remove(future)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(_plain(exc))
            for future in pending:
                if not future.done():
                    future.set_exception(ConnectionError(_cause(exc)))
            if not isinstance(exc, Exception):
                raise

    async def run(self, fn: Any) -> Any:
        """``await fn(client)`` in the session's task."""
        assert self._task is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((fn, future))
        await asyncio.wait({future, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if future.done():
            return future.result()
        future.cancel()
        raise ConnectionError("the session ended" + (
            f": {_cause(exc)}" if (exc := self._task.exception()) is not None else ""))

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return
        self._queue.put_nowait(None)
        done, _ = await asyncio.wait({task}, timeout=self._CLOSE_WAIT)
        if not done:
            task.cancel()
            await asyncio.wait({task})  # (our own cancellation still reaches us)
        if not task.cancelled():
            task.exception()  # retrieved: a failed close is no error of the node's


def _plain(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else ConnectionError(_cause(exc))


@contextlib.asynccontextmanager
async def _owning(transport: Any, http: Any) -> AsyncIterator[Any]:
    """``transport``, closing its HTTP client after it."""
    async with http, transport as streams:
        yield streams


def _expand(value: str, header: str, address: str) -> str:
    def var(m: re.Match[str]) -> str:
        found = os.environ.get(m.group(1))
        if found is None:
            raise AgentEnvironmentError(f"the header {header!r} of the MCP server {address} "
                                        f"reads ${{{m.group(1)}}}, which is not set in the "
                                        "environment")
        return found
    return _ENV.sub(var, value)


def _cause(exc: BaseException) -> str:
    """The innermost cause of a (grouped, chained) exception, for a person."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _answer(name: str, result: Any) -> Any:
    """A ``CallToolResult`` as the tool's value (JSON data, or text)."""
    parts = []
    for block in result.content or ():
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    text = "\n".join(parts)
    if result.is_error:
        raise McpToolError(f"{name}: {text or 'the server reported an error'}")
    if result.structured_content is not None:
        return result.structured_content
    return text
