"""The PostgreSQL store's ``LISTEN``: an append wakes the waiters of the run it grew
(`Store.wait_changed`), a turn of appends too many to name in a payload wakes every
waiter, and a ``LISTEN`` connection lost is opened again, waking every waiter for what
was committed while nobody listened (issue 34). Each waiter's timeout stands for the
slow poll: it is long, so a waiter that returns was woken."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from test_store_conformance import log, new_row, pg_schema_url, summary_of  # noqa: F401

import interlock
from interlock._log import LogWriter
from interlock._store._postgres import PostgresStore
from interlock._store._postgres_listen import Conn, Listener

SLOW_POLL = 60.0  # a waiter's timeout: far longer than the test's own `WOKEN`
WOKEN = 20.0  # a waiter not woken by then fails the test


async def _grow(store: PostgresStore, run_id: str, w: LogWriter) -> LogWriter:
    w, batch = log(2, w)
    await store.append(run_id, batch, summary_of(w))
    return w


async def _stores(url: str) -> tuple[PostgresStore, PostgresStore]:
    """A store that waits (``ears``) and one that writes (``hands``, as another process
    would: its own connections), with ``ears`` listening."""
    ears, hands = interlock.open_store(url), interlock.open_store(url)
    assert isinstance(ears, PostgresStore) and isinstance(hands, PostgresStore)
    await ears.wait_changed(0.0)  # starts listening
    await ears._listener().listening.wait()
    return ears, hands


def test_an_append_wakes_the_waiters_of_its_run_only(pg_schema_url: str) -> None:  # noqa: F811
    async def main() -> None:
        ears, hands = await _stores(pg_schema_url)
        try:
            (a, wa, ea), (b, wb, eb) = new_row(), new_row()
            await hands.create_run(a, ea)
            await hands.create_run(b, eb)
            seen = await ears.wait_changed(0.0, None, a.run_id)
            on_a = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, seen, a.run_id))
            await _grow(hands, b.run_id, wb)
            on_b = await asyncio.wait_for(ears.wait_changed(SLOW_POLL, seen, b.run_id), WOKEN)
            assert on_b > seen  # b's append was heard ...
            assert not ears._listener()._changed_since(a.run_id, seen)  # ... as b's only
            assert not on_a.done()
            await _grow(hands, a.run_id, wa)
            on_a_now = await asyncio.wait_for(on_a, WOKEN)
            assert on_a_now > on_b
            # heard while nobody waited on a: a wait from the count seen before returns
            # at once (nothing else would wake it)
            await _grow(hands, a.run_id, wa)
            now = await asyncio.wait_for(ears.wait_changed(SLOW_POLL, on_a_now), WOKEN)
            assert await asyncio.wait_for(ears.wait_changed(SLOW_POLL, on_a_now, a.run_id),
                                          WOKEN) == now
        finally:
            await ears.close()
            await hands.close()

    asyncio.run(main())


def test_a_turn_too_many_runs_to_name_wakes_every_waiter(pg_schema_url: str) -> None:  # noqa: F811
    """70 appends of runs with 120-character ids in one group commit: their names do not
    fit in a notification's payload (8,000 bytes), so it names none -- the appends are
    stored, and a waiter on any run, even another one, is woken."""
    async def main() -> None:
        ears, hands = await _stores(pg_schema_url)
        try:
            rows = [new_row(f"long-{i:03d}-" + "x" * 111) for i in range(70)]
            for row, _, entries in rows:
                await hands.create_run(row, entries)
            seen = await ears.wait_changed(0.0)
            elsewhere = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, seen, "elsewhere"))
            await asyncio.gather(*(_grow(hands, row.run_id, w) for row, w, _ in rows))
            assert await asyncio.wait_for(elsewhere, WOKEN) > seen
            for row, _, _ in rows:
                assert len(await hands.entries(row.run_id)) == 4
        finally:
            await ears.close()
            await hands.close()

    asyncio.run(main())


def test_a_lost_listen_connection_listens_again_and_wakes_every_waiter(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The server terminates the LISTEN connection; an append committed before it listens
    again is told to no one, so once it listens again every waiter is woken (and looks)."""
    async def main() -> None:
        ears, hands = await _stores(pg_schema_url)
        listener = ears._listener()
        asked, go = asyncio.Event(), asyncio.Event()
        connect = listener._connect

        async def held() -> Conn:  # the second connection waits for the test's go
            asked.set()
            await go.wait()
            return await connect()

        monkeypatch.setattr(listener, "_connect", held)
        try:
            row, w, entries = new_row()
            await hands.create_run(row, entries)
            seen = await ears.wait_changed(0.0, None, row.run_id)
            async with await psycopg.AsyncConnection.connect(pg_schema_url,
                                                             autocommit=True) as admin:
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN interlock_records%'")
            await asyncio.wait_for(asked.wait(), WOKEN)  # it found the connection lost
            await _grow(hands, row.run_id, w)  # committed while nobody listens
            waiting = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, seen, row.run_id))
            go.set()
            assert await asyncio.wait_for(waiting, WOKEN) > seen
            assert listener.connections == 2
        finally:
            await ears.close()
            await hands.close()

    asyncio.run(main())


def test_an_idle_worker_is_woken_through_the_shared_listener(pg_schema_url: str) -> None:  # noqa: F811
    """`wait_runnable` waits on the same connection: a detached run recorded elsewhere
    wakes it, and one recorded while it was not waiting makes its next wait return."""
    async def main() -> None:
        ears, hands = await _stores(pg_schema_url)
        try:
            await ears.wait_runnable(0.0)  # what came before the first wait: seen
            waiting = asyncio.ensure_future(ears.wait_runnable(SLOW_POLL))
            row, _, entries = new_row(status="PENDING")
            await hands.create_run(row, entries)
            await asyncio.wait_for(waiting, WOKEN)
            row, _, entries = new_row(status="PENDING")
            await hands.create_run(row, entries)
            await asyncio.wait_for(ears.wait_runnable(SLOW_POLL), WOKEN)
            assert isinstance(ears._listener(), Listener)
        finally:
            await ears.close()
            await hands.close()

    asyncio.run(main())
