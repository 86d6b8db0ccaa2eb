"""``sqlite:///relative.db`` / ``sqlite:////absolute.db`` -- a store in one SQLite file.

Everything that touches the database runs on one dedicated thread per store (the
``sqlite3`` connection lives and dies there); the async methods hop to it and
wait. Leases are renewed apart, by the lease keeper's thread on a connection of its own
(`_Renewer`, `interlock._engine._lease`), so that a blocked event loop does not lose them. The
store binds to no event loop, so it can be used from successive ``asyncio.run`` calls.

Durability. The file is in WAL mode. Each ``create_run`` / ``append`` / claim is
committed in a ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction before the coroutine
returns: its own, or -- group commit -- the one its writer's turn runs the writes
queued with it in, each under a savepoint (a refused one fails alone; see `_Writer`).
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
transaction, the first time it is opened (`_upgrade_from_1`); its records, hashes and
snapshots are kept exactly (verify still passes on them), but an interlock older than
this one then refuses the file as newer than it understands. Version 3 added the
runs' claim ``generation`` (a column of 0s for the runs already there: an
``ALTER TABLE``, instant, `_upgrade_from_2`).

A file that is not a SQLite database, or a SQLite database holding other tables
and not ours, is refused with `StoreError` and never written to.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import queue
import re
import shutil
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import orjson

from .._log import Entry, json_default
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

T = TypeVar("T")

SCHEMA_NAME = "interlock"
SCHEMA_VERSION = 3

# a checkpoint after this many jobs (transactions, mostly: a step's commit writes 3-5
# pages) or this many bytes of records, whichever comes first: about SQLite's own
# default of a checkpoint per 1000 WAL pages
CHECKPOINT_EVERY = 250
CHECKPOINT_BYTES = 4 << 20
_SYNCHRONOUS = ("off", "normal", "full", "extra")
_SPACE_RETRY = 1.0  # seconds before the WAL's truncation is tried again, after a busy one

_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    run_key         INTEGER PRIMARY KEY,
    run_id          TEXT NOT NULL UNIQUE,
    workflow        TEXT NOT NULL,
    status          TEXT NOT NULL,
    definition_hash TEXT NOT NULL,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    last_seq        INTEGER NOT NULL,
    last_hash       TEXT NOT NULL,
    steps           INTEGER NOT NULL DEFAULT 0,
    tokens          INTEGER NOT NULL DEFAULT 0,
    error           TEXT,
    waiting         TEXT,
    parent_run      TEXT,
    parent_seq      INTEGER,
    owner           TEXT,
    lease_until     REAL,
    extra           TEXT NOT NULL DEFAULT '{{}}',
    generation      INTEGER NOT NULL DEFAULT 0
)"""

# A run's records are the entries with ids from its run_key << 32 on: a rowid range, so
# reading a run's log, its last seq and deleting it are range scans of the table itself
# (no index beside it), and one run's appends fill its pages one after the other.
SEQ_BITS = 32
SEQ_MASK = (1 << SEQ_BITS) - 1
MAX_RUN_KEY = (1 << (63 - SEQ_BITS)) - 1  # ids stay below 2**63, SQLite's INTEGER
_RUN_ENTRIES = (f"BETWEEN {{key}} << {SEQ_BITS} AND ({{key}} << {SEQ_BITS}) | {SEQ_MASK}")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS interlock_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
{_RUNS_TABLE.format(name="runs")};
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at DESC);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, created_at DESC);
CREATE INDEX IF NOT EXISTS runs_by_workflow ON runs (workflow, created_at DESC);
CREATE TABLE IF NOT EXISTS run_specs (
    run_key    INTEGER PRIMARY KEY,
    definition TEXT NOT NULL,
    input      TEXT NOT NULL,
    options    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    id   INTEGER PRIMARY KEY,
    data TEXT NOT NULL,
    hash BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
    run_id TEXT PRIMARY KEY,
    seq    INTEGER NOT NULL,
    data   BLOB NOT NULL
) WITHOUT ROWID;
CREATE VIEW IF NOT EXISTS records AS
    SELECT runs.run_id AS run_id, entries.id & {SEQ_MASK} AS seq,
           json_extract(entries.data, '$.type') AS type,
           json_extract(entries.data, '$.node') AS node,
           entries.data AS data, lower(hex(entries.hash)) AS hash
    FROM runs JOIN entries ON entries.id {_RUN_ENTRIES.format(key="runs.run_key")}
