"""Running the app with uvicorn: the loopback rule, SIGTERM, the drain."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from interlock import UsageError

from ._app import create_app
from ._service import Server, ServerOptions


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


# connections accepted in one go (the listen backlog: asyncio accepts up to that many per
# wake-up, before a connection over the cap is closed)
BACKLOG = 128
# descriptors kept free beside the connections: two accept batches, and the store, logs,
# webhooks and the listener
SPARE_DESCRIPTORS = 2 * BACKLOG + 64


def connection_cap(wanted: int) -> int:
    """``wanted``, or fewer when the process may not open that many descriptors (with
    `SPARE_DESCRIPTORS` kept for the rest): a full table would refuse every client."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - SPARE_DESCRIPTORS))


class _Connection(H11Protocol):
    """uvicorn's HTTP/1.1 connection with two bounds it lacks: a request's head (its
    line and headers) must arrive within `head_timeout` seconds of the connection
    opening or of the previous answer (uvicorn times out only an idle keep-alive,
    not a connection that never finishes a request), and past `cap` open connections
    the one idle the longest is closed, so a new client is served. (uvicorn's own
    ``limit_concurrency`` is not used: it answers 503 to every new request while idle
    connections hold the places, and a connection has one request at a time, so the
    cap bounds the requests in progress too.)"""

    head_timeout: float = 10.0
    cap: int = 1000
    _deadline: asyncio.TimerHandle | None = None
    _idle_since: float = 0.0

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        if self._deadline is None:
            self._idle_since = self.loop.time()
            self._deadline = self.loop.call_later(self.head_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self._busy() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()
        if len(self.connections) > self.cap:
            idle = [c for c in self.connections
                    if c is not self and isinstance(c, _Connection) and not c._busy()]
            if idle:
                oldest = min(idle, key=lambda c: c._idle_since)
                oldest.transport.close()
            else:
                transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._busy():
            self._arm()  # a head has begun: its deadline runs from now, not per byte
        super().data_received(data)
        if self._busy():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle again: uvicorn's keep-alive timeout closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling ours at once when a signal asks it to stop: the event
    streams end (uvicorn waits for open connections before the app's shutdown)."""

    interlock: Server | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.interlock is not None:
            self.interlock.hub.stopping.set()
        super().handle_exit(sig, frame)


def serve(options: ServerOptions, *, host: str = "127.0.0.1", port: int = 8765,
          log_level: str = "info", max_connections: int = 1000, keep_alive: int = 5,
          head_timeout: float = 10.0) -> None:
    """Serve until SIGTERM or SIGINT, then drain: executions get ``options.drain``
    seconds to end, the rest are stopped with their claims released (the next start
    continues them). Refuses a non-loopback ``host`` without ``options.auth``.

    At most ``max_connections`` connections are open (fewer when the descriptor limit
    is lower); an idle connection is closed after ``keep_alive`` seconds, one that has
    not sent a whole request head after ``head_timeout``."""
    if not is_loopback(host) and not options.auth:
        raise UsageError(f"refusing to serve on {host}, which is not a loopback address, "
                         "without --auth: anyone who can reach it could start and decide "
                         "runs; give --auth FILE (tokens by SHA-256 digest), or serve on "
                         "127.0.0.1")
    if options.workers < 0:
        raise UsageError(f"--workers must be 0 (record runs for `interlock worker`) or "
                         f"more, got {options.workers}")
    if options.host != host:
        options = dataclasses.replace(options, host=host)
    app = create_app(options)
    cap = connection_cap(max_connections)
    connection = type("Connection", (_Connection,), {"head_timeout": head_timeout,
                                                     "cap": cap})
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=max(int(options.drain), 1),
                            http=connection, timeout_keep_alive=keep_alive,
                            backlog=BACKLOG)
    server = _Uvicorn(config)
    server.interlock = app.state.interlock
    logging.getLogger("interlock").setLevel(logging.INFO)
    server.run()
