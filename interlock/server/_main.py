"""Running the app with uvicorn: the loopback rule, SIGTERM, the drain."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import ipaddress
import logging
import os
import resource
import socket
import sqlite3
import sys
from types import FrameType

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from interlock import StoreError, UsageError
from interlock.support import redact, sqlite_file, store_file_note

from ._app import create_app
from ._service import Server, ServerOptions

log = logging.getLogger("interlock.server")


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
    """uvicorn's server, starting ours itself (the app's lifespan is off): a store that
    cannot be opened is one line and exit 2, not the lifespan's traceback and uvicorn's
    exit 3, and the socket is bound before anything runs. It tells ours at once when a
    signal asks it to stop: the event streams end (uvicorn waits for open connections
    before our stop)."""

    interlock: Server
    failure: Exception | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        url = self.interlock.options.store
        file = sqlite_file(url)
        existed = file is not None and os.path.exists(file)
        try:
            await self.interlock.start()
            await self.interlock.st.get_cursor("serve")  # the store answers (a lazy one too)
        except (StoreError, UsageError, OSError, sqlite3.Error) as exc:
            self.failure = exc
            self.should_exit = True
            with contextlib.suppress(Exception):
                await self.interlock.stop()
            return
        # uvicorn's own line, held back until the store answered (`_HeldBack`)
        logging.getLogger("uvicorn.error").info(_STARTED, os.getpid(),
                                                extra={"interlock": True})
        await super().startup(sockets)
        if sockets:
            self._log_started_message(sockets)  # (uvicorn logs it only for its own)
            port = sockets[0].getsockname()[1]
            host = self.config.host
            base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            names = sorted(self.interlock.workflows)
            log.info("store: %s%s", redact(self.interlock.st.url),
                     store_file_note(url, existed))
            log.info("workflows (%d): %s", len(names), ", ".join(names) or "none")
            records = self.interlock.records_only
            then = ("this server records its runs for `interlock worker` processes, which "
                    "need the key" if self.interlock.records_only else "this server "
                    "refuses its runs (409, nothing recorded) until the variable is set "
                    "where it runs")
            for name in names:  # what `interlock run` refuses: this server executes them
                for w in self.interlock.workflows[name].warnings:
                    if w.code == "api-key":
                        said = w.message.replace(_HERE, _ELSEWHERE) if records else w.message
                        log.warning("workflow %r: %s; %s", name, said, then)
            log.info("dashboard: %s/  API: %s/openapi.json, %s/docs", base, base, base)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        await self.interlock.stop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.interlock.hub.stopping.set()
        super().handle_exit(sig, frame)


_STARTED = "Started server process [%d]"
# (`check_key`'s words: under --workers 0 nothing is executed here)
_HERE, _ELSEWHERE = "a run executed here fails", "a worker without it fails on a run"


class _HeldBack(logging.Filter):
    """Drops uvicorn's "Started server process" line, which it logs before our start-up
    (`_Uvicorn.startup`): a store that cannot be opened would follow it with an error
    and exit 2, a server that never started. Our start-up logs it once it succeeded."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _STARTED and record.name == "uvicorn.error"
                    and not getattr(record, "interlock", False))


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts anything (a run taken over
    by a server that then cannot listen would be taken for nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # (IPPROTO_TCP named: asyncio sets TCP_NODELAY only on a socket that says it is TCP --
    # with proto 0, each small answer on a kept-alive connection waited ~40 ms for the
    # client's delayed ACK before its body was sent: Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        hint = ("another process listens there: stop it or choose another --port"
                if exc.errno == errno.EADDRINUSE else
                "choose a --host this machine has (127.0.0.1 for this machine only)"
                if exc.errno == errno.EADDRNOTAVAIL else
                "choose a --port above 1023, or run with the right to bind this one"
                if exc.errno == errno.EACCES else "check --host and --port")
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {hint}"
                         ) from None
    sock.set_inheritable(True)
    return sock


class _Info(logging.Handler):
    """The server's own start-up lines on stderr, as uvicorn writes its own (the CLI
    shows warnings already)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            sys.stderr.write(f"INFO:     {self.format(record)}\n")


def serve(options: ServerOptions, *, host: str = "127.0.0.1", port: int = 8765,
          log_level: str = "info", max_connections: int = 1000, keep_alive: int = 5,
          head_timeout: float = 10.0, allow_empty: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then drain: executions get ``options.drain``
    seconds to end, the rest are stopped with their claims released (the next start
    continues them). Refuses a non-loopback ``host`` without ``options.auth``.

    At most ``max_connections`` connections are open (fewer when the descriptor limit
    is lower); an idle connection is closed after ``keep_alive`` seconds, one that has
    not sent a whole request head after ``head_timeout``. Refuses to start without a
    workflow unless ``allow_empty``; a socket that cannot be bound or a store that
    cannot be opened is an `interlock.UsageError` / `interlock.StoreError`."""
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
    root = logging.getLogger("interlock")
    if not any(isinstance(h, _Info) for h in root.handlers):
        root.addHandler(_Info())
    root.setLevel(logging.INFO)  # (--workflows' skipped files are said while loading)
    app = create_app(options)
    if not app.state.interlock.workflows and not allow_empty:
        given = " ".join(options.workflows)
        raise UsageError(
            (f"--workflows {given}: no workflow found (a workflow is a *.yaml, *.yml or "
             "*.json file with a top-level workflow: key; folders are searched with their "
             "subfolders)" if given else "no --workflows given: there is no workflow to "
             "start") + "; give a workflow file or folder, or --allow-empty to serve the "
            "store's runs without any")
    sock = _listen(host, port)
    cap = connection_cap(max_connections)
    connection = type("Connection", (_Connection,), {"head_timeout": head_timeout,
                                                     "cap": cap})
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                            timeout_graceful_shutdown=max(int(options.drain), 1),
                            http=connection, timeout_keep_alive=keep_alive,
                            backlog=BACKLOG)
    server = _Uvicorn(config)
    server.interlock = app.state.interlock
    held = _HeldBack()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(held)
    try:
        server.run(sockets=[sock])
    finally:
        uvicorn_log.removeFilter(held)
        sock.close()
    failure = server.failure
    if isinstance(failure, (StoreError, UsageError)):
        raise failure
    if failure is not None:
        raise StoreError(f"cannot open the store {options.store or '(the default)'}: "
                         f"{failure}; check --store (or $INTERLOCK_STORE)") from None
