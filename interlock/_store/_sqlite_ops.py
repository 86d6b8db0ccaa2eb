"""The SQLite store's operations on a connection: each read and each write as the
statements it runs and what it makes of their rows (a run, its entries, a page of runs,
a claim, a heartbeat, a release, a cancel request, a snapshot, a cursor, the pruning of
finished runs). Static, so that they run on any connection: the writer thread's inside
the transaction it opens (`SQLiteStore` inherits them), the lease keeper's own."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .._json import JSONObject
from .._log import Entry
from . import _sqlite_search
from ._base import FINISHED, RUNNABLE, ClaimError, ClaimLost, RunNotFound, RunRow
from ._rows import (
    _RUN_COLUMNS,
    _as_bytes,
    claim_refused,
    from_json,
    json_text,
    list_query,
    page_query,
    row_from,
    stored_entry,
)
from ._sqlite_sql import _READ_ENTRIES, _RUN_ENTRIES, _RUN_FROM, _RUN_KEY, SEQ_BITS, SEQ_MASK

T = TypeVar("T")


class SQLiteOps:
    """`SQLiteStore`'s operations on a connection (see the module)."""

    @staticmethod
    def _alone(conn: sqlite3.Connection, op: Callable[..., T], args: tuple[object, ...]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        result = op(conn, *args)  # raises -> rollback in _run
        conn.execute("COMMIT")
        return result

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
        sql, params = list_query("?", _RUN_FROM, status, workflow, limit)
        return [row_from(v) for v in conn.execute(sql, params)]

    @staticmethod
    def _claim(conn: sqlite3.Connection, run_id: str, owner: str, lease: float,
               force: bool) -> int:
        found = conn.execute("SELECT owner, lease_until FROM runs WHERE run_id = ?",
                             (run_id,)).fetchone()
        if found is None:
            raise RunNotFound(run_id)
        # in the writer's transaction (BEGIN IMMEDIATE: the file's one write lock), so the
        # owner read here is still the owner when the row is updated: a compare-and-set
        current, lease_until = found
        now = time.time()
        if claim_refused(current, lease_until, owner, now, force):
            raise ClaimError(run_id, current, lease_until - now)
        # every claim bumps the generation, the same owner's again too: appends and
        # heartbeats are fenced by the generation a claim returned, not by the owner's
        # name, so nothing an earlier claim's executor still does is stored
        (generation,), = conn.execute(
            "UPDATE runs SET owner = ?, lease_until = ?, generation = generation + 1 "
            "WHERE run_id = ? RETURNING generation", (owner, now + lease, run_id)).fetchall()
        return int(generation)

    @staticmethod
    def _runnable(conn: sqlite3.Connection, workflows: list[str] | None,
                  exclude: list[str]) -> str | None:
        """The oldest run `claim_next` may claim (a read: no write lock is taken): a
        `RUNNABLE` one, or one waiting at a gate whose deadline passed or beside branches
        still to run (``waiting.running``: its executor is gone)."""
        now = time.time()
        sql = (f"SELECT run_id FROM {_RUN_FROM} WHERE (status IN "
               f"({', '.join('?' * len(RUNNABLE))}) OR (status = 'WAITING_APPROVAL' AND "
               "(json_extract(waiting, '$.deadline') <= ? "
               "OR json_type(waiting, '$.running') IS NOT NULL))) "
               "AND (owner IS NULL OR lease_until IS NULL OR lease_until <= ?) "
               "AND json_extract(options, '$.parent') IS NULL")
        params: list[str | float] = [*RUNNABLE, now, now]
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

    @staticmethod
    def _request_cancel(conn: sqlite3.Connection, run_id: str, by: str | None) -> None:
        cur = conn.execute("UPDATE runs SET extra = json_set(extra, '$.cancel', json(?)) "
                           "WHERE run_id = ?", (json_text({"by": by, "at": time.time()}), run_id))
        if cur.rowcount != 1:
            raise RunNotFound(run_id)

    @staticmethod
    def _cancel_requested(conn: sqlite3.Connection, run_id: str) -> JSONObject | None:
        row = conn.execute("SELECT json_extract(extra, '$.cancel') FROM runs WHERE run_id = ?",
                           (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        value = from_json(row[0])
        return dict(value) if isinstance(value, dict) else None

    @staticmethod
    def _offer_decision(conn: sqlite3.Connection, run_id: str, gate: str,
                        decision: dict[str, Any]) -> dict[str, Any] | None:
        # (in the writer's BEGIN IMMEDIATE transaction: the read and the write are one)
        row = conn.execute("SELECT json_extract(extra, '$.decisions') FROM runs "
                           "WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        kept = from_json(row[0]) if row[0] is not None else {}
        if isinstance(kept, dict) and gate in kept:
            return dict(kept[gate])
        kept = dict(kept) if isinstance(kept, dict) else {}
        kept[gate] = decision
        conn.execute("UPDATE runs SET extra = json_set(extra, '$.decisions', json(?)) "
                     "WHERE run_id = ?", (json_text(kept), run_id))
        return None

    @staticmethod
    def _decisions(conn: sqlite3.Connection, run_id: str) -> dict[str, dict[str, Any]]:
        row = conn.execute("SELECT json_extract(extra, '$.decisions') FROM runs "
                           "WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        kept = from_json(row[0]) if row[0] is not None else None
        return {k: dict(v) for k, v in kept.items()} if isinstance(kept, dict) else {}

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

    @staticmethod
    def _get_cursor(conn: sqlite3.Connection, name: str) -> str | None:
        row = conn.execute("SELECT value FROM cursors WHERE name = ?", (name,)).fetchone()
        return str(row[0]) if row is not None else None

    @staticmethod
    def _set_cursor(conn: sqlite3.Connection, name: str, value: str) -> None:
        conn.execute("INSERT INTO cursors (name, value, updated_at) VALUES (?, ?, ?) "
                     "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                     "updated_at = excluded.updated_at", (name, value, time.time()))

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
                _sqlite_search.forget(conn, key)
                deleted.append(run_id)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return deleted, records
