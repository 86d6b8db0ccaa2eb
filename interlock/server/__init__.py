"""``interlock serve``: the HTTP API, live events, auth and approval notifications
Needs the ``server`` extra: ``pip install 'interlock[server]'``.

    from interlock.server import ServerOptions, create_app

    app = create_app(ServerOptions(store="sqlite:///runs.db", workflows=["flows/"]))

`create_app` gives a FastAPI (ASGI) app; `serve` runs it with uvicorn, as the command
does. It imports only `interlock` and `interlock.support`, like the command line.
docs/server.md has the endpoints, auth, the event stream and a walk-through.
"""

from __future__ import annotations

from ._app import create_app
from ._main import is_loopback, serve
from ._service import ServerOptions

__all__ = ["ServerOptions", "create_app", "is_loopback", "serve"]
