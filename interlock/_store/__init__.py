"""Stores: where runs and their logs live. `open_store` picks a backend by URL."""

from __future__ import annotations

import os

from ._base import (
    FINISHED,
    ClaimError,
    ConflictError,
    RunExists,
    RunNotFound,
    RunRow,
    Store,
    StoreError,
    Summary,
    owner_gone,
    this_owner,
)
from ._memory import MemoryStore

__all__ = [
    "FINISHED",
    "ClaimError",
    "ConflictError",
    "MemoryStore",
    "RunExists",
    "RunNotFound",
    "RunRow",
    "Store",
    "StoreError",
    "Summary",
    "default_store_url",
    "open_store",
    "owner_gone",
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
                f"the PostgreSQL store needs psycopg: pip install 'interlock[postgres]' ({exc})"
            ) from None
        return PostgresStore(url)
    raise StoreError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path.db or postgresql://..."
    )
