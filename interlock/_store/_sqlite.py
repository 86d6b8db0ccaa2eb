"""``sqlite:///relative.db`` / ``sqlite:////absolute.db`` -- a store in one SQLite file.

Everything that touches the database runs on one dedicated thread per store (the
``sqlite3`` connection lives and dies there); the async methods hop to it and
wait -- except a write made while that thread is idle and nothing else is ready on the
event loop, which the thread lets run on the loop's own thread, sparing the hop
(`interlock._store._sqlite_inline`: never a wait for a lock or an fsync there).
Leases are renewed apart, by the lease keeper's thread on a connection of its own
(`_Renewer`, `interlock._engine._lease`), so that a blocked event loop does not lose them.
The store binds to no event loop, so it can be used from successive ``asyncio.run``
calls.

Durability. The file is in WAL mode. Each ``create_run`` / ``append`` / claim is
committed in a ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction before the coroutine
returns: its own, or -- group commit -- the one its writer's turn runs the writes
queued with it in, each under a savepoint (a refused one fails alone; see
`interlock._store._sqlite_thread`).
With the default ``synchronous=NORMAL`` a committed transaction survives the process
being killed at any point; a power loss or OS crash may lose the last few commits
(never corrupting the file). Add ``?synchronous=full`` to the URL to fsync the WAL on
every commit and survive power loss too (about 4x slower commits)::

    sqlite:///.interlock/runs.db?synchronous=full

Checkpoints. SQLite copies the WAL back into the database file now and then (a
checkpoint, with an fsync of each file). By default the connection that commits does
it, every 1000 pages, inside that commit: a step in twenty or so paid for all of them.
Here the writer's connection does not checkpoint (``wal_autocheckpoint = 0``); a second
thread (started by the first request) with its own connection runs
``PRAGMA wal_checkpoint(PASSIVE)`` every
`CHECKPOINT_EVERY` jobs or `CHECKPOINT_BYTES` of records, which does not block the
writer -- SQLite's advice for a busy writer. If that thread cannot work, the writer
goes back to SQLite's automatic checkpoints.

``?busy_timeout=<ms>`` (default 10000) is how long a writer waits for another
process holding the write lock; several processes may share one file.

Schema, version 3 (readable with the ``sqlite3`` shell)::

    interlock_meta(key, value)                   -- ('schema', 'interlock'), ('version', '3')
    runs(run_key INTEGER PK, run_id UNIQUE, workflow, status, definition_hash,
         created_at, updated_at, last_seq, last_hash, steps, tokens, error, waiting,
         parent_run, parent_seq, owner, lease_until, extra, generation)
                                                 -- generation: the claim's, bumped by
                                                 -- every claim; appends are fenced by it
                                                 -- JSON columns as TEXT
    run_specs(run_key INTEGER PK, definition, input, options)
                                                 -- what the run started with: never
                                                 -- updated, so kept out of the runs row
    entries(id INTEGER PK, data TEXT, hash BLOB) -- id = run_key << 32 | seq; data: the
                                                 -- record's exact JSON text; hash: 32 bytes
    records(run_id, seq, type, node, data, hash) -- a view of entries, hash as hex: e.g.
        SELECT seq, type, data FROM records WHERE run_id = '...' ORDER BY seq

Every append updates its run's row (the summary); SQLite reads the whole row to
rewrite it, so the row holds no large value: a run's definition, input and options --
written once -- are in `run_specs` (with a 3 MB definition in the row an append took
5.6 ms, against 0.16 ms without). The records view is read-only: triggers refuse a
write with a message saying so (an interlock older than the file would write it).

A record is a row of its JSON and its hash and nothing else: the key is one integer
(the run's number in this file and the record's seq), the hash its 32 bytes, and the
type and node -- in the JSON already -- are not stored again. Version 1 kept the run
id, the seq, the type and the node beside the JSON and the hash as 64 hex characters:
about a third more bytes per record. A version-1 file is upgraded in place, in one
transaction, the first time it is opened (`interlock._store._sqlite_upgrade`); its
records, hashes and
snapshots are kept exactly (verify still passes on them), but an interlock older than
this one then refuses the file as newer than it understands. Version 3 added the
runs' claim ``generation`` (a column of 0s for the runs already there: an
``ALTER TABLE``, instant, `_upgrade_from_2`).

A file that is not a SQLite database, or a SQLite database holding other tables
and not ours, is refused with `StoreError` and never written to.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import weakref
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from .._json import JSONObject
from .._log import Entry
from ._base import (
    Claim,
    LeaseRenewer,
    RunNotFound,
    RunRow,
    Store,
    StoreError,
    Summary,
)
from ._rows import check_first_seqs
from ._search import Found
from ._sqlite_inline import SQLiteInline, loop_idle
from ._sqlite_sql import sqlite_error
from ._sqlite_thread import _Checkpointer, _Writer
from ._sqlite_watch import Watch

T = TypeVar("T")

_SYNCHRONOUS = ("off", "normal", "full", "extra")


# -- URL ---------------------------------------------------------------------------------

def parse_sqlite_url(url: str) -> tuple[str, str, int]:
    """``(path, synchronous, busy_timeout_ms)`` of a ``sqlite:///...`` URL."""
    if not url.startswith("sqlite:///"):
        raise StoreError(
            f"bad SQLite store URL {url!r}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db"
        )
    rest = url[len("sqlite:///"):]
    path, _, query = rest.partition("?")
    if not path:
        raise StoreError(f"bad SQLite store URL {url!r}: no file name")
    synchronous, busy_ms = "normal", 10_000
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key == "synchronous":
            synchronous = value.lower()
            if synchronous not in _SYNCHRONOUS:
                raise StoreError(
                    f"bad SQLite store URL {url!r}: synchronous must be one of "
                    f"{', '.join(_SYNCHRONOUS)}"
                )
        elif key == "busy_timeout":
            if not value.isdigit():
                raise StoreError(f"bad SQLite store URL {url!r}: busy_timeout is milliseconds")
            busy_ms = int(value)
        else:
            raise StoreError(
                f"bad SQLite store URL {url!r}: unknown parameter {key!r} "
                "(known: synchronous, busy_timeout)"
            )
    return path, synchronous, busy_ms


