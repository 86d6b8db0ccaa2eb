"""``postgresql://...`` -- a store in a PostgreSQL database, for many processes and machines.

Needs psycopg 3 (``pip install 'interlock[postgres]'``). Connections are opened
lazily, a few at most per store (``max_connections``), in autocommit mode; they
belong to the event loop that opened them: a store used from another event loop
(successive ``asyncio.run`` calls, say) opens new ones there, and drops those of
loops that have been closed.

Schema: the same tables as the SQLite store (see `interlock._store._sqlite`),
created on first use with ``CREATE TABLE IF NOT EXISTS`` under an advisory lock,
in the first schema of the connection's ``search_path`` (choose one with
``?options=-csearch_path%3Dmyschema`` in the URL). JSON is kept as ``text``:
``records.data`` holds each record's exact canonical text (so the hash chain
verifies), readable with ``psql`` and castable with ``data::jsonb``.

Each write is committed (``synchronous_commit`` permitting) before the coroutine
returns:

- ``append`` and ``create_run`` go to the event loop's committer (group commit): the
  writes queued by the time it takes its turn are stored in one transaction, the new
  runs in one statement and the appends in another; each append checks the stored
  log's last seq, inserts the records and updates the run's summary, and one that
  does not fit is left out and refused alone. The primary key ``(run_id, seq)`` makes
  a concurrent writer of the same seq (another process) fail the statement as a
  whole; the turn's writes are then tried one by one (`ConflictError` for the
  refused one only). A turn of one write is one statement, as before;
- ``claim`` is a compare-and-set ``UPDATE ... WHERE <free or ours or expired>
  RETURNING``; a holder found dead on this host (`owner_gone`) is replaced by a
  second compare-and-set on its owner id. Every claim bumps the run's ``generation``;
  an append made under a claim locks the run's row (``FOR UPDATE``) in its statement
  and stores nothing unless the generation is still the claim's (a claim committed
  meanwhile is waited for and seen), so a stale executor's append is refused.

Lease times (``lease_until``) are taken from the database server's clock, so
processes on machines whose clocks differ still agree on who holds a run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from .._log import Entry
from ._base import (
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
)
from ._postgres_sql import (
    _APPEND,
    _APPEND_MANY,
    _CLAIM,
    _CLAIM_NEXT,
    _CREATE_MANY,
    _CREATE_RUN,
    _CURSORS,
    _HEARTBEAT,
    _NOW,
    _RUN_NAMES,
    _SCHEMA,
    _SCHEMA_LOCK,
    _TAKE_OVER,
    _UPDATE_SUMMARY,
    RUNNABLE_CHANNEL,
    SCHEMA_VERSION,
)
from ._rows import (
    _RUN_COLUMNS,
    SCHEMA_NAME,
    check_first_seqs,
    json_text,
    page_query,
    record_node,
    row_from,
    run_params,
    summary_params,
)

T = TypeVar("T")
Conn = psycopg.AsyncConnection[TupleRow]

# at most this many writes in one turn (more take several)
BATCH_MAX = 500


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


def _entry_arrays(entries: list[Entry]) -> dict[str, list[Any]]:
    return {
        "seqs": [e.seq for e in entries],
        "types": [e.type for e in entries],
        "nodes": [record_node(e) for e in entries],
        "datas": [e.data.decode("utf-8") for e in entries],
        "hashes": [e.hash for e in entries],
    }


# a write for the committer: its run id, what does it alone and with which arguments,
# and the caller's future
_Write = tuple[str, Callable[..., Awaitable[None]], tuple[Any, ...], "asyncio.Future[None]"]


def _lease_for(row: RunRow) -> float | None:
    """A claimed new run's lease, in seconds from now (the server counts it)."""
    if row.owner is None or row.lease_until is None:
        return None
    return row.lease_until - time.time()


