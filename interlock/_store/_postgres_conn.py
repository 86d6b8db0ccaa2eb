"""The PostgreSQL store's connections: a few per event loop (`_Pool`), opened lazily in
autocommit mode, the first of them setting up the tables (or upgrading them) under an
advisory lock; an operation run on one (`PostgresConnections._do`), its psycopg errors
made `StoreError` for people (the password redacted); the NOTIFY that wakes idle
workers, and the waits on the loop's LISTEN connection (`interlock._store._postgres_listen`)
of workers and of the server's event streams.

A connection belongs to the event loop that opened it: a store used from another loop
opens new ones there, and the pools of loops that have closed are dropped unawaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ._base import StoreError
from ._postgres_listen import Listener
from ._postgres_sql import (
    _CURSORS,
    _LISTENING,
    _SCHEMA,
    _SCHEMA_LOCK,
    ANNOUNCE,
    RUNNABLE_CHANNEL,
    SCHEMA_VERSION,
)
from ._rows import SCHEMA_NAME

T = TypeVar("T")
Conn = psycopg.AsyncConnection[TupleRow]


def pg_error(url: str, exc: psycopg.Error, *, lost: bool = False) -> StoreError:
    """A `StoreError` for a PostgreSQL error, naming its cause when it is the server's
    (its disk full, the connection lost: a restart, a stop, the network)."""
    where = f"PostgreSQL store {redact(url)}"
    if isinstance(exc, pg_errors.DiskFull):
        return StoreError(f"{where}: the database server's disk is full ({_first_line(exc)});"
                          " nothing of this write was stored -- free space on the server, "
                          "and the write can be tried again")
    if lost or isinstance(exc, pg_errors.AdminShutdown | pg_errors.CrashShutdown
                          | pg_errors.CannotConnectNow):
        return StoreError(f"{where}: the server is unreachable: the connection was lost "
                          f"({_first_line(exc)}) -- the server restarted or stopped, or the "
                          "network failed; a write in flight may or may not have been stored")
    return StoreError(f"{where}: {exc}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        if "://" in url:
            parts = urlsplit(url)
            if parts.password is not None:
                host = parts.netloc.rpartition("@")[2]
                user = parts.username or ""
                parts = parts._replace(netloc=f"{user}:***@{host}")
            query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)]
            return urlunsplit(parts._replace(query=urlencode(query, safe="*")))
        info = conninfo_to_dict(url)
    except Exception:  # a message helper must not fail
        return "<postgresql store>"
    if "password" in info:
        info["password"] = "***"
    return " ".join(f"{k}={v}" for k, v in info.items())


# a write for the committer: its run id, what does it alone and with which arguments,
# and the caller's future
_Write = tuple[str, Callable[..., Awaitable[None]], tuple[Any, ...], "asyncio.Future[None]"]


class _Pool:
    """A few connections of one event loop, and its appends waiting for a commit."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop
        self.idle: list[Conn] = []
        self.all: set[Conn] = set()
        self.slots = asyncio.Semaphore(size)
        self.writes: list[_Write] = []
        self.committers: set[asyncio.Task[None]] = set()  # (at most `_postgres_writes.FLIGHTS`)
        self.flying: set[str] = set()  # the runs whose write is in a turn being committed
        self.turns = 0  # the turns being committed
        self.listener: Listener | None = None  # (made at the first wait)

    def abandon(self) -> None:
        """Close every connection without awaiting (for a loop that is gone)."""
        for conn in self.all:
            conn.pgconn.finish()
        if self.listener is not None:
            self.listener.abandon()
            self.listener = None
        self.all.clear()
        self.idle.clear()

    async def close(self) -> None:
        for conn in list(self.all):
            await conn.close()
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        self.all.clear()
        self.idle.clear()


