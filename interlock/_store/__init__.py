"""Stores: where runs and their logs live. `open_store` picks a backend by URL;
`acquire_store`/`release_store` share one open store per URL and event loop."""

from __future__ import annotations

import asyncio
import os

from .._extras import install_hint
from ._base import (
    ALL_RUNS,
    FINISHED,
    RUNNABLE,
    Claim,
    ClaimError,
    ClaimLost,
    ConflictError,
    LeaseRenewer,
    RunExists,
    RunNotFound,
    RunRow,
    Store,
    StoreError,
    Summary,
    owner_gone,
    runnable,
    this_owner,
)
from ._memory import MemoryStore

__all__ = [
    "ALL_RUNS",
    "FINISHED",
    "RUNNABLE",
    "Claim",
    "ClaimError",
    "ClaimLost",
    "ConflictError",
    "LeaseRenewer",
    "MemoryStore",
    "RunExists",
    "RunNotFound",
    "RunRow",
    "Store",
    "StoreError",
    "Summary",
    "absolute_hint",
    "acquire_store",
    "default_store_url",
    "open_store",
    "owner_gone",
    "release_store",
    "runnable",
    "sqlite_file",
    "store_file_note",
    "this_owner",
]

DEFAULT_PATH = "./.interlock/runs.db"


def default_store_url() -> str:
    """``$INTERLOCK_STORE``, else the SQLite file ``./.interlock/runs.db``."""
    return os.environ.get("INTERLOCK_STORE") or f"sqlite:///{DEFAULT_PATH}"


def open_store(url: str | None = None) -> Store:
    """A store for ``url``: ``memory://``, ``sqlite:///rel.db``, ``sqlite:////abs.db``,
    ``postgresql://...``; ``None`` means `default_store_url`."""
    url = url or default_store_url()
    if url.startswith("memory:"):
        return MemoryStore(url)
    if url.startswith("sqlite:"):
        try:
            from ._sqlite import SQLiteStore
        except ImportError as exc:  # pragma: no cover - stdlib sqlite3 missing
            raise StoreError(f"the SQLite store is not available: {exc}") from None
        return SQLiteStore(url)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from ._postgres import PostgresStore
        except ImportError as exc:
            raise StoreError(
                f"the PostgreSQL store needs psycopg: {install_hint('postgres')} ({exc})"
            ) from None
        return PostgresStore(url)
    if "://" not in url and url.strip():  # a file's path: the SQLite URL of that file
        path = os.path.expanduser(url)
        sqlite = f"sqlite:///{path}" if os.path.isabs(path) \
            else f"sqlite:///{path.removeprefix('./')}"
        raise StoreError(f"unknown store URL {url!r}: a store URL starts with its kind; for "
                         f"the SQLite file {url}, use {sqlite} (the others: memory://, "
                         "postgresql://...)")
    raise StoreError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path.db or postgresql://..."
    )


# -- one open store per URL and event loop ----------------------------------------------

class _Shared:
    __slots__ = ("key", "store", "users")

    def __init__(self, key: tuple[str, asyncio.AbstractEventLoop], store: Store) -> None:
        self.key, self.store, self.users = key, store, 0


_SHARED: dict[tuple[str, asyncio.AbstractEventLoop], _Shared] = {}
_BY_STORE: dict[int, _Shared] = {}  # id(store) -> its entry


def acquire_store(url: str | None = None) -> Store:
    """The store for ``url`` that this event loop shares: opened by the first caller,
    counted, closed by `release_store` when its last user is done.

    Concurrent runs given the same URL thus share one store -- one SQLite writer
    thread, whose turns commit their appends together, or one PostgreSQL connection
    pool. A store belongs to the event loop it was acquired in (a PostgreSQL
    connection is bound to its loop): another loop -- another thread's, or the next
    ``asyncio.run`` -- gets one of its own. ``memory://`` is not shared: each call
    gets a new, empty store, as `open_store` gives.
    """
    url = url or default_store_url()
    if url.startswith("memory:"):
        return open_store(url)
    loop = asyncio.get_running_loop()
    key = (url, loop)
    entry = _SHARED.get(key)
    if entry is None:
        for gone in [k for k in _SHARED if k[1].is_closed()]:
            # a loop closed while a run held its store (its users never came back)
            _BY_STORE.pop(id(_SHARED.pop(gone).store), None)
        entry = _SHARED[key] = _Shared(key, open_store(url))
        _BY_STORE[id(entry.store)] = entry
    entry.users += 1
    return entry.store


def sqlite_file(url: str | None) -> str | None:
    """The absolute file a ``sqlite:`` store URL names (``sqlite:///x.db`` is ``x.db``
    under the current folder), else ``None``."""
    url = url or default_store_url()
    if not url.startswith("sqlite:///"):
        return None
    return os.path.abspath(url[len("sqlite:///"):].partition("?")[0] or ".")


def store_file_note(url: str | None, existed: bool) -> str:
    """What a start line says after a SQLite store's URL: `` (file /abs/runs.db)``, and
    when no file is there, that the store is new -- naming the four-slash URL when the
    URL's relative path, read as absolute, is a file (``sqlite:///tmp/x.db`` is
    ``./tmp/x.db``); ``""`` for other stores."""
    path = sqlite_file(url)
    if path is None:
        return ""
    if existed:
        return f" (file {path})"
    also = absolute_hint(url)
    return (f" (file {path}; new: no store is there yet, the first run recorded makes "
            f"it{also and '; ' + also})")


def absolute_hint(url: str | None) -> str:
    """``sqlite:////tmp/x.db is the absolute path`` when a three-slash URL's relative
    path (``sqlite:///tmp/x.db``: ``./tmp/x.db``), read as absolute, is a file; else
    ``""``."""
    rel = (url or default_store_url()).removeprefix("sqlite:///").partition("?")[0]
    if not (url or "").startswith("sqlite:///") or rel.startswith("/"):
        return ""
    return f"sqlite:////{rel} is the absolute path" if os.path.isfile("/" + rel) else ""


async def release_store(store: Store) -> None:
    """Done with a store from `acquire_store`: the last user closes it."""
    entry = _BY_STORE.get(id(store))
    if entry is None or entry.store is not store:
        await store.close()  # not shared (memory://)
        return
    entry.users -= 1
    if entry.users > 0:
        return
    # out of the registry before closing: a run that starts meanwhile opens a new one
    del _BY_STORE[id(store)]
    if _SHARED.get(entry.key) is entry:
        del _SHARED[entry.key]
    # every write of its users is committed: what closing does after that (SQLite's copy
    # of its WAL into the file, with an fsync) need not hold up the last of them
    await store.close_soon()
