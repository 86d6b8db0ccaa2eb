"""The SQLite store's schema upgrades, made in place when an older file is opened:
version 1 to 2 (records as rows of their JSON and hash, run specs apart) and 2 to 3
(the claims' generation)."""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ._rows import _RUN_NAMES, _SPEC_COLUMNS, _as_bytes
from ._sqlite_sql import (
    _INSERT_RECORD,
    _ROW_AT,
    _RUNS_TABLE,
    SCHEMA_VERSION,
    SEQ_BITS,
    SEQ_MASK,
)


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
    leftovers: list[tuple[object, ...]] = []

    def entries() -> Iterator[tuple[int, object, bytes]]:
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


def _v1_oddity(key: int, seq: int, rtype: object, node: object, data: Any, h: object
               ) -> str | None:
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


def _v1_digest(h: object) -> bytes:
    """A version-1 hash as its 32 bytes; anything else as bytes no digest is (so the
    record's `verify` fails, as it did)."""
    if type(h) is str and _V1_HASH.fullmatch(h):
        return bytes.fromhex(h)
    return b"v1 hash: " + _as_bytes(h)
