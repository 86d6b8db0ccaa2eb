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

from typing import Any

from .._json import JSONObject
from .._log import Entry
from . import _postgres_search
from ._base import (
    FINISHED,
    RunNotFound,
    RunRow,
    Store,
)
from ._postgres_claims import PostgresClaims
from ._postgres_conn import Conn
from ._postgres_sql import _NOW
from ._postgres_writes import PostgresWrites
from ._rows import (
    _RUN_COLUMNS,
    json_text,
    list_query,
    page_query,
    row_from,
)
from ._search import Found


class PostgresStore(PostgresWrites, PostgresClaims, Store):
    """The store in a PostgreSQL database (see the module): its connections
    (`interlock._store._postgres_conn`), writes (`interlock._store._postgres_writes`) and
    claims (`interlock._store._postgres_claims`) in parts of their own; its reads, cancel
    requests, snapshots, cursors and pruning here."""

    leases_in_writes = True
    fences_appends = True

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

    async def leases(self) -> list[dict[str, Any]]:
        async def op(conn: Conn) -> list[dict[str, Any]]:
            cur = await conn.execute(
                "SELECT run_id, workflow, status, owner, lease_until FROM runs WHERE owner "
                'IS NOT NULL ORDER BY owner COLLATE "C", run_id COLLATE "C"')
            return [{"run_id": r, "workflow": w, "status": s, "owner": o, "lease_until": u}
                    for r, w, s, o, u in await cur.fetchall()]

        return await self._do(op, idempotent=True)

    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[RunRow]:
        sql, params = list_query("%s", "runs", status, workflow, limit)

        async def op(conn: Conn) -> list[RunRow]:
            cur = await conn.execute(sql, params)
            return [row_from(v) for v in await cur.fetchall()]

        return await self._do(op, idempotent=True)

    async def request_cancel(self, run_id: str, by: str | None) -> None:
        async def op(conn: Conn) -> None:
            cur = await conn.execute(
                "UPDATE runs SET extra = (extra::jsonb || jsonb_build_object('cancel', "
                f"jsonb_build_object('by', %s::text, 'at', {_NOW})))::text "
                "WHERE run_id = %s RETURNING 1", (by, run_id))
            if await cur.fetchone() is None:
                raise RunNotFound(run_id)

        await self._do(op)

    async def cancel_requested(self, run_id: str) -> JSONObject | None:
        async def op(conn: Conn) -> JSONObject | None:
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

    # -- pruning ---------------------------------------------------------------------

    async def search_messages(self, workflow: str, query: str, *, limit: int = 5,
                              exclude: str | None = None) -> list[Found]:
        from ._search import words

        wanted = words(query)
        if not wanted:
            return []

        async def op(conn: Conn) -> list[Found]:
            return await _postgres_search.search(conn, workflow, wanted, limit, exclude)

        return await self._do(op)

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
                if deleted:
                    await _postgres_search.forget(conn, deleted)
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

