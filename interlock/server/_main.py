"""Running the app with uvicorn: the loopback rule, SIGTERM, the drain."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import uvicorn

from interlock import UsageError

from ._app import Server, ServerOptions, create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling ours at once when a signal asks it to stop: the event
    streams end (uvicorn waits for open connections before the app's shutdown)."""

    interlock: Server | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.interlock is not None:
            self.interlock.hub.stopping.set()
        super().handle_exit(sig, frame)


def serve(options: ServerOptions, *, host: str = "127.0.0.1", port: int = 8765,
          log_level: str = "info") -> None:
    """Serve until SIGTERM or SIGINT, then drain: executions get ``options.drain``
    seconds to end, the rest are stopped with their claims released (the next start
    continues them). Refuses a non-loopback ``host`` without ``options.auth``."""
    if not is_loopback(host) and not options.auth:
        raise UsageError(f"refusing to serve on {host}, which is not a loopback address, "
                         "without --auth: anyone who can reach it could start and decide "
                         "runs; give --auth FILE (tokens by SHA-256 digest), or serve on "
                         "127.0.0.1")
    if options.workers < 0:
        raise UsageError(f"--workers must be 0 (record runs for `interlock worker`) or "
                         f"more, got {options.workers}")
    app = create_app(options)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=max(int(options.drain), 1))
    server = _Uvicorn(config)
    server.interlock = app.state.interlock
    logging.getLogger("interlock").setLevel(logging.INFO)
    server.run()
