"""``sqlite:///relative.db`` / ``sqlite:////absolute.db`` -- a store in one SQLite file.

Everything that touches the database runs on one dedicated thread per store (the
``sqlite3`` connection lives and dies there); the async methods hop to it and
wait. Leases are renewed apart, by the lease keeper's thread on a connection of its own
(`_Renewer`, `interlock._engine._lease`), so that a blocked event loop does not lose them. The
store binds to no event loop, so it can be used from successive ``asyncio.run`` calls.

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
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from .._log import Entry
from ._base import (
    Claim,
    ClaimLost,
    ConflictError,
    LeaseRenewer,
    RunExists,
    RunNotFound,
    RunRow,
    Store,
    StoreError,
    Summary,
)
from ._rows import (
    SCHEMA_NAME,
    check_first_seqs,
    run_params,
    summary_params,
)
from ._sqlite_ops import SQLiteOps
from ._sqlite_sql import (
    _APPEND_CHECK,
    _INSERT_RECORD,
    _INSERT_RUN,
    _INSERT_SPEC,
    _ROW_AT,
    _SPEC_AT,
    _UPDATE_SUMMARY,
    _UPDATE_SUMMARY_IF,
    MAX_RUN_KEY,
    SCHEMA_STATEMENTS,
    SCHEMA_VERSION,
    SEQ_BITS,
    SEQ_MASK,
    disk_full,
    sqlite_error,
)
from ._sqlite_thread import _Checkpointer, _Writer
from ._sqlite_upgrade import _reclaim_after_upgrade, _upgrade_from_1, _upgrade_from_2

T = TypeVar("T")

# a checkpoint after this many jobs (transactions, mostly: a step's commit writes 3-5
# pages) or this many bytes of records, whichever comes first: about SQLite's own
# default of a checkpoint per 1000 WAL pages
CHECKPOINT_EVERY = 250
CHECKPOINT_BYTES = 4 << 20
_SYNCHRONOUS = ("off", "normal", "full", "extra")
_SPACE_RETRY = 1.0  # seconds before the WAL's truncation is tried again, after a busy one


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


class SQLiteStore(SQLiteOps, Store):
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

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the store's thread.

        If the awaiting task is cancelled the transaction still runs to its end
        (committed or rolled back as a whole) on the thread.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._thread().submit(loop, fut, self._run, (fn, *args))
        return await fut

    async def _write(self, op: Callable[..., T], *args: Any) -> T:
        """Run ``op(conn, *args)`` in a transaction on the store's thread: its own, or the
        one the writer's turn commits the writes queued with it in (group commit)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._thread().submit(loop, fut, None, (op, args))
        return await fut

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._conn or self._open()
        self._jobs_since_checkpoint += 1
        if self._jobs_since_checkpoint >= CHECKPOINT_EVERY \
                or self._bytes_since_checkpoint >= CHECKPOINT_BYTES:
            self._checkpoint(conn)
        full_before = self._space_wanted
        try:
            return fn(conn, *args)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            raise self._error(exc) from exc
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        finally:
            if self._space_wanted and not full_before and not conn.in_transaction:
                self._give_space_back(conn)  # the disk was found full just now

    def _error(self, exc: sqlite3.Error, what: str = "SQLite store") -> StoreError:
        if disk_full(exc):
            self._space_wanted = True  # (the writer gives the WAL's space back: `_run`)
        return sqlite_error(self.path, exc, self._busy_ms, what)

    def _wal_too_big(self) -> bool:
        """Whether the WAL takes more than half the space left on its disk."""
        try:
            free = shutil.disk_usage(self.path.parent).free
            wal = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return False
        return wal > free // 2

    def _give_space_back(self, conn: sqlite3.Connection, quiet: bool = False) -> None:
        """After a write failed on a full disk: copy the WAL into the file and truncate
        the WAL (``wal_checkpoint(TRUNCATE)``), which gives back the WAL file's space --
        a PASSIVE checkpoint leaves its size as it is, so freed space would fill again at
        once. While the disk is too full for the copy, it is tried again before each
        write (and writes are refused), so the first space freed goes to the checkpoint
        rather than to the WAL; after a reader or writer kept it from its end, not for
        `_SPACE_RETRY` seconds. Says what it did, once per full disk."""
        self._space_next = 0.0
        self._jobs_since_checkpoint = self._bytes_since_checkpoint = 0
        log = logging.getLogger("interlock")
        wal = Path(f"{self.path}-wal")
        before = wal.stat().st_size if wal.exists() else 0
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            if not self._space_said:
                self._space_said = True
                log.error("the disk of the SQLite store %s is full; checkpointing its WAL "
                          "(%d bytes) into the file to give that space back failed too "
                          "(%s): free space on the disk; the checkpoint is tried again "
                          "before each write", self.path, before, exc)
            return
        if busy:
            self._space_next = time.monotonic() + _SPACE_RETRY
            if not self._space_said:
                self._space_said = True
                log.error("the disk of the SQLite store %s is full; its WAL (%d bytes) "
                          "could not be truncated: another connection was reading or "
                          "writing it for longer than the busy timeout; tried again before "
                          "each write", self.path, before)
            return
        after = wal.stat().st_size if wal.exists() else 0
        self._space_wanted = self._space_said = False
        self._space_freed += 1
        log.log(logging.DEBUG if quiet else logging.WARNING,
                "the disk of the SQLite store %s was full: its WAL was checkpointed into the "
                "file and truncated, giving back %d bytes", self.path, before - after)

    def _open(self) -> sqlite3.Connection:
        path = self.path
        fresh = not path.exists() or path.stat().st_size == 0  # no database in it yet
        if not fresh:
            self._inspect(path)
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the directory of the store {path}: {exc}"
                ) from None
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=self._busy_ms / 1000)
        except sqlite3.Error as exc:
            raise self._error(exc, "cannot open the SQLite store") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if fresh:
                # Turning a new, empty file to WAL is a rollback-journal transaction:
                # with SQLite's default synchronous=FULL, four fsyncs (~half the cost of
                # opening a new store here) to make an empty file durable. A crash in it
                # leaves an empty file; the schema below is committed as configured.
                conn.execute("PRAGMA synchronous = OFF")
            self._to_wal(conn)
            conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            conn.execute("BEGIN IMMEDIATE")
            # again: another process may have raced us (or upgraded the file meanwhile)
            version = self._check_tables(conn, path)
            upgraded = version == 1
            if upgraded:
                _upgrade_from_1(conn, path)
            elif version == 2:
                _upgrade_from_2(conn, path)
            for statement in SCHEMA_STATEMENTS:
                conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO interlock_meta VALUES ('schema', ?), "
                         "('version', ?)", (SCHEMA_NAME, str(SCHEMA_VERSION)))
            conn.execute("UPDATE interlock_meta SET value = ? WHERE key = 'version'",
                         (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
            if upgraded:
                _reclaim_after_upgrade(conn, path)
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer's job
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, "cannot open the SQLite store") from None
            raise
        self._conn = conn
        self._checkpointer = _Checkpointer(path, f"interlock-sqlite-checkpoint:{path.name}")
        return conn

    def _to_wal(self, conn: sqlite3.Connection) -> None:
        """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

        Two connections turning a new file to WAL at once both hold a shared lock and
        want an exclusive one: SQLite refuses one at once with "database is locked"
        rather than wait (a deadlock), whatever the busy timeout. Processes opening one
        new store together are common (a worker pool, two CLI runs), so retry -- on the
        writer thread, within the busy timeout -- as the busy handler would.
        """
        deadline = time.monotonic() + self._busy_ms / 1000
        pause = 0.0005
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchall()
                return
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if ("locked" not in text and "busy" not in text) \
                        or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Ask the checkpointer for a checkpoint; if it has failed, let SQLite checkpoint
        on commit again (the WAL would otherwise grow without end)."""
        self._jobs_since_checkpoint = self._bytes_since_checkpoint = 0
        ck = self._checkpointer
        if ck is None:
            return
        if ck.failed is None:
            ck.request()
            return
        self._checkpointer = None
        ck.stop()
        conn.execute("PRAGMA wal_autocheckpoint = 1000")

    def _inspect(self, path: Path) -> None:
        """Refuse, without writing to it, a file that is not ours.

        The file is read through SQLite only, never with a descriptor of our own: on
        POSIX, closing *any* descriptor of a file drops every lock the process holds on
        it, so a raw ``open()``/``close()`` would silently release the locks of this
        process's other connections to the same database -- and another process closing
        its connection would then think it is the last one and delete the WAL they use.
        """
        try:
            ro = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                 isolation_level=None, timeout=self._busy_ms / 1000)
        except sqlite3.Error as exc:
            raise self._error(exc, "cannot open the SQLite store") from None
        try:
            self._check_tables(ro, path)
        finally:
            ro.close()

    @staticmethod
    def _check_tables(conn: sqlite3.Connection, path: Path) -> int | None:
        """The file's schema version (None: no tables yet), if it is an interlock store
        this interlock understands; otherwise `StoreError`."""
        try:
            tables = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%'")}
            meta: dict[str, str] = {}
            if "interlock_meta" in tables:
                meta = dict(conn.execute("SELECT key, value FROM interlock_meta"))
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise StoreError(
                    f"{path} is not a SQLite database (and so not an interlock store); "
                    "refusing to touch it -- point the store URL at another file"
                ) from None
            if "readonly" in str(exc):
                raise sqlite_error(path, exc, 0, "cannot open the SQLite store") from None
            raise StoreError(
                f"{path} is not a usable SQLite database ({exc}); refusing to touch it"
            ) from None
        if not tables:
            return None
        if meta.get("schema") != SCHEMA_NAME:
            raise StoreError(
                f"{path} is a SQLite database of something else (tables: "
                f"{', '.join(sorted(tables))}), not an interlock store; refusing to touch it "
                "-- point the store URL at another file"
            )
        version = meta.get("version", "")
        if not version.isdigit() or int(version) > SCHEMA_VERSION:
            raise StoreError(
                f"{path} is an interlock store of schema version {version!r}, newer than "
                f"this interlock understands ({SCHEMA_VERSION}); upgrade interlock"
            )
        return int(version)

    async def close(self) -> None:
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
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.close_with(self._close_conn)

    def _close_conn(self) -> None:
        # the checkpointer's connection first: the last one to close checkpoints the
        # whole WAL into the file and removes it
        ck, self._checkpointer = self._checkpointer, None
        if ck is not None:
            ck.stop()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- transactions (on the worker thread) --------------------------------------------

    def _rows(self, run_key: int, entries: list[Entry]) -> list[tuple[Any, ...]]:
        self._bytes_since_checkpoint += sum(len(e.data) for e in entries)
        base = run_key << SEQ_BITS
        return [(base | e.seq, e.data.decode("utf-8"), bytes.fromhex(e.hash))
                for e in entries]

    # Writes are operations run inside a transaction they do not open or commit: the
    # writer runs one alone in ``BEGIN IMMEDIATE ... COMMIT`` (`_alone`), or the writes
    # queued one after the other together in one (`_together`), each under a savepoint.

    def _create_in(self, conn: sqlite3.Connection, row: RunRow, entries: list[Entry]) -> None:
        params = run_params(row)
        try:
            run_key = conn.execute(_INSERT_RUN, [params[i] for i in _ROW_AT]).lastrowid
        except sqlite3.IntegrityError:
            raise RunExists(row.run_id) from None
        assert run_key is not None
        if run_key > MAX_RUN_KEY:
            raise StoreError(f"SQLite store {self.path} has numbered {MAX_RUN_KEY:,} runs, "
                             "as many as one file holds; start a new store file")
        conn.execute(_INSERT_SPEC, (run_key, *(params[i] for i in _SPEC_AT)))
        conn.executemany(_INSERT_RECORD, self._rows(run_key, entries))

    def _append_in(self, conn: sqlite3.Connection, run_id: str, entries: list[Entry],
                   summary: Summary, release: str | None, claim: Claim | None = None) -> None:
        params = summary_params(summary)  # params[0] is the status
        prev = entries[0].seq - 1 if entries else None
        if entries and entries[-1].seq > SEQ_MASK:
            raise StoreError(f"run {run_id!r}: a SQLite store holds {SEQ_MASK:,} records "
                             "a run at most")
        held = None if claim is None else claim.generation
        done = conn.execute(_UPDATE_SUMMARY_IF, (*params[1:], run_id, summary.status,
                                                 prev, held)).fetchall()  # [(run_key,)] or []
        if not done:
            found = conn.execute(_APPEND_CHECK, (run_id,)).fetchone()
            if found is None:
                raise RunNotFound(run_id)
            if held is not None and found[3] != held:  # claimed since: fenced off
                raise ClaimLost(run_id, found[4], found[3], held)
            check_first_seqs(run_id, found[1], entries)  # raises ConflictError
            conn.execute(_UPDATE_SUMMARY, (*params, run_id))  # the status changes
            done = [found[2:]]
        if entries:
            try:
                conn.executemany(_INSERT_RECORD, self._rows(done[0][0], entries))
            except sqlite3.IntegrityError as exc:
                raise ConflictError(f"run {run_id!r}: {exc}; another writer got there "
                                    "first") from None
        if release is not None:
            self._release(conn, run_id, release)

    def _write_batch(self, batch: list[tuple[Any, ...]]
                     ) -> list[tuple[Any, BaseException | None]]:
        """On the writer thread: the writes of one turn (``(operation, args)`` each),
        committed in one transaction; each one's outcome, in order.

        A write that is refused (a conflict, a run that is not there, a claim held by
        another) is undone to its savepoint and fails alone: the others commit. When the
        transaction as a whole fails (the commit, the write lock), every write of it
        fails and none is stored.
        """
        try:
            if self._space_wanted:  # the disk was full: the WAL's space back first
                if time.monotonic() >= self._space_next:
                    self._give_space_back(self._conn or self._open())
                if self._space_wanted:  # (a write now would take the space freed)
                    raise StoreError(
                        f"SQLite store {self.path}: the disk is full; no write is made until "
                        "the store's WAL is checkpointed into the file and truncated, which "
                        "needs some free space on the disk: free some, and the write can be "
                        "tried again")
            elif self._space_freed and self._wal_too_big():
                # once a disk was full here: the WAL is truncated before it takes half the
                # space left (the store's own checkpoints come every CHECKPOINT_EVERY jobs,
                # and the WAL's space would be gone before the next one)
                self._give_space_back(self._conn or self._open(), quiet=True)
            freed = self._space_freed
            try:
                return self._batch(batch)
            except StoreError:
                if self._space_freed == freed:
                    raise
                # the disk was full (nothing of the batch was stored), and truncating the
                # WAL gave space back: the batch once more, in that space
                return self._batch(batch)
        except BaseException as exc:  # nothing of the batch was committed
            return [(None, exc)] * len(batch)

    def _batch(self, batch: list[tuple[Any, ...]]) -> list[tuple[Any, BaseException | None]]:
        if len(batch) == 1:
            return [(self._run(self._alone, *batch[0]), None)]
        return self._run(self._together, batch)

    def _together(self, conn: sqlite3.Connection, batch: list[tuple[Any, ...]]
                  ) -> list[tuple[Any, BaseException | None]]:
        outcomes: list[tuple[Any, BaseException | None]] = []
        conn.execute("BEGIN IMMEDIATE")
        for op, args in batch:
            conn.execute("SAVEPOINT interlock_write")
            try:
                outcomes.append((op(conn, *args), None))
            except StoreError as exc:
                conn.execute("ROLLBACK TO interlock_write")
                outcomes.append((None, exc))
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO interlock_write")
                outcomes.append((None, self._error(exc)))
            except Exception as exc:  # a bug in one write's values fails that write only
                conn.execute("ROLLBACK TO interlock_write")
                outcomes.append((None, exc))
            conn.execute("RELEASE interlock_write")
        conn.execute("COMMIT")
        return outcomes

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

    async def cancel_requested(self, run_id: str) -> dict[str, Any] | None:
        if self._absent():
            raise RunNotFound(run_id)
        return await self._call(self._cancel_requested, run_id)

    async def release(self, run_id: str, owner: str) -> None:
        await self._write(self._release, run_id, owner)

    # -- pruning ---------------------------------------------------------------------

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