def _create_params(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """`_CREATE_MANY`'s parameters for ``(row, entries)`` pairs."""
    params: dict[str, Any] = {f"c_{n}": [] for n in _RUN_NAMES}
    params["c_lease_for"] = []
    owners: list[str] = []
    records: list[Entry] = []
    for row, entries in rows:
        for name, value in zip(_RUN_NAMES, run_params(row), strict=True):
            params[f"c_{name}"].append(value)
        params["c_lease_for"].append(_lease_for(row))
        owners += [row.run_id] * len(entries)
        records += entries
    params.update(_entry_arrays(records), e_run=owners)
    return params


def _append_params(appends: list[tuple[Any, ...]]) -> dict[str, Any]:
    """`_APPEND_MANY`'s parameters for ``(run_id, entries, summary, release, claim)``
    tuples."""
    owners: list[int] = []
    batch: dict[str, list[Any]] = {k: [] for k in (
        "b_run", "b_prev", "b_status", "b_updated_at", "b_last_seq", "b_last_hash",
        "b_steps", "b_tokens", "b_error", "b_waiting", "b_release", "b_gen")}
    records: list[Entry] = []
    for i, (run_id, entries, summary, release, claim) in enumerate(appends, 1):
        values = (run_id, entries[0].seq - 1 if entries else None,
                  *summary_params(summary), release,
                  None if claim is None else claim.generation)
        for column, value in zip(batch.values(), values, strict=True):
            column.append(value)
        owners += [i] * len(entries)
        records += entries
    return {**batch, **_entry_arrays(records), "of": owners}


def _not_continued(run_id: str, last: int, entries: list[Entry]) -> ConflictError:
    """Why an append that was not applied did not fit the stored log (which ends at
    ``last``)."""
    try:
        check_first_seqs(run_id, last, entries)
    except ConflictError as exc:
        return exc
    return ConflictError(f"run {run_id!r}: append was not applied")  # pragma: no cover


class _Pool:
    """A few connections of one event loop, and its appends waiting for a commit."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop
        self.idle: list[Conn] = []
        self.all: set[Conn] = set()
        self.slots = asyncio.Semaphore(size)
        self.writes: list[_Write] = []
        self.committer: asyncio.Task[None] | None = None
        self.listener: Conn | None = None  # LISTENing for runnable runs (a worker's)

    def abandon(self) -> None:
        """Close every connection without awaiting (for a loop that is gone)."""
        for conn in self.all:
            conn.pgconn.finish()
        if self.listener is not None:
            self.listener.pgconn.finish()
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


class _Renewer(LeaseRenewer):
    """Renews leases on a blocking connection of its own (the lease keeper's thread): the
    store's async connections belong to an event loop, which may be the blocked one."""

    def __init__(self, url: str, kwargs: dict[str, Any]) -> None:
        self.url, self.kwargs = url, kwargs
        self.conn: psycopg.Connection[TupleRow] | None = None

    def renew(self, run_id: str, claim: Claim, lease: float) -> None:
        params = {"run": run_id, "owner": claim.owner, "lease": lease,
                  "gen": claim.generation}
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.url, autocommit=True, **self.kwargs)
            if self.conn.execute(_HEARTBEAT, params).fetchone() is not None:
                return
            found = self.conn.execute("SELECT owner, generation FROM runs WHERE run_id = %s",
                                      (run_id,)).fetchone()
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"PostgreSQL store {redact(self.url)}: {exc}") from None
        if found is None:
            raise RunNotFound(run_id)
        raise ClaimLost(run_id, found[0], found[1], claim.generation)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


