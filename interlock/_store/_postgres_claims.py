"""The PostgreSQL store's claims on runs: a claim as one compare-and-set (a holder found
dead on this host taken over by a second), the queue's next runnable run, heartbeats,
releases; and the lease keeper's renewals on a blocking connection of its own
(`_Renewer`).

The fencing rule a maintainer must keep: every claim bumps the run's ``generation``
(in the SQL, `interlock._store._postgres_sql`), and whoever acts under a claim -- a
heartbeat, a renewal, an append (`interlock._store._postgres_writes`) -- names the
generation it holds, so that once another executor has claimed the run, nothing the old
one does is stored: it learns `ClaimLost` instead. Lease times are the database server's
clock (``now()``), never this process's, so that hosts whose clocks differ agree on when
a lease has run out.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from ._base import (
    RUNNABLE,
    Claim,
    ClaimError,
    ClaimLost,
    LeaseRenewer,
    RunNotFound,
    StoreError,
    owner_gone,
)
from ._postgres_conn import Conn, PostgresConnections, redact
from ._postgres_sql import (
    _CLAIM,
    _CLAIM_NEXT,
    _HEARTBEAT,
    _NOW,
    _TAKE_OVER,
    RUNNABLE_CHANNEL,
)


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


class PostgresClaims(PostgresConnections):
    """`PostgresStore`'s claims and leases (see the module)."""

    async def claim(self, run_id: str, owner: str, lease: float, *,
                    force: bool = False) -> int:
        params: dict[str, object] = {"run": run_id, "owner": owner, "lease": lease, "force": force}

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

    async def release(self, run_id: str, owner: str) -> None:
        async def op(conn: Conn) -> None:
            cur = await conn.execute(
                "UPDATE runs SET owner = NULL, lease_until = NULL WHERE run_id = %s "
                "AND owner = %s RETURNING status, waiting", (run_id, owner))
            released = await cur.fetchone()
            if released is not None:
                # unfinished, or recorded for a worker (also beside a waiting gate)
                if released[0] in RUNNABLE or '"running"' in (released[1] or ""):
                    await conn.execute("SELECT pg_notify(%s, '')", (RUNNABLE_CHANNEL,))
                return
            cur = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
            if await cur.fetchone() is None:
                raise RunNotFound(run_id)

        await self._do(op)