class PostgresConnections:
    """The connections of a `PostgresStore` (see the module); the store's other parts run
    their statements through `_do`."""

    def __init__(self, url: str, *, max_connections: int = 10, connect_timeout: int = 10) -> None:
        self.url = url
        self._max = max_connections
        self._kwargs: dict[str, Any] = {"client_encoding": "utf8"}
        try:
            given = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise StoreError(f"bad PostgreSQL store URL {redact(url)}: {exc}") from None
        if "connect_timeout" not in given:
            self._kwargs["connect_timeout"] = connect_timeout
        self._pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
        self._schema_ready = False

    # -- connections -------------------------------------------------------------------

    def _here(self) -> _Pool:
        """This event loop's pool (dropping those of loops that have been closed)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for old in [old for old in self._pools if old.is_closed()]:
                self._pools.pop(old).abandon()
            pool = self._pools[loop] = _Pool(loop, self._max)
        return pool

    async def _connect(self) -> Conn:
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                                         **self._kwargs)
        except psycopg.Error as exc:
            where = f"cannot connect to the PostgreSQL store {redact(self.url)}"
            if "password" in _first_line(exc).lower():  # reached, and the login refused
                raise StoreError(
                    f"{where}: the server refused the login ({_first_line(exc)}) -- a URL "
                    "without a password takes it from PGPASSWORD or ~/.pgpass (the commands "
                    "interlock prints leave it out of --store)") from None
            raise StoreError(
                f"{where}: the server is unreachable ({_first_line(exc)}) -- it is down, "
                "restarting, or the network or the URL is wrong"
            ) from None
        if not self._schema_ready:
            try:
                await self._bootstrap(conn)
            except BaseException:
                await conn.close()
                raise
            self._schema_ready = True
        return conn

    async def _bootstrap(self, conn: Conn) -> None:
        # Under a transaction-scoped advisory lock: processes opening one new database
        # together create the tables once, and one opening an older store upgrades it
        # while the others wait: what each decides on (the tables there, the meta
        # table's schema and version) is read under the lock. A database or schema that
        # holds tables named like ours but no interlock_meta of ours is never written to.
        where = redact(self.url)
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                cur = await conn.execute(
                    "SELECT to_regclass('interlock_meta') IS NOT NULL, "
                    "to_regclass('runs') IS NOT NULL, to_regclass('records') IS NOT NULL"
                )
                found = await cur.fetchone()
                assert found is not None
                has_meta, has_runs, has_records = found
                if has_meta:
                    cur = await conn.execute("SELECT key, value FROM interlock_meta")
                    meta = {str(k): str(v) for k, v in await cur.fetchall()}
                    if meta.get("schema") != SCHEMA_NAME:
                        raise StoreError(
                            f"{where}: the table interlock_meta does not belong to interlock; "
                            "refusing to use this database/schema"
                        )
                    version = meta.get("version", "")
                    if not version.isdigit() or int(version) > SCHEMA_VERSION:
                        raise StoreError(
                            f"{where} holds an interlock store of schema version {version!r}, "
                            f"newer than this interlock understands ({SCHEMA_VERSION}); "
                            "upgrade interlock"
                        )
                    if has_runs and has_records:
                        # the poll triggers' cursors: a table added to schema version 2
                        # (IF NOT EXISTS; an older interlock ignores it)
                        await conn.execute(_CURSORS)
                        await conn.execute(_LISTENING)  # (added later, as cursors)
                        await self._upgrade(conn, int(version))
                        return
                elif has_runs or has_records:
                    raise StoreError(
                        f"{where} already has a table 'runs' or 'records' that is not an "
                        "interlock store's; refusing to touch it -- use another database or "
                        "schema (?options=-csearch_path%3Dinterlock)"
                    )
                for statement in _SCHEMA:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO interlock_meta VALUES ('schema', %s), ('version', %s) "
                    "ON CONFLICT (key) DO NOTHING",
                    (SCHEMA_NAME, str(SCHEMA_VERSION)),
                )
        except psycopg.Error as exc:
            raise StoreError(f"cannot set up the PostgreSQL store {where}: {exc}") from None

    @staticmethod
    async def _upgrade(conn: Conn, version: int) -> None:
        """Bring an existing store's tables up to this interlock's (inside the bootstrap's
        transaction, under its lock): the runs' claim ``generation`` column, 0 for every
        run there (the ``ALTER TABLE`` only where it is missing: it locks the table)."""
        cur = await conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('runs') "
            "AND attname = 'generation' AND NOT attisdropped")
        if await cur.fetchone() is None:
            await conn.execute(
                "ALTER TABLE runs ADD COLUMN generation bigint NOT NULL DEFAULT 0")
        if version < SCHEMA_VERSION:
            await conn.execute("UPDATE interlock_meta SET value = %s WHERE key = 'version'",
                               (str(SCHEMA_VERSION),))

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[tuple[Conn, bool]]:
        """A connection of this loop's pool, and whether it was reused (vs new)."""
        pool = self._here()
        await pool.slots.acquire()
        conn: Conn | None = None
        try:
            reused = bool(pool.idle)
            conn = pool.idle.pop() if reused else await self._connect()
            pool.all.add(conn)
            yield conn, reused
        finally:
            if conn is not None:
                if (not conn.closed
                        and conn.pgconn.transaction_status == TransactionStatus.IDLE
                        and self._pools.get(pool.loop) is pool):
                    pool.idle.append(conn)
                else:
                    pool.all.discard(conn)
                    await conn.close()
            pool.slots.release()

    async def _do(self, op: Callable[[Conn], Awaitable[T]], *, idempotent: bool = False) -> T:
        """Run ``op`` on a connection; psycopg errors become `StoreError`.

        A read (``idempotent``) that fails because a reused connection died (the
        server restarted, say) is tried once more on a new connection. A write is
        never retried: it may have committed.
        """
        for attempt in (1, 2):
            async with self._conn() as (conn, reused):
                try:
                    return await op(conn)
                except psycopg.OperationalError as exc:
                    if idempotent and reused and attempt == 1 and conn.closed:
                        continue
                    raise pg_error(self.url, exc, lost=conn.closed) from None
                except psycopg.Error as exc:
                    raise pg_error(self.url, exc, lost=conn.closed) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close every connection (call it when no other task or loop uses the store)."""
        loop = asyncio.get_running_loop()
        here = self._pools.get(loop)
        while here is not None and here.committers:
            await asyncio.wait(here.committers)  # the appends queued are committed first
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            if pool.loop is loop:
                await pool.close()
            else:
                pool.abandon()

    async def _notify_runnable(self) -> None:
        async def op(conn: Conn) -> None:
            await conn.execute("SELECT pg_notify(%s, '')", (RUNNABLE_CHANNEL,))

        await self._do(op)

    def _listener(self) -> Listener:
        pool = self._here()
        if pool.listener is None:
            pool.listener = Listener(self._listen_connection, redact(self.url),
                                     self._announce_listening)
        return pool.listener

    async def _announce_listening(self, seconds: float) -> None:
        """Appends notify for ``seconds`` more (`_postgres_sql.ANNOUNCE`)."""
        async def op(conn: Conn) -> None:
            await conn.execute(ANNOUNCE, (round(seconds * 1000),))

        await self._do(op)

    async def _listen_connection(self) -> Conn:
        return await psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                                     **self._kwargs)

    async def wait_runnable(self, timeout: float) -> None:
        """Until a run may have become runnable (a ``NOTIFY`` on `RUNNABLE_CHANNEL`, from
        any process) since the last call returned, at most ``timeout`` seconds."""
        await self._listener().wait_runnable(timeout)

    async def wait_changed(self, timeout: float, seen: int | None = None,
                           run_id: str | None = None) -> int:
        """Until records of ``run_id`` (None: any run) are committed by any process after
        ``seen`` (each append ``NOTIFY``s the runs it grew), at most ``timeout`` seconds."""
        return await self._listener().wait_changed(timeout, seen, run_id)