class PostgresStore(Store):
    leases_in_writes = True
    fences_appends = True

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
            raise StoreError(
                f"cannot connect to the PostgreSQL store {redact(self.url)}: the server is "
                f"unreachable ({_first_line(exc)}) -- it is down, restarting, or the network "
                "or the URL is wrong"
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
        if here is not None and here.committer is not None:
            await asyncio.wait([here.committer])  # the appends queued are committed first
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            if pool.loop is loop:
                await pool.close()
            else:
                pool.abandon()

    # -- the Store interface ----------------------------------------------------------------

    async def create_run(self, row: RunRow, entries: list[Entry]) -> None:
        """Queued for this loop's committer, as appends are (`append`)."""
        check_first_seqs(row.run_id, 0, entries)
        await self._queue(row.run_id, self._create_one, (row, list(entries)))
        if row.owner is None and row.summary.status == "PENDING":
            await self._notify_runnable()  # (a detached run: a worker's)

    async def _notify_runnable(self) -> None:
        async def op(conn: Conn) -> None:
            await conn.execute("SELECT pg_notify(%s, '')", (RUNNABLE_CHANNEL,))

        await self._do(op)

    async def wait_runnable(self, timeout: float) -> None:
        """Until a run may have become runnable (a ``NOTIFY`` on `RUNNABLE_CHANNEL`, from
        any process), at most ``timeout`` seconds; on a connection of its own, LISTENing
        for as long as the store is open. Without it (an error), a sleep."""
        pool = self._here()
        try:
            if pool.listener is None or pool.listener.closed:
                pool.listener = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, **self._kwargs)
                await pool.listener.execute(f"LISTEN {RUNNABLE_CHANNEL}")
            async for _ in pool.listener.notifies(timeout=timeout, stop_after=1):
                pass
        except psycopg.Error:
            if pool.listener is not None:
                await pool.listener.close()
                pool.listener = None
            await asyncio.sleep(timeout)

    async def _create_one(self, row: RunRow, entries: list[Entry]) -> None:
        params: dict[str, Any] = dict(zip(_RUN_NAMES, run_params(row), strict=True))
        params.update(_entry_arrays(entries))
        params["lease_for"] = _lease_for(row)

        async def op(conn: Conn) -> None:
            try:
                cur = await conn.execute(_CREATE_RUN, params)
            except pg_errors.UniqueViolation as exc:
                raise ConflictError(f"run {row.run_id!r}: {exc}") from None
            found = await cur.fetchone()
            assert found is not None
            if found[0] == 0:
                raise RunExists(row.run_id)

        await self._do(op)

    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     release: str | None = None, *, claim: Claim | None = None) -> None:
        """Queued for this loop's committer, which stores the writes queued by the time it
        takes its turn in one transaction (group commit); returns once committed."""
        if entries:
            check_first_seqs(run_id, entries[0].seq - 1, entries)
        await self._queue(run_id, self._append_one,
                          (run_id, list(entries), summary, release, claim))

    async def _queue(self, run_id: str, alone: Callable[..., Awaitable[None]],
                     args: tuple[Any, ...]) -> None:
        pool = self._here()
        fut: asyncio.Future[None] = pool.loop.create_future()
        pool.writes.append((run_id, alone, args, fut))
        if pool.committer is None:
            pool.committer = pool.loop.create_task(self._commit_writes(pool))
        await fut

    async def _commit_writes(self, pool: _Pool) -> None:
        """This loop's committer: while writes wait, one transaction for a turn's worth
        (at most `BATCH_MAX`, one write per run); each caller gets its own outcome."""
        try:
            while pool.writes:
                turn: list[_Write] = []
                rest: list[_Write] = []
                runs: set[str] = set()
                for item in pool.writes:
                    if item[0] in runs or len(turn) >= BATCH_MAX:
                        rest.append(item)  # a run's second write waits for the next turn
                    else:
                        runs.add(item[0])
                        turn.append(item)
                pool.writes = rest
                if len(turn) == 1:
                    outcomes = [await self._outcome(turn[0][1](*turn[0][2]))]
                else:
                    outcomes = await self._write_many(turn)
                for (*_, fut), exc in zip(turn, outcomes, strict=True):
                    if fut.done():
                        continue  # its caller was cancelled (the write went on)
                    if exc is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(exc)
        except BaseException as exc:  # cancelled with the loop, say: nobody waits in vain
            for *_, fut in pool.writes:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else StoreError(
                        f"PostgreSQL store {redact(self.url)}: the write was interrupted"))
            pool.writes = []
            raise
        finally:
            pool.committer = None

    @staticmethod
    async def _outcome(op: Awaitable[None]) -> Exception | None:
        try:
            await op
        except Exception as exc:
            return exc
        return None

    async def _write_many(self, turn: list[_Write]) -> list[Exception | None]:
        """Several runs' writes in one transaction: the new runs in one statement, the
        appends in another. When it fails as a whole -- another process wrote one of the
        seqs at the same moment, say -- each write is tried alone, so the refused one
        fails and only it."""
        creates = [item for item in turn if item[1] == self._create_one]
        appends = [item for item in turn if item[1] == self._append_one]
        create_params = _create_params([item[2] for item in creates]) if creates else None
        append_params = _append_params([item[2] for item in appends]) if appends else None

        async def op(conn: Conn) -> tuple[list[Any], list[Any]] | None:
            try:
                async with conn.transaction():
                    made: list[Any] = []
                    done: list[Any] = []
                    if create_params is not None:
                        made = await (await conn.execute(_CREATE_MANY, create_params)
                                      ).fetchall()
                    if append_params is not None:
                        done = await (await conn.execute(_APPEND_MANY, append_params)
                                      ).fetchall()
                    return made, done
            except pg_errors.UniqueViolation:
                return None  # the transaction was undone as a whole

        try:
            found = await self._do(op)
        except StoreError as exc:  # nothing of the turn was stored
            return [exc] * len(turn)
        if found is None:
            return [await self._outcome(item[1](*item[2])) for item in turn]
        made, done = found
        by_item: dict[int, Exception | None] = {}
        for item, (_, created, _) in zip(creates, made, strict=True):
            by_item[id(item)] = None if created else RunExists(item[0])
        for item, (_, exists, last, updated, _, gen, owner) in zip(appends, done, strict=True):
            run_id, entries, claim = item[2][0], item[2][1], item[2][4]
            outcome: Exception | None = None
            if not updated:
                outcome = RunNotFound(run_id) if not exists else ClaimLost(
                    run_id, owner, gen, claim.generation) if claim is not None and \
                    gen != claim.generation else _not_continued(run_id, int(last), entries)
            by_item[id(item)] = outcome
        return [by_item[id(item)] for item in turn]

    async def _append_one(self, run_id: str, entries: list[Entry], summary: Summary,
                          release: str | None, claim: Claim | None = None) -> None:
        status, updated_at, last_seq, last_hash, steps, tokens, error, waiting = (
            summary_params(summary))
        params: dict[str, Any] = {
            "run": run_id, "status": status, "updated_at": updated_at, "last_seq": last_seq,
            "last_hash": last_hash, "steps": steps, "tokens": tokens, "error": error,
            "waiting": waiting, "release": release,
            "gen": None if claim is None else claim.generation,
        }
        if entries:
            first = entries[0].seq
            params.update(_entry_arrays(entries), prev=first - 1)

        async def op(conn: Conn) -> None:
            if not entries:
                cur = await conn.execute(_UPDATE_SUMMARY, params)
                if await cur.fetchone() is None:
                    cur = await conn.execute(
                        "SELECT owner, generation FROM runs WHERE run_id = %s", (run_id,))
                    found = await cur.fetchone()
                    if found is None:
                        raise RunNotFound(run_id)
                    assert claim is not None
                    raise ClaimLost(run_id, found[0], found[1], claim.generation)
                return
            try:
                cur = await conn.execute(_APPEND, params)
            except pg_errors.UniqueViolation:
                raise ConflictError(
                    f"run {run_id!r}: record {entries[0].seq} was written by another writer "
                    "at the same time; another writer got there first"
                ) from None
            found = await cur.fetchone()
            assert found is not None
            exists, last, _inserted, updated, gen, owner = found
            if not exists:
                raise RunNotFound(run_id)
            if not updated and claim is not None and gen != claim.generation:
                raise ClaimLost(run_id, owner, gen, claim.generation)
            if not updated:
                check_first_seqs(run_id, int(last), entries)  # raises ConflictError
                raise ConflictError(f"run {run_id!r}: append was not applied")  # pragma: no cover

        await self._do(op)

    async def get_run(self, run_id: str) -> RunRow:
        async def op(conn: Conn) -> RunRow:
            cur = await conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = %s",
                                     (run_id,))
            values = await cur.fetchone()
            if values is None:
                raise RunNotFound(run_id)
            return row_from(values)

        return await self._do(op, idempotent=True)

    async def entries(self, run_id: str, after: int = 0) -> list[Entry]:
        return await self._entries(run_id, after, None)

    async def entries_page(self, run_id: str, after: int = 0, limit: int = 1000
                           ) -> list[Entry]:
        return await self._entries(run_id, after, max(limit, 0))

    async def _entries(self, run_id: str, after: int, limit: int | None) -> list[Entry]:
        async def op(conn: Conn) -> list[Entry]:
            cur = await conn.execute(
                "SELECT seq, type, data, hash, node FROM records WHERE run_id = %s "
                "AND seq > %s ORDER BY seq LIMIT %s", (run_id, after, limit))
            rows = await cur.fetchall()
            if not rows:
                cur = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
                if await cur.fetchone() is None:
                    raise RunNotFound(run_id)
            return [Entry(int(seq), str(rtype), str(data).encode("utf-8"), str(h),
                          None if node is None else str(node))
                    for seq, rtype, data, h, node in rows]

        return await self._do(op, idempotent=True)

    async def list_page(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100, before: tuple[float, str] | None = None,
                        updated_after: float | None = None) -> list[RunRow]:
        # run ids compare by code point (COLLATE "C"), as in the other stores
        sql, params = page_query("%s", status, workflow, before, updated_after, limit,
                                 order_id='run_id COLLATE "C"')

        async def op(conn: Conn) -> list[RunRow]:
            cur = await conn.execute(sql, params)
            return [row_from(v) for v in await cur.fetchall()]

        return await self._do(op, idempotent=True)

    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[RunRow]:
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = %s")
            params.append(status)
        if workflow is not None:
            where.append("workflow = %s")
            params.append(workflow)
        sql = f"SELECT {_RUN_COLUMNS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC LIMIT %s"
        params.append(limit)

        async def op(conn: Conn) -> list[RunRow]:
            cur = await conn.execute(sql, params)
            return [row_from(v) for v in await cur.fetchall()]

        return await self._do(op, idempotent=True)

    async def claim(self, run_id: str, owner: str, lease: float, *,
                    force: bool = False) -> int:
        params: dict[str, Any] = {"run": run_id, "owner": owner, "lease": lease, "force": force}

        async def op(conn: Conn) -> int:
            for _ in range(5):
                cur = await conn.execute(_CLAIM, params)
                if (done := await cur.fetchone()) is not None:
                    return int(done[0])
                cur = await conn.execute(
                    f"SELECT owner, lease_until, {_NOW} FROM runs WHERE run_id = %s", (run_id,))
                found = await cur.fetchone()
                if found is None:
                    raise RunNotFound(run_id)
                current, lease_until, now = found
                if current is None or lease_until is None or lease_until <= now:
                    continue  # released or expired meanwhile: try again
                if not owner_gone(current):
                    raise ClaimError(run_id, current, lease_until - now)
                cur = await conn.execute(_TAKE_OVER, {**params, "gone": current})
                if (done := await cur.fetchone()) is not None:
                    return int(done[0])
            raise ClaimError(run_id, "another process", 0.0)  # pragma: no cover - churn

        return await self._do(op)

    async def claim_next(self, owner: str, lease: float, *,
                         workflows: Collection[str] | None = None,
                         exclude: Collection[str] = ()) -> str | None:
        params = {"owner": owner, "lease": lease, "statuses": list(RUNNABLE),
                  "any": workflows is None, "workflows": sorted(workflows or ()),
                  "exclude": sorted(exclude)}

        async def op(conn: Conn) -> str | None:
            found = await (await conn.execute(_CLAIM_NEXT, params)).fetchone()
            return None if found is None else str(found[0])

        return await self._do(op)

    async def heartbeat(self, run_id: str, owner: str, lease: float,
                        generation: int | None = None) -> None:
        params = {"run": run_id, "owner": owner, "lease": lease, "gen": generation}

        async def op(conn: Conn) -> None:
            cur = await conn.execute(_HEARTBEAT, params)
            if await cur.fetchone() is not None:
                return
            cur = await conn.execute("SELECT owner, generation FROM runs WHERE run_id = %s",
                                     (run_id,))
            found = await cur.fetchone()
            if found is None:
                raise RunNotFound(run_id)
            raise ClaimLost(run_id, found[0], found[1], generation)

        await self._do(op)

    def lease_renewer(self) -> LeaseRenewer:
        return _Renewer(self.url, self._kwargs)

    async def request_cancel(self, run_id: str, by: str | None) -> None:
        async def op(conn: Conn) -> None:
            cur = await conn.execute(
                "UPDATE runs SET extra = (extra::jsonb || jsonb_build_object('cancel', "
                f"jsonb_build_object('by', %s::text, 'at', {_NOW})))::text "
                "WHERE run_id = %s RETURNING 1", (by, run_id))
            if await cur.fetchone() is None:
                raise RunNotFound(run_id)

        await self._do(op)

    async def cancel_requested(self, run_id: str) -> dict[str, Any] | None:
        async def op(conn: Conn) -> dict[str, Any] | None:
            cur = await conn.execute("SELECT extra::jsonb -> 'cancel' FROM runs "
                                     "WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
            if row is None:
                raise RunNotFound(run_id)
            value = row[0]
            return dict(value) if isinstance(value, dict) else None

        return await self._do(op)

    async def offer_decision(self, run_id: str, gate: str, decision: dict[str, Any]
                             ) -> dict[str, Any] | None:
        async def op(conn: Conn) -> dict[str, Any] | None:
            # one statement: the row's lock makes a second offer re-check the condition
            cur = await conn.execute(
                "UPDATE runs SET extra = jsonb_set(extra::jsonb, '{decisions}', "
                "COALESCE(extra::jsonb -> 'decisions', '{}'::jsonb) || "
                "jsonb_build_object(%s::text, %s::jsonb))::text "
                "WHERE run_id = %s AND NOT (COALESCE(extra::jsonb -> 'decisions', "
                "'{}'::jsonb) ? %s) RETURNING 1",
                (gate, json_text(decision), run_id, gate))
            if await cur.fetchone() is not None:
                return None
            cur = await conn.execute("SELECT extra::jsonb -> 'decisions' -> %s FROM runs "
                                     "WHERE run_id = %s", (gate, run_id))
            row = await cur.fetchone()
            if row is None:
                raise RunNotFound(run_id)
            return dict(row[0]) if isinstance(row[0], dict) else {}

        return await self._do(op)

    async def decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        async def op(conn: Conn) -> dict[str, dict[str, Any]]:
            cur = await conn.execute("SELECT extra::jsonb -> 'decisions' FROM runs "
                                     "WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
            if row is None:
                raise RunNotFound(run_id)
            kept = row[0]
            return {k: dict(v) for k, v in kept.items()} if isinstance(kept, dict) else {}

        return await self._do(op)

    async def save_snapshot(self, run_id: str, seq: int, data: bytes) -> None:
        async def op(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO snapshots (run_id, seq, data) VALUES (%s, %s, %s) "
                "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, data = excluded.data "
                "WHERE excluded.seq > snapshots.seq", (run_id, seq, data))

        await self._do(op)

    async def get_cursor(self, name: str) -> str | None:
        async def op(conn: Conn) -> str | None:
            cur = await conn.execute("SELECT value FROM cursors WHERE name = %s", (name,))
            row = await cur.fetchone()
            return str(row[0]) if row is not None else None

        return await self._do(op, idempotent=True)

    async def set_cursor(self, name: str, value: str) -> None:
        async def op(conn: Conn) -> None:
            await conn.execute(
                f"INSERT INTO cursors (name, value, updated_at) VALUES (%s, %s, {_NOW}) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at", (name, value))

        await self._do(op)

    async def load_snapshot(self, run_id: str) -> tuple[int, bytes] | None:
        async def op(conn: Conn) -> tuple[int, bytes] | None:
            cur = await conn.execute("SELECT seq, data FROM snapshots WHERE run_id = %s",
                                     (run_id,))
            row = await cur.fetchone()
            return (int(row[0]), bytes(row[1])) if row is not None else None

        return await self._do(op, idempotent=True)

    async def release(self, run_id: str, owner: str) -> None:
        async def op(conn: Conn) -> None:
            cur = await conn.execute(
                "UPDATE runs SET owner = NULL, lease_until = NULL WHERE run_id = %s "
                "AND owner = %s RETURNING status", (run_id, owner))
            released = await cur.fetchone()
            if released is not None:
                if released[0] in RUNNABLE:  # unfinished, or recorded for a worker
                    await conn.execute("SELECT pg_notify(%s, '')", (RUNNABLE_CHANNEL,))
                return
            cur = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
            if await cur.fetchone() is None:
                raise RunNotFound(run_id)

        await self._do(op)

    # -- pruning ---------------------------------------------------------------------

    async def delete_finished(self, run_ids: list[str]) -> tuple[list[str], int]:
        if not run_ids:
            return [], 0

        async def op(conn: Conn) -> tuple[list[str], int]:
            async with conn.transaction():
                cur = await conn.execute(
                    "DELETE FROM runs WHERE run_id = ANY(%s) AND status = ANY(%s) "
                    "AND owner IS NULL RETURNING run_id", (list(run_ids), list(FINISHED)))
                deleted = [r[0] for r in await cur.fetchall()]
                cur = await conn.execute("DELETE FROM records WHERE run_id = ANY(%s)",
                                         (deleted,))
                records = cur.rowcount
                await conn.execute("DELETE FROM snapshots WHERE run_id = ANY(%s)", (deleted,))
            return deleted, records

        return await self._do(op)

    async def size_bytes(self) -> int | None:
        async def op(conn: Conn) -> int | None:
            cur = await conn.execute(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() "
                "AND c.relname IN ('runs', 'records', 'snapshots')")
            row = await cur.fetchone()
            return int(row[0]) if row is not None and row[0] is not None else None

        return await self._do(op, idempotent=True)

    async def reclaim(self) -> None:
        async def op(conn: Conn) -> None:
            for table in ("records", "snapshots", "runs"):  # (autocommit: VACUUM needs it)
                await conn.execute(f"VACUUM {table}")

        await self._do(op)
