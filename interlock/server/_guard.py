"""The server's edge: what a request must be before the API reads its body.

`Guard` is an ASGI middleware around the whole app. For every HTTP request, in order:

- ``Host`` must be one the server answers to (`Edge.hosts`; None: any) -- a page that
  DNS-rebinds its own name to 127.0.0.1 sends its own name, and is refused;
- a state-changing request (any method but GET, HEAD, OPTIONS) must come from the
  server's own origin: a browser's ``Sec-Fetch-Site: cross-site`` / ``same-site``, or an
  ``Origin`` that is neither the request's ``Host`` nor an allowed host, is refused;
- it must carry a valid token when the server has ``--auth`` (checked from the header,
  before a byte of the body is read), and be ``Content-Type: application/json`` (a
  cross-site ``<form>`` cannot send that without a CORS preflight, which the API never
  allows);
- its body is counted as it streams: past `Edge.limit` bytes (or a ``Content-Length``
  saying so) the answer is 413 and the rest is never read, chunked or not.

Each refusal is problem+json; every response gets ``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from interlock.support import limits

PROBLEM = "application/problem+json"
INTEGRATIONS = "/api/integrations/"
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class Problemed(Exception):
    """A refusal the API answers with problem+json (RFC 9457)."""

    def __init__(self, status: int, title: str, detail: str,
                 headers: dict[str, str] | None = None,
                 extra: dict[str, object] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.headers = status, title, detail, headers
        self.extra = extra  # RFC 9457 extension members (a refused migration's findings)


@dataclass(frozen=True)
class Edge:
    """What `Guard` lets through.

    ``hosts``: the ``Host`` names answered (lower case, no port); None: any.
    ``identify``: checks an ``Authorization`` header, raising `Problemed` (401) when it
    is not a valid token; None: no ``--auth``.
    ``limit``: the most body bytes read (called per request: the limit is read from the
    environment when applied).
    """

    hosts: frozenset[str] | None
    identify: Callable[[str | None], object] | None
    limit: Callable[[], int]


def host_name(value: str) -> str:
    """``Host``'s name without its port, lower case (``[::1]:8765`` → ``::1``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_hosts(bound: str, extra: Collection[str]) -> frozenset[str]:
    """The loopback names, the bound address (unless it is 0.0.0.0 / ::) and ``extra``."""
    names = {*LOOPBACK_HOSTS, *(host_name(h) for h in extra if h)}
    if bound and bound not in ("0.0.0.0", "::"):
        names.add(host_name(bound))
    return frozenset(names)


class Guard:
    """The ASGI middleware (see the module's docstring): ``app`` behind ``edge``."""

    def __init__(self, app: ASGIApp, edge: Edge) -> None:
        self.app, self.edge = app, edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for key, value in scope.get("headers", ()):
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        try:
            limit = self._check(scope, headers)
        except Problemed as exc:
            await _answer(send, exc)
            return
        await self._bounded(scope, receive, _nosniff(send), limit)

    def _check(self, scope: Scope, headers: dict[str, str]) -> int:
        """The body limit of an admitted request; `Problemed` for a refused one."""
        edge = self.edge
        host = host_name(headers.get("host", ""))
        if edge.hosts is not None and host not in edge.hosts:
            raise Problemed(421, "Misdirected Request", f"this server does not answer to the "
                            f"host {headers.get('host', '(none)')!r} (it answers to "
                            f"{', '.join(sorted(edge.hosts))}; serve --allowed-host NAME "
                            "adds a name, e.g. the one a reverse proxy forwards)")
        if scope.get("method", "GET") in SAFE:
            return edge.limit()
        if str(scope.get("path", "")).startswith(INTEGRATIONS):
            # a chat's requests: signed by the chat, verified by their route
            # (a Slack signature, a Google-signed JWT), in the chat's own body format
            return edge.limit()
        site = headers.get("sec-fetch-site", "").lower()
        if site in ("cross-site", "same-site"):
            raise Problemed(403, "Forbidden", f"a {site} request may not change anything "
                            "here: the server takes changes from its own pages and from "
                            "clients that are not browsers")
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, headers.get("host", "")):
            raise Problemed(403, "Forbidden", f"a request from the origin {origin!r} may "
                            "not change anything here: the server takes changes from its "
                            "own origin only (serve --allowed-host NAME adds a name)")
        if edge.identify is not None:
            edge.identify(headers.get("authorization"))  # 401 before the body is read
        kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            raise Problemed(415, "Unsupported Media Type", f"a {scope.get('method')} body "
                            "must be JSON, sent with 'Content-Type: application/json' "
                            "(cancel and resume take {}); got "
                            f"{kind or 'no Content-Type'}")
        limit = edge.limit()
        size = headers.get("content-length")
        if size is not None and size.strip().isdigit() and int(size) > limit:
            raise _too_large(f"the request body is {size.strip()} bytes", limit)
        return limit

    def _same_origin(self, origin: str, host: str) -> bool:
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if origin == "null" or not parts.netloc:
            return False
        if parts.netloc.lower() == host.strip().lower():
            return True
        hosts = self.edge.hosts or frozenset()
        return (parts.hostname or "") in hosts - set(LOOPBACK_HOSTS) if hosts else False

    async def _bounded(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """The app, its body counted as it arrives: once past ``limit``, a 413 is sent,
        the app is told the client left, and whatever it sends after is dropped."""
        read = 0
        refused = False
        started = False

        async def counted() -> Message:
            nonlocal read, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:
                    refused = True
                    if not started:
                        await _answer(send, _too_large(f"the request body passed {limit} "
                                                       "bytes", limit))
                    return {"type": "http.disconnect"}
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted, sending)


def _too_large(what: str, limit: int) -> Problemed:
    return Problemed(413, "Content Too Large", f"{what}; at most {limit} are read "
                     f"({limits.INPUT_BYTES.env} bounds a run's input and config)")


def _nosniff(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(k.lower() == b"x-content-type-options" for k, _ in headers):
                headers.append((b"x-content-type-options", b"nosniff"))
            message = {**message, "headers": headers}
        await send(message)
    return sending


async def _answer(send: Send, exc: Problemed) -> None:
    body = json.dumps({"type": "about:blank", "title": exc.title, "status": exc.status,
                       "detail": exc.detail}).encode()
    headers = [(b"content-type", PROBLEM.encode()),
               (b"content-length", str(len(body)).encode()),
               (b"x-content-type-options", b"nosniff")]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in (exc.headers or {}).items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["LOOPBACK_HOSTS", "Edge", "Guard", "Problemed", "allowed_hosts", "host_name"]