# -- the store ---------------------------------------------------------------------------


class _Renewer(LeaseRenewer):
    """Renews leases on a connection of its own (the lease keeper's thread), not through
    the store's writer thread: each renewal is one autocommitted ``UPDATE``, waiting for
    the file's write lock as any writer does (``busy_timeout``)."""

    def __init__(self, path: Path, busy_ms: int) -> None:
        self.path, self.busy_ms = path, busy_ms
        self.conn: sqlite3.Connection | None = None

    def renew(self, run_id: str, claim: Claim, lease: float) -> None:
        try:
            if self.conn is None:
                self.conn = sqlite3.connect(self.path, isolation_level=None,
                                            timeout=self.busy_ms / 1000,
                                            check_same_thread=False)
            SQLiteStore._heartbeat(self.conn, run_id, claim.owner, lease, claim.generation)
        except sqlite3.Error as exc:
            self.close()
            raise sqlite_error(self.path, exc, self.busy_ms) from None

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


LEASES_SQL = ("SELECT run_id, workflow, status, owner, lease_until FROM runs "
              "WHERE owner IS NOT NULL ORDER BY owner, run_id")


class SQLiteStore(SQLiteInline, Store):
    """The store in one SQLite file (see the module): its file
    (`interlock._store._sqlite_file`), its WAL (`interlock._store._sqlite_wal`), its writes
    (`interlock._store._sqlite_writes`), those run on the event loop's thread when the
    writer is idle (`interlock._store._sqlite_inline`) and its operations on a connection
    (`interlock._store._sqlite_ops`) in parts of their own; here its state, the hops to
    the writer thread, closing, and the `Store` interface."""

    leases_in_writes = True
    fences_appends = True

    def __init__(self, url: str) -> None:
        self.url = url
        path, self._synchronous, self._busy_ms = parse_sqlite_url(url)
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None  # used on the writer thread only
        self._writer: _Writer | None = None
        self._lock = threading.Lock()
        # started with the writer's connection; both on the writer thread only
        self._checkpointer: _Checkpointer | None = None
        self._jobs_since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        # a write failed for want of space: the WAL is to be truncated (`_give_space_back`;
        # on the writer thread, as the three below)
        self._space_wanted = False
        self._space_next = 0.0  # (time.monotonic) not tried again before
        self._space_said = False  # its failure was logged
        # times the WAL was truncated after a full disk; once it was, the WAL is kept
        # under half the space left (`_wal_too_big`)
        self._space_freed = 0
        # the change detectors (`interlock._store._sqlite_watch`), one per event loop
        self._watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watch] = \
            weakref.WeakKeyDictionary()
        self._runnable_seen: int | None = None  # `wait_runnable`'s last count
        self._yielded_at = 0.0  # an inline write last yielded the event loop (monotonic)
        self._lent = False  # a write is running on the event loop's thread

    # -- plumbing ----------------------------------------------------------------------

    def _thread(self) -> _Writer:
        writer = self._writer
        if writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = _Writer(f"interlock-sqlite:{self.path.name}",
                                           self._write_batch)
                writer = self._writer
        return writer

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)`` on the store's thread.

        If the awaiting task is cancelled the transaction still runs to its end
        (committed or rolled back as a whole) on the thread.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._thread().submit(loop, fut, self._run, (fn, *args))
        return await fut

    async def _write(self, op: Callable[..., T], *args: object) -> T:
        """Run ``op(conn, *args)`` in a transaction on the store's thread: its own, or the
        one the writer's turn commits the writes queued with it in (group commit) -- or,
        when the writer is idle and nothing else is ready on the event loop, in its own
        on this thread (`interlock._store._sqlite_inline`)."""
        loop = asyncio.get_running_loop()
        writer = self._thread()
        if loop_idle(loop):
            done = self._write_here(writer, op, args)
            if done is not None:
                result, exc = done
                if exc is not None:
                    raise exc
                if self._time_to_yield():
                    await asyncio.sleep(0)
                return result  # type: ignore[return-value]  # op's own result
        fut: asyncio.Future[T] = loop.create_future()
        writer.submit(loop, fut, None, (op, args))
        return await fut

    def _watch(self) -> Watch:
        loop = asyncio.get_running_loop()
        watch = self._watches.get(loop)
        if watch is None:
            watch = self._watches[loop] = Watch(self.path, self._busy_ms)
        return watch

    async def wait_changed(self, timeout: float, seen: int | None = None,
                           run_id: str | None = None) -> int:
        """Until a commit to the file by any connection (``PRAGMA data_version``, looked
        at every few milliseconds while someone waits: `interlock._store._sqlite_watch`)
        after ``seen``, at most ``timeout`` seconds (whichever run it was for: the
        version does not say)."""
        return await self._watch().wait(timeout, seen)

    async def wait_runnable(self, timeout: float) -> None:
        """Until a commit to the file by any connection since the last call returned (a
        run may have become runnable), at most ``timeout`` seconds."""
        watch = self._watch()
        self._runnable_seen = await watch.wait(timeout, self._runnable_seen)

    async def _close_watches(self) -> None:
        loop = asyncio.get_running_loop()
        watches = list(self._watches.items())
        self._watches.clear()
        for owner, watch in watches:
            if owner is loop:
                await watch.close()
            else:
                watch.close_conn()

    async def close(self) -> None:
        await self._close_watches()
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is None:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        writer.submit(loop, fut, self._close_conn, ())
        try:
            await fut
        finally:
            writer.stop()  # the thread ends right after closing the connection

    async def close_soon(self) -> None:
        """`close` without waiting: the writer thread closes the connection after the jobs
        queued (SQLite then copies the WAL into the file, with an fsync) and ends; at exit
        the process waits for it (`_stop_writers`)."""
        await self._close_watches()
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.close_with(self._close_conn)

    # -- the Store interface ----------------------------------------------------------------

    async def create_run(self, row: RunRow, entries: list[Entry]) -> None:
        check_first_seqs(row.run_id, 0, entries)
        await self._write(self._create_in, row, list(entries))

    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     release: str | None = None, *, claim: Claim | None = None) -> None:
        await self._write(self._append_in, run_id, list(entries), summary, release, claim)

    def _absent(self) -> bool:
        """No file yet (and none opened): a read answers from that, without creating one --
        `interlock runs` with a mistyped --store must not leave an empty database behind."""
        return self._conn is None and not self.path.exists()

    async def get_run(self, run_id: str) -> RunRow:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._call(self._get_run, run_id)

    async def entries(self, run_id: str, after: int = 0) -> list[Entry]:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._call(self._entries, run_id, after)

    async def entries_page(self, run_id: str, after: int = 0, limit: int = 1000
                           ) -> list[Entry]:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._call(self._entries, run_id, after, max(limit, 0))

    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[RunRow]:
        if self._absent():
            return []
        return await self._call(self._list_runs, status, workflow, limit)

    async def list_page(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100, before: tuple[float, str] | None = None,
                        updated_after: float | None = None) -> list[RunRow]:
        return await self._call(self._list_page, status, workflow, limit, before,
                                updated_after)

    async def claim(self, run_id: str, owner: str, lease: float, *,
                    force: bool = False) -> int:
        return await self._write(self._claim, run_id, owner, lease, force)

    async def leases(self) -> list[dict[str, Any]]:
        if self._absent():
            return []

        def read(conn: Any) -> list[dict[str, Any]]:
            return [{"run_id": r, "workflow": w, "status": s, "owner": o, "lease_until": u}
                    for r, w, s, o, u in conn.execute(LEASES_SQL)]
        return await self._call(read)

    async def claim_next(self, owner: str, lease: float, *,
                         workflows: Collection[str] | None = None,
                         exclude: Collection[str] = ()) -> str | None:
        if self._absent():
            return None  # (an idle worker does not create the file)
        names = None if workflows is None else sorted(workflows)
        if await self._call(self._runnable, names, sorted(exclude)) is None:
            return None  # an idle worker's look takes no write lock
        return await self._write(self._claim_next, owner, lease, names, sorted(exclude))

    async def heartbeat(self, run_id: str, owner: str, lease: float,
                        generation: int | None = None) -> None:
        await self._write(self._heartbeat, run_id, owner, lease, generation)

    def lease_renewer(self) -> LeaseRenewer:
        return _Renewer(self.path, self._busy_ms)

    async def request_cancel(self, run_id: str, by: str | None) -> None:
        if self._absent():
            raise RunNotFound(run_id)
        await self._write(self._request_cancel, run_id, by)

    async def offer_decision(self, run_id: str, gate: str, decision: dict[str, Any]
                             ) -> dict[str, Any] | None:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._write(self._offer_decision, run_id, gate, decision)

    async def decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._call(self._decisions, run_id)

    async def save_snapshot(self, run_id: str, seq: int, data: bytes) -> None:
        await self._write(self._save_snapshot, run_id, seq, data)

    async def get_cursor(self, name: str) -> str | None:
        if self._absent():
            return None
        return await self._call(self._get_cursor, name)

    async def set_cursor(self, name: str, value: str) -> None:
        await self._write(self._set_cursor, name, value)

    async def load_snapshot(self, run_id: str) -> tuple[int, bytes] | None:
        if self._absent():
            return None
        return await self._call(self._load_snapshot, run_id)

    async def cancel_requested(self, run_id: str) -> JSONObject | None:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._call(self._cancel_requested, run_id)

    async def release(self, run_id: str, owner: str) -> None:
        await self._write(self._release, run_id, owner)

    # -- pruning ---------------------------------------------------------------------

    async def search_messages(self, workflow: str, query: str, *, limit: int = 5,
                              exclude: str | None = None) -> list[Found]:
        from . import _sqlite_search
        from ._search import words

        wanted = words(query)
        if self._absent() or not wanted:
            return []
        return await self._call(_sqlite_search.search, workflow, wanted, limit, exclude)

    async def delete_finished(self, run_ids: list[str]) -> tuple[list[str], int]:
        if self._absent() or not run_ids:
            return [], 0
        return await self._call(self._delete_finished, list(run_ids))

    async def size_bytes(self) -> int | None:
        return sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal"))
                   if p.exists())

    def _vacuum(self, conn: sqlite3.Connection) -> None:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def reclaim(self) -> None:
        if not self._absent():
            await self._call(self._vacuum)

