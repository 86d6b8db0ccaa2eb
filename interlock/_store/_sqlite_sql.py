"""The SQLite store's file layout and the statements it runs: schema version 3 (see
`interlock._store._sqlite`), a run's records as a range of entry ids, the prepared
SQL of appends, new runs and reads -- and what SQLite's errors mean to a user."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ._base import StoreError
from ._rows import _RUN_NAMES, _SPEC_COLUMNS

SCHEMA_VERSION = 3

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
_ROW_AT = [i for i, c in enumerate(_RUN_NAMES) if c not in _SPEC_COLUMNS]
_SPEC_AT = [_RUN_NAMES.index(c) for c in _SPEC_COLUMNS]
_RUN_FROM = "runs JOIN run_specs USING (run_key)"
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


# -- errors ------------------------------------------------------------------------------

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