"""
# The records view is read-only, and says why to whoever writes it: an interlock older
# than the file (one that was running when the file was upgraded), or someone by hand.
_VIEW_WRITE = ("records is a read-only view of the entries table since schema version 2; "
               "an interlock writing it is older than this store file: upgrade it")
# Poll triggers' cursors (`Store.get_cursor`): a table of its own, created when a file is
# opened (IF NOT EXISTS: a version-2 file gets it on its next open, with nothing else
# changed, and an interlock that does not know it ignores it -- no version change)
_CURSORS = """
CREATE TABLE IF NOT EXISTS cursors (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID"""
SCHEMA_STATEMENTS = tuple(st for st in _SCHEMA.split(";") if st.strip()) + tuple(
    f"CREATE TRIGGER IF NOT EXISTS records_{op.lower()} INSTEAD OF {op} ON records "
    f"BEGIN SELECT RAISE(ABORT, '{_VIEW_WRITE}'); END" for op in ("INSERT", "UPDATE", "DELETE")
) + (_CURSORS,)

_INSERT_RECORD = "INSERT INTO entries (id, data, hash) VALUES (?, ?, ?)"
_SET_SUMMARY = ("updated_at = ?, last_seq = ?, last_hash = ?, steps = ?, tokens = ?, "
                "error = ?, waiting = ?")
# the run's highest stored seq, 0 if none: one seek to the end of its range
_LAST_SEQ = (f"COALESCE((SELECT id & {SEQ_MASK} FROM entries WHERE id "
             f"{_RUN_ENTRIES.format(key='runs.run_key')} ORDER BY id DESC LIMIT 1), 0)")
# An append's usual case as one compare-and-set: the run exists, keeps its status, and
# the entries continue its log (the 10th parameter is the seq before them, or NULL when
# there are none); it returns the run's key. `status` is not assigned, which spares the
# runs_by_status index a rewrite -- a page less in the WAL per append (SQLite rewrites an
# index entry when a column it covers is assigned, even to the value it had).
_UPDATE_SUMMARY_IF = (f"UPDATE runs SET {_SET_SUMMARY} WHERE run_id = ? AND status = ? "
                      f"AND (?10 IS NULL OR {_LAST_SEQ} = ?10) "
                      "AND (?11 IS NULL OR generation = ?11) RETURNING run_key")
# otherwise: what the run's row and log say, then the summary with its status
_APPEND_CHECK = (f"SELECT status, {_LAST_SEQ}, run_key, generation, owner FROM runs "
                 "WHERE run_id = ?")
_UPDATE_SUMMARY = f"UPDATE runs SET status = ?, {_SET_SUMMARY} WHERE run_id = ?"
_RUN_COLUMNS = (
    "run_id, workflow, status, definition, definition_hash, input, options, created_at, "
    "updated_at, last_seq, last_hash, steps, tokens, error, waiting, parent_run, parent_seq, "
    "owner, lease_until, extra, generation"
)

# `_RUN_COLUMNS` of a run: its row's, then its spec's (`run_params` order otherwise)
_SPEC_COLUMNS = ("definition", "input", "options")
_RUN_NAMES = [c.strip() for c in _RUN_COLUMNS.split(",")]
_ROW_AT = [i for i, c in enumerate(_RUN_NAMES) if c not in _SPEC_COLUMNS]
_SPEC_AT = [_RUN_NAMES.index(c) for c in _SPEC_COLUMNS]
_RUN_FROM = "runs JOIN run_specs USING (run_key)"
# a list's row (`Store.list_page`): the runs table's columns alone, its spec's read as {}
_LIGHT_COLUMNS = ", ".join("'{}'" if c in _SPEC_COLUMNS else c for c in _RUN_NAMES)
# A new run's key is above every key in use, by a run or by entries (records left behind
# by a run whose row was deleted behind the store's back): no run starts on another's log.
_INSERT_RUN = (f"INSERT INTO runs (run_key, {', '.join(_RUN_NAMES[i] for i in _ROW_AT)}) "
               "VALUES (max(coalesce((SELECT max(run_key) FROM runs), 0), "
               f"coalesce((SELECT max(id) FROM entries), 0) >> {SEQ_BITS}) + 1, "
               f"{', '.join('?' * len(_ROW_AT))})")
_INSERT_SPEC = f"INSERT INTO run_specs (run_key, {', '.join(_SPEC_COLUMNS)}) VALUES (?, ?, ?, ?)"
_RUN_KEY = "SELECT run_key FROM runs WHERE run_id = ?"
_READ_ENTRIES = ("SELECT id, data, hash FROM entries WHERE id > ? AND id <= ? "
                 "ORDER BY id LIMIT ?")


# -- helpers shared with the PostgreSQL store ------------------------------------------------

def json_text(value: Any) -> str:
    """``value`` as JSON text, keys in their given order (a definition's order matters)."""
    return orjson.dumps(value, default=json_default).decode("utf-8")


def json_opt(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json_text(value)


def from_json(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def record_node(entry: Entry) -> str | None:
    """The record's ``node`` field, for the ``records.node`` column (the entry carries
    it: `LogWriter` sets it, and so do the stores when they read entries back)."""
    return entry.node


def check_first_seqs(run_id: str, last: int, entries: Iterable[Entry]) -> None:
    """Entries must continue the stored log (``last`` = its highest seq) without a gap."""
    expected = last + 1
    for e in entries:
        if e.seq > expected == last + 1:  # a gap after the log: not another writer
            raise ConflictError(
                f"run {run_id!r}: record {e.seq} does not follow the stored log, which ends "
                f"at seq {expected - 1}: the records before it were never stored (an earlier "
                "append of this writer failed); nothing of this append was stored")
        if e.seq != expected:
            raise ConflictError(
                f"run {run_id!r}: record {e.seq} conflicts with the stored log "
                f"(next free seq is {last + 1}); another writer got there first"
            )
        expected += 1


def run_params(row: RunRow) -> tuple[Any, ...]:
    """``row`` as the values of `_RUN_COLUMNS`, in order."""
    s = row.summary
    return (
        row.run_id, row.workflow, s.status, json_text(row.definition), row.definition_hash,
        json_text(row.input), json_text(row.options), row.created_at, s.updated_at,
        s.last_seq, s.last_hash, s.steps, s.tokens, json_opt(s.error), json_opt(s.waiting),
        row.parent_run, row.parent_seq, row.owner, row.lease_until, json_text(row.extra),
        row.generation,
    )


def summary_params(summary: Summary) -> tuple[Any, ...]:
    """For ``SET status, updated_at, last_seq, last_hash, steps, tokens, error, waiting``."""
    s = summary
    return (s.status, s.updated_at, s.last_seq, s.last_hash, s.steps, s.tokens,
            json_opt(s.error), json_opt(s.waiting))


def page_query(mark: str, status: str | None, workflow: str | None,
               before: tuple[float, str] | None, updated_after: float | None,
               limit: int, *, order_id: str = "run_id") -> tuple[str, list[Any]]:
    """`Store.list_page`'s SELECT over the runs table and its parameters (``mark``: the
    driver's placeholder; ``order_id``: how run ids compare, the same in the keyset
    condition as in the ORDER BY)."""
    where: list[str] = []
    params: list[Any] = []
    if status is not None:
        where.append(f"status = {mark}")
        params.append(status)
    if workflow is not None:
        where.append(f"workflow = {mark}")
        params.append(workflow)
    if updated_after is not None:
        where.append(f"updated_at > {mark}")
        params.append(updated_after)
    if before is not None:
        # a range on created_at (the indexes' order) and the tie broken by run id
        where.append(f"created_at <= {mark} AND (created_at < {mark} OR {order_id} < {mark})")
        params += [before[0], before[0], before[1]]
    sql = f"SELECT {_LIGHT_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY created_at DESC, {order_id} DESC LIMIT {mark}"
    params.append(max(limit, 0))
    return sql, params


def row_from(values: tuple[Any, ...] | Any) -> RunRow:
    """A `RunRow` from a result row in `_RUN_COLUMNS` order."""
    (run_id, workflow, status, definition, definition_hash, input_, options, created_at,
     updated_at, last_seq, last_hash, steps, tokens, error, waiting, parent_run, parent_seq,
     owner, lease_until, extra, generation) = values
    return RunRow(
        run_id=run_id,
        workflow=workflow,
        definition=from_json(definition),
        definition_hash=definition_hash,
        input=from_json(input_),
        options=from_json(options),
        created_at=created_at,
        summary=Summary(
            status=status, last_seq=last_seq, last_hash=last_hash, steps=steps, tokens=tokens,
            error=from_json(error), waiting=from_json(waiting), updated_at=updated_at,
        ),
        parent_run=parent_run,
        parent_seq=parent_seq,
        owner=owner,
        lease_until=lease_until,
        extra=from_json(extra) or {},
        generation=int(generation or 0),
    )


def claim_refused(row_owner: str | None, lease_until: float | None, owner: str, now: float,
                  force: bool) -> bool:
    """The claim rule shared by every backend (see `interlock._store._memory`)."""
    return (not force and row_owner not in (None, owner) and lease_until is not None
            and lease_until > now and not owner_gone(row_owner or ""))


def sqlite_error(path: Path, exc: sqlite3.Error, busy_ms: int,
                 what: str = "SQLite store") -> StoreError:
    """A `StoreError` for a SQLite error, saying what to do about the usual ones."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreError(
            f"{what} {path}: the database stayed locked by another process for {busy_ms} "
            f"ms ({text}) -- a long transaction, or the one-time upgrade of an older file "
            "(about 10 s per million records); try again, raise ?busy_timeout= or use "
            "PostgreSQL")
    if "readonly" in text:
        return StoreError(
            f"{what} {path}: the file is read-only ({text}); interlock needs write access "
            "to it and to its directory (for the -wal and -shm files beside it)")
    if disk_full(exc):
        return StoreError(
            f"{what} {path}: the disk is full ({text}); nothing of this write was stored. "
            "The store checkpoints its WAL into the file and truncates it to give that "
            "space back; free space on the disk (or move the store), and the write can be "
            "tried again")
    return StoreError(f"{what} {path}: {text}")


def disk_full(exc: sqlite3.Error) -> bool:
    """Whether SQLite failed for want of disk space (SQLITE_FULL: ENOSPC, a quota)."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL \
        or "database or disk is full" in str(exc)


def _reclaim_after_upgrade(conn: sqlite3.Connection, path: Path) -> None:
    """Give back the pages the upgrade freed (the version-1 tables): about a third of
    the file. A failure (no room for the copy VACUUM makes, a reader in the way) leaves
    the file as it is, with its free pages, and says so."""
    try:
        conn.execute("VACUUM")
    except sqlite3.Error as exc:
        logging.getLogger("interlock").warning(
            "the upgrade of %s left its old tables' pages free in the file; VACUUM failed "
            "(%s): run `sqlite3 %s VACUUM` to give them back", path, exc, path)


# -- reading records back ---------------------------------------------------------------

def stored_entry(seq: int, data: bytes, hash_: str) -> Entry:
    """An `Entry` read back from a store that keeps only a record's JSON and hash: its
    type and node are the JSON's (a record that is not a JSON object -- a tampered one --
    gets none, and `verify` reports it)."""
    try:
        rec = orjson.loads(data)
    except orjson.JSONDecodeError:
        rec = None
    if type(rec) is not dict:
        return Entry(seq, "", data, hash_, None)
    rtype, node = rec.get("type"), rec.get("node")
    return Entry(seq, rtype if type(rtype) is str else "", data, hash_,
                 node if type(node) is str else None)


def _as_bytes(value: Any) -> bytes:
    """A cell someone changed to another type, as bytes (verify then reports the record)."""
    return bytes(value) if isinstance(value, bytes | bytearray | memoryview) \
        else str(value).encode("utf-8")


# -- the upgrade from version 1 ------------------------------------------------------------

_V1_HASH = re.compile(r"[0-9a-f]{64}")


def _upgrade_from_1(conn: sqlite3.Connection, path: Path) -> None:
    """Rewrite a version-1 file's runs and records as version 2, inside the caller's
    transaction (a crash or an error leaves the file as it was).

    Runs get their keys in the order they were created; each record keeps its JSON text
    and its hash exactly. A record version 2 cannot hold as it was -- one of no run, a
    seq out of range, a hash that is not 64 lowercase hex digits, type or node columns
    that disagree with its JSON: a tampered file -- is copied as it was into
    ``v1_leftovers`` (with why) and named in a warning; its run's `verify` still fails
    (a record of no run or out of range is missing from its log, an odd hash is kept as
    bytes no digest matches), except for a changed type or node column, which version 2
    does not store: only the table and the warning keep that evidence. Snapshots are
    kept as they are.
    """
    (count,), = conn.execute("SELECT count(*) FROM records")
    log = logging.getLogger("interlock")
    log.warning("upgrading the store %s to schema version %d (%d records; about 10 s per "
                "million); interlock versions before it will not open it", path,
                SCHEMA_VERSION, count)
    conn.execute(_RUNS_TABLE.format(name="runs_v2"))
    row_columns = ", ".join(_RUN_NAMES[i] for i in _ROW_AT if _RUN_NAMES[i] != "generation")
    conn.execute(f"INSERT INTO runs_v2 ({row_columns}) SELECT {row_columns} FROM runs "
                 "ORDER BY created_at, run_id")
    conn.execute("CREATE TABLE run_specs (run_key INTEGER PRIMARY KEY, definition TEXT NOT "
                 "NULL, input TEXT NOT NULL, options TEXT NOT NULL)")
    conn.execute(f"INSERT INTO run_specs (run_key, {', '.join(_SPEC_COLUMNS)}) SELECT "
                 f"k.run_key, {', '.join('r.' + c for c in _SPEC_COLUMNS)} FROM runs r "
                 "JOIN runs_v2 k USING (run_id)")
    conn.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, data TEXT NOT NULL, "
                 "hash BLOB NOT NULL)")
    leftovers: list[tuple[Any, ...]] = []

    def entries() -> Iterator[tuple[int, Any, bytes]]:
        for run_id, key, seq, rtype, node, data, h in conn.execute(
                "SELECT r.run_id, k.run_key, r.seq, r.type, r.node, r.data, r.hash "
                "FROM records r LEFT JOIN runs_v2 k USING (run_id) ORDER BY k.run_key, r.seq"):
            fits = key is not None and type(seq) is int and 0 < seq <= SEQ_MASK
            why = _v1_oddity(key, seq, rtype, node, data, h) if fits else (
                "a record of no run" if key is None else f"seq {seq!r} out of range")
            if why:
                leftovers.append((run_id, seq, rtype, node, data, h, why))
            if fits:
                yield (key << SEQ_BITS) | seq, data, _v1_digest(h)

    conn.executemany(_INSERT_RECORD, entries())
    if leftovers:
        conn.execute("CREATE TABLE v1_leftovers (run_id, seq, type, node, data, hash, "
                     "why TEXT NOT NULL)")
        conn.executemany("INSERT INTO v1_leftovers VALUES (?, ?, ?, ?, ?, ?, ?)", leftovers)
        runs = sorted({str(r[0]) for r in leftovers})
        log.warning("%s: %d records did not fit schema version %d as they were (a changed "
                    "file?) -- of runs %s%s; they are kept as they were in its table "
                    "v1_leftovers, with why", path, len(leftovers), SCHEMA_VERSION,
                    ", ".join(runs[:10]), f" and {len(runs) - 10} more" if len(runs) > 10
                    else "")
    conn.execute("DROP TABLE records")
    conn.execute("DROP TABLE runs")  # and its indexes; the schema makes them again
    conn.execute("ALTER TABLE runs_v2 RENAME TO runs")


def _upgrade_from_2(conn: sqlite3.Connection, path: Path) -> None:
    """Version 3: the runs' claim generation, 0 for every run there (inside the caller's
    transaction; one ALTER TABLE, whatever the file's size)."""
    logging.getLogger("interlock").warning(
        "upgrading the store %s to schema version %d (the claims' generation); interlock "
        "versions before it will not open it", path, SCHEMA_VERSION)
    conn.execute("ALTER TABLE runs ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")


def _v1_oddity(key: int, seq: int, rtype: Any, node: Any, data: Any, h: Any) -> str | None:
    """Why a version-1 record's row is not what version 1 wrote, if it is not."""
    if not (type(h) is str and _V1_HASH.fullmatch(h)):
        return "its hash is not 64 lowercase hex digits"
    try:
        rec = orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError):
        return None  # the data itself: verify reports it
    if type(rec) is dict:
        own = rec.get("node")
        if rec.get("type") != rtype or (own if type(own) is str else None) != node:
            return "its type or node column does not match its JSON"
    return None


def _v1_digest(h: Any) -> bytes:
    """A version-1 hash as its 32 bytes; anything else as bytes no digest is (so the
    record's `verify` fails, as it did)."""
    if type(h) is str and _V1_HASH.fullmatch(h):
        return bytes.fromhex(h)
    return b"v1 hash: " + _as_bytes(h)


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

# a job: the loop that awaits it, its future, and what to run -- ``fn(*args)``, or, with
# ``fn`` None, a write ``(operation, args)`` that may share a transaction
_Job = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., Any] | None,
             tuple[Any, ...]]
