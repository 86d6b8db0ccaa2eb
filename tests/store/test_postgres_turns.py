"""The PostgreSQL store's group commit (its turns): a turn whose commit fails fails every
write in it with the store's error and leaves nothing of them stored; two turns are
committed at once, on two connections, so one held does not hold the other back."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from test_store_conformance import log, new_row, pg_schema_url, summary_of  # noqa: F401

import interlock
from interlock._store import StoreError
from interlock._store import _postgres_writes as writes
from interlock._store._postgres import PostgresStore
from interlock._store._postgres_listen import Conn
from interlock._store._postgres_sql import _APPEND_MANY

WOKEN = 20.0  # a write not done by then fails the test


class _Held:
    """A connection whose turn of appends with `_Hold`'s run stops between its statement
    and its commit (the first such turn)."""

    def __init__(self, conn: Conn, hold: _Hold) -> None:
        self._conn, self._hold = conn, hold

    def transaction(self) -> Any:
        return self._conn.transaction()

    async def execute(self, sql: Any, params: Any = None) -> Any:
        cur = await self._conn.execute(sql, params)
        if (sql is _APPEND_MANY and not self._hold.stored.is_set()
                and self._hold.run_id in params["b_run"]):
            self._hold.pid = self._conn.info.backend_pid
            self._hold.stored.set()
            await self._hold.commit.wait()
        return cur


class _Hold:
    """Holds the first turn of appends of ``store`` with an append of ``run_id`` before
    its commit (``stored`` set) until ``commit`` is set."""

    def __init__(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stored, self.commit = asyncio.Event(), asyncio.Event()
        self.run_id = ""  # (set by the test)
        self.pid = 0
        inner = store._do

        async def held_do(op: Any, **kw: Any) -> Any:
            return await inner(lambda conn: op(_Held(conn, self)), **kw)

        monkeypatch.setattr(store, "_do", held_do)


async def _made(store: PostgresStore, count: int) -> list[tuple[Any, Any, Any]]:
    made = [new_row() for _ in range(count)]
    for row, _, entries in made:
        await store.create_run(row, entries)
    return made


def test_a_turn_whose_commit_fails_fails_every_append_in_it_and_stores_nothing(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The connection of a turn of three appends is terminated by the server between its
    statement and its commit: each caller gets the store's error (the connection lost: a
    write may or may not have been stored), nothing of any of them is stored, and each
    append tried again is stored once."""
    async def main() -> None:
        store = interlock.open_store(pg_schema_url)
        assert isinstance(store, PostgresStore)
        hold = _Hold(store, monkeypatch)
        try:
            made = await _made(store, 3)
            more = [log(2, w) for _, w, _ in made]
            hold.run_id = made[0][0].run_id
            appending = asyncio.gather(
                *(store.append(row.run_id, batch, summary_of(w))
                  for (row, _, _), (w, batch) in zip(made, more, strict=True)),
                return_exceptions=True)
            await asyncio.wait_for(hold.stored.wait(), WOKEN)
            async with await psycopg.AsyncConnection.connect(pg_schema_url,
                                                             autocommit=True) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", (hold.pid,))
            hold.commit.set()
            outcomes = await asyncio.wait_for(appending, WOKEN)
            assert all(isinstance(o, StoreError) for o in outcomes), outcomes
            assert len({str(o) for o in outcomes}) == 1
            assert "connection was lost" in str(outcomes[0])
            monkeypatch.undo()
            for (row, _, entries), _ in zip(made, more, strict=True):
                assert await store.entries(row.run_id) == entries  # nothing half-written
                assert (await store.get_run(row.run_id)).summary.last_seq == len(entries)
            await asyncio.gather(*(store.append(row.run_id, batch, summary_of(w))
                                   for (row, _, _), (w, batch) in zip(made, more,
                                                                      strict=True)))
            for (row, _, entries), (_, batch) in zip(made, more, strict=True):
                assert await store.entries(row.run_id) == entries + batch
        finally:
            hold.commit.set()  # (a test failing must not hang)
            await store.close()

    asyncio.run(main())


def test_a_turn_commits_while_another_is_held_before_its_commit(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Four runs' appends queued together are two turns (`SPLIT` made 1 here), committed
    at once on two connections: while the first is held before its commit, the second is
    stored and its callers return; then the first commits too."""
    monkeypatch.setattr(writes, "SPLIT", 1)

    async def main() -> None:
        store = interlock.open_store(pg_schema_url)
        assert isinstance(store, PostgresStore)
        hold = _Hold(store, monkeypatch)
        try:
            made = await _made(store, 4)
            more = [log(2, w) for _, w, _ in made]
            hold.run_id = made[0][0].run_id  # (its turn: the first two runs')
            appends = [asyncio.ensure_future(store.append(row.run_id, batch, summary_of(w)))
                       for (row, _, _), (w, batch) in zip(made, more, strict=True)]
            await asyncio.wait_for(hold.stored.wait(), WOKEN)
            await asyncio.wait_for(asyncio.gather(*appends[2:]), WOKEN)  # the second turn
            assert not any(a.done() for a in appends[:2])  # the first: held
            reader = interlock.open_store(pg_schema_url)
            try:
                for (row, _, entries), (_, batch) in zip(made, more, strict=True):
                    stored = await reader.entries(row.run_id)
                    assert stored == entries + (batch if row is not made[0][0]
                                                and row is not made[1][0] else [])
            finally:
                await reader.close()
            hold.commit.set()
            await asyncio.wait_for(asyncio.gather(*appends[:2]), WOKEN)
            for (row, _, entries), (_, batch) in zip(made, more, strict=True):
                assert await store.entries(row.run_id) == entries + batch
        finally:
            hold.commit.set()  # (a test failing must not hang)
            await store.close()

    asyncio.run(main())