_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


def _deliver(outcomes: list[_Outcome]) -> None:
    """On the event loop: hand jobs' outcomes to their awaiting coroutines (if still there)."""
    for fut, result, exc in outcomes:
        if fut.cancelled():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)


class _Writer:
    """A store's one thread: runs jobs in order, hands each outcome to the event loop
    that asked for it.

    Leaner than ``loop.run_in_executor`` on a one-thread pool (no concurrent future,
    no chained callbacks): a job is a queue entry; the outcomes of what one turn ran,
    one ``call_soon_threadsafe`` per event loop.

    Group commit: each turn takes every job queued by then; writes queued one after
    the other (appends, claims, new runs -- from concurrent runs, as a rule) go to
    ``batch`` together, which commits them in one transaction. So N runs writing while a
    commit is in progress share the next commit instead of paying N. One run alone finds
    one job per turn.

    The thread is a daemon so that a store nobody closed does not keep the process
    alive; at exit `_stop_writers` lets the jobs queued finish (a transaction in
    progress commits or rolls back as a whole), as a thread pool's worker would.
    """

    def __init__(self, name: str,
                 batch: Callable[[list[tuple[Any, ...]]], list[tuple[Any, BaseException | None]]]
                 ) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._stopped = False
        self._batch = batch
        self._last: Callable[[], None] | None = None  # run before the thread ends
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        _WRITERS.add(self)

    def submit(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any],
               fn: Callable[..., Any] | None, args: tuple[Any, ...]) -> None:
        with self._guard:
            if self._stopped:
                raise StoreError("the SQLite store was closed while this call was being made")
            self._jobs.put((loop, fut, fn, args))

    def close_with(self, last: Callable[[], None]) -> None:
        """Run ``last`` after the queued jobs, then end the thread, without waiting; the
        thread stays in `_WRITERS` until it ends, so that the process waits for it at
        exit."""
        with self._guard:
            if self._stopped:
                return
            self._stopped = True
            self._last = last
            self._jobs.put(None)

    def stop(self) -> None:
        """Let the queued jobs finish (a `close_with`'s last job too), then end the thread
        and wait for it (idempotent)."""
        _WRITERS.discard(self)
        with self._guard:
            if not self._stopped:
                self._stopped = True
                self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _main(self) -> None:
        jobs = self._jobs
        while True:
            turn: list[_Job | None] = [jobs.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    turn.append(jobs.get_nowait())
            i, n = 0, len(turn)
            while i < n:
                job = turn[i]
                if job is None:
                    self._end()
                    return
                outcomes: list[_Outcome]
                if job[2] is not None:  # one job on its own
                    i += 1
                    group = [job]
                    try:
                        outcomes = [(job[1], job[2](*job[3]), None)]
                    except BaseException as e:  # handed to the caller, as a thread pool does
                        outcomes = [(job[1], None, e)]
                else:  # the writes queued one after the other: one transaction
                    j = i
                    while j < n and (nxt := turn[j]) is not None and nxt[2] is None:
                        j += 1
                    group = turn[i:j]  # type: ignore[assignment]  # no None in it
                    i = j
                    done = self._batch([g[3] for g in group])
                    outcomes = [(g[1], result, exc)
                                for g, (result, exc) in zip(group, done, strict=True)]
                self._hand_back(group, outcomes)
                del job, group, outcomes

    def _end(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            try:
                last()
            except Exception:  # nobody waits for it: keep the reason in the log
                logging.getLogger("interlock").exception("closing the SQLite store failed")
            _WRITERS.discard(self)

    @staticmethod
    def _hand_back(group: list[_Job], outcomes: list[_Outcome]) -> None:
        loop = group[0][0]
        if all(g[0] is loop for g in group):
            by_loop = {loop: outcomes}
        else:  # one store, several event loops (threads of their own)
            by_loop = {}
            for g, outcome in zip(group, outcomes, strict=True):
                by_loop.setdefault(g[0], []).append(outcome)
        for lp, outs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                lp.call_soon_threadsafe(_deliver, outs)


class _Checkpointer:
    """Checkpoints a store's WAL on a thread and a connection of its own, when asked.

    ``PRAGMA wal_checkpoint(PASSIVE)`` copies what it can without waiting for (or
    blocking) the writer or any reader, so a commit never waits for a checkpoint's
    fsyncs. Requests coalesce: one that comes while a checkpoint runs starts the next.
    ``failed`` is set (and the thread ends) if the thread cannot do its work; the
    writer then turns SQLite's own checkpoints back on. A full disk is not such a
    failure: the checkpoint is tried again at the next request.
    """

    def __init__(self, path: Path, name: str) -> None:
        self._path = path
        self._wake = threading.Event()
        self._stopped = False
        self.failed: str | None = None
        self.ran = threading.Event()  # set after each checkpoint (for whoever waits on one)
        # started by the first request: a short-lived store (one short run) starts none
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def request(self) -> None:
        if not self._thread.is_alive() and not self._stopped:
            self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """End the thread, closing its connection (idempotent)."""
        self._stopped = True
        self._wake.set()
        if self._thread.ident is not None and threading.current_thread() is not self._thread:
            self._thread.join()

    def _main(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=0)
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopped:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    if not disk_full(exc):
                        raise
                    # (a full disk: the writer truncates the WAL when space comes back;
                    # this thread goes on with the next request)
                self.ran.set()
        except sqlite3.Error as exc:
            self.failed = str(exc) or type(exc).__name__
        finally:
            if conn is not None:
                conn.close()


_WRITERS: weakref.WeakSet[_Writer] = weakref.WeakSet()


@atexit.register
def _stop_writers() -> None:
    for writer in list(_WRITERS):
        writer.stop()


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


class SQLiteStore(Store):
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

    @staticmethod
    def _alone(conn: sqlite3.Connection, op: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        conn.execute("BEGIN IMMEDIATE")
        result = op(conn, *args)  # raises -> rollback in _run
        conn.execute("COMMIT")
        return result

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

    @staticmethod
    def _get_run(conn: sqlite3.Connection, run_id: str) -> RunRow:
        values = conn.execute(f"SELECT {_RUN_COLUMNS} FROM {_RUN_FROM} WHERE run_id = ?",
                              (run_id,)).fetchone()
        if values is None:
            raise RunNotFound(run_id)
        return row_from(values)

    @staticmethod
    def _entries(conn: sqlite3.Connection, run_id: str, after: int,
                 limit: int = -1) -> list[Entry]:
        found = conn.execute(_RUN_KEY, (run_id,)).fetchone()
        if found is None:
            raise RunNotFound(run_id)
        base = found[0] << SEQ_BITS
        rows = conn.execute(_READ_ENTRIES, (base | min(max(after, 0), SEQ_MASK), base | SEQ_MASK,
                                            limit))
        return [stored_entry(id_ & SEQ_MASK, data.encode("utf-8") if type(data) is str
                             else _as_bytes(data), h.hex() if type(h) is bytes else str(h))
                for id_, data, h in rows]

    @staticmethod
    def _list_page(conn: sqlite3.Connection, status: str | None, workflow: str | None,
                   limit: int, before: tuple[float, str] | None,
                   updated_after: float | None) -> list[RunRow]:
        sql, params = page_query("?", status, workflow, before, updated_after, limit)
        return [row_from(v) for v in conn.execute(sql, params)]

    @staticmethod
    def _list_runs(conn: sqlite3.Connection, status: str | None, workflow: str | None,
                   limit: int) -> list[RunRow]:
        where, params = [], []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if workflow is not None:
            where.append("workflow = ?")
            params.append(workflow)
        sql = f"SELECT {_RUN_COLUMNS} FROM {_RUN_FROM}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC LIMIT ?"
        return [row_from(v) for v in conn.execute(sql, (*params, limit))]

    @staticmethod
    def _claim(conn: sqlite3.Connection, run_id: str, owner: str, lease: float,
               force: bool) -> int:
        found = conn.execute("SELECT owner, lease_until FROM runs WHERE run_id = ?",
                             (run_id,)).fetchone()
        if found is None:
            raise RunNotFound(run_id)
        current, lease_until = found
        now = time.time()
        if claim_refused(current, lease_until, owner, now, force):
            raise ClaimError(run_id, current, lease_until - now)
        (generation,), = conn.execute(
            "UPDATE runs SET owner = ?, lease_until = ?, generation = generation + 1 "
            "WHERE run_id = ? RETURNING generation", (owner, now + lease, run_id)).fetchall()
        return int(generation)

    @staticmethod
    def _runnable(conn: sqlite3.Connection, workflows: list[str] | None,
                  exclude: list[str]) -> str | None:
        """The oldest run `claim_next` may claim (a read: no write lock is taken)."""
        now = time.time()
        sql = (f"SELECT run_id FROM {_RUN_FROM} WHERE (status IN "
               f"({', '.join('?' * len(RUNNABLE))}) OR (status = 'WAITING_APPROVAL' AND "
               "json_extract(waiting, '$.deadline') <= ?)) "
               "AND (owner IS NULL OR lease_until IS NULL OR lease_until <= ?) "
               "AND json_extract(options, '$.parent') IS NULL")
        params: list[Any] = [*RUNNABLE, now, now]
        if workflows is not None:
            sql += f" AND workflow IN ({', '.join('?' * len(workflows))})"
            params += workflows
        if exclude:
            sql += f" AND run_id NOT IN ({', '.join('?' * len(exclude))})"
            params += exclude
        found = conn.execute(sql + " ORDER BY created_at LIMIT 1", params).fetchone()
        return None if found is None else str(found[0])

    @classmethod
    def _claim_next(cls, conn: sqlite3.Connection, owner: str, lease: float,
                    workflows: list[str] | None, exclude: list[str]) -> str | None:
        # in the writer's transaction (BEGIN IMMEDIATE: the file's one write lock), so the
        # run found is still free when it is claimed -- a compare-and-set across processes
        run_id = cls._runnable(conn, workflows, exclude)
        if run_id is not None:
            conn.execute("UPDATE runs SET owner = ?, lease_until = ?, "
                         "generation = generation + 1 WHERE run_id = ?",
                         (owner, time.time() + lease, run_id))
        return run_id

    @staticmethod
    def _heartbeat(conn: sqlite3.Connection, run_id: str, owner: str, lease: float,
                   generation: int | None = None) -> None:
        cur = conn.execute("UPDATE runs SET lease_until = ? WHERE run_id = ? AND owner = ? "
                           "AND (?4 IS NULL OR generation = ?4)",
                           (time.time() + lease, run_id, owner, generation))
        if cur.rowcount == 1:
            return
        found = conn.execute("SELECT owner, generation FROM runs WHERE run_id = ?",
                             (run_id,)).fetchone()
        if found is None:
            raise RunNotFound(run_id)
        raise ClaimLost(run_id, found[0], found[1], generation)

    @staticmethod
    def _release(conn: sqlite3.Connection, run_id: str, owner: str) -> None:
        cur = conn.execute("UPDATE runs SET owner = NULL, lease_until = NULL "
                           "WHERE run_id = ? AND owner = ?", (run_id, owner))
        if cur.rowcount == 0 and conn.execute("SELECT 1 FROM runs WHERE run_id = ?",
                                              (run_id,)).fetchone() is None:
            raise RunNotFound(run_id)

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

    @staticmethod
    def _request_cancel(conn: sqlite3.Connection, run_id: str, by: str | None) -> None:
        cur = conn.execute("UPDATE runs SET extra = json_set(extra, '$.cancel', json(?)) "
                           "WHERE run_id = ?", (json_text({"by": by, "at": time.time()}), run_id))
        if cur.rowcount != 1:
            raise RunNotFound(run_id)

    @staticmethod
    def _cancel_requested(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
        row = conn.execute("SELECT json_extract(extra, '$.cancel') FROM runs WHERE run_id = ?",
                           (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        value = from_json(row[0])
        return dict(value) if isinstance(value, dict) else None

    async def request_cancel(self, run_id: str, by: str | None) -> None:
        if self._absent():
            raise RunNotFound(run_id)
        await self._write(self._request_cancel, run_id, by)

    @staticmethod
    def _save_snapshot(conn: sqlite3.Connection, run_id: str, seq: int, data: bytes) -> None:
        conn.execute("INSERT INTO snapshots (run_id, seq, data) VALUES (?, ?, ?) "
                     "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, "
                     "data = excluded.data WHERE excluded.seq > snapshots.seq",
                     (run_id, seq, data))

    @staticmethod
    def _load_snapshot(conn: sqlite3.Connection, run_id: str) -> tuple[int, bytes] | None:
        row = conn.execute("SELECT seq, data FROM snapshots WHERE run_id = ?",
                           (run_id,)).fetchone()
        return (int(row[0]), bytes(row[1])) if row is not None else None

    async def save_snapshot(self, run_id: str, seq: int, data: bytes) -> None:
        await self._write(self._save_snapshot, run_id, seq, data)

    @staticmethod
    def _get_cursor(conn: sqlite3.Connection, name: str) -> str | None:
        row = conn.execute("SELECT value FROM cursors WHERE name = ?", (name,)).fetchone()
        return str(row[0]) if row is not None else None

    @staticmethod
    def _set_cursor(conn: sqlite3.Connection, name: str, value: str) -> None:
        conn.execute("INSERT INTO cursors (name, value, updated_at) VALUES (?, ?, ?) "
                     "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                     "updated_at = excluded.updated_at", (name, value, time.time()))

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

    @staticmethod
    def _delete_finished(conn: sqlite3.Connection, run_ids: list[str]
                         ) -> tuple[list[str], int]:
        marks = ", ".join("?" * len(FINISHED))
        conn.execute("BEGIN IMMEDIATE")
        try:
            deleted, records = [], 0
            for run_id in run_ids:
                gone = conn.execute(f"DELETE FROM runs WHERE run_id = ? AND status IN ({marks}) "
                                    "AND owner IS NULL RETURNING run_key",
                                    (run_id, *FINISHED)).fetchall()
                if not gone:
                    continue  # resumed (or claimed) meanwhile, or gone
                (key,), = gone
                records += conn.execute(
                    f"DELETE FROM entries WHERE id {_RUN_ENTRIES.format(key='?')}",
                    (key, key)).rowcount
                conn.execute("DELETE FROM run_specs WHERE run_key = ?", (key,))
                conn.execute("DELETE FROM snapshots WHERE run_id = ?", (run_id,))
                deleted.append(run_id)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return deleted, records

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
