"""The PostgreSQL store's ``LISTEN``: an append wakes the waiters of the run it grew
(`Store.wait_changed`), a turn of appends too many to name in a payload wakes every
waiter, and a ``LISTEN`` connection lost is opened again, waking every waiter for what
was committed while nobody listened (issue 34). Each waiter's timeout stands for the
slow poll: it is long, so a waiter that returns was woken."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from test_store_conformance import log, new_row, pg_schema_url, summary_of  # noqa: F401

import interlock
from interlock._log import LogWriter
from interlock._store import _postgres_listen
from interlock._store._postgres import PostgresStore
from interlock._store._postgres_listen import Conn, Listener
from interlock._store._postgres_sql import _APPEND_MANY, RECORDS_CHANNEL

SLOW_POLL = 60.0  # a waiter's timeout: far longer than the test's own `WOKEN`
WOKEN = 20.0  # a waiter not woken by then fails the test


async def _grow(store: interlock.Store, run_id: str, w: LogWriter) -> LogWriter:
    w, batch = log(2, w)
    await store.append(run_id, batch, summary_of(w))
    return w


async def _stores(url: str, grace: tuple[float, ...] = ()
                  ) -> tuple[PostgresStore, PostgresStore]:
    """A store that waits (``ears``) and one that writes (``hands``, as another process
    would: its own connections), with ``ears`` listening and announced (with no wake
    of every waiter after its announcement unless ``grace`` says when: a waiter woken is
    one told of its run)."""
    ears, hands = interlock.open_store(url), interlock.open_store(url)
    assert isinstance(ears, PostgresStore) and isinstance(hands, PostgresStore)
    ears._listener().grace = grace
    await ears.wait_changed(0.0)  # starts listening, and announcing it
    await ears._listener().listening.wait()
    await ears._listener().present.wait()
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
    """70 appends of runs with 250-character ids in group commits (at most two turns, of
    35 or more): their names do not fit in a notification's payload (8,000 bytes), so it
    names none -- the appends are stored, and a waiter on any run, even another one, is
    woken."""
    async def main() -> None:
        ears, hands = await _stores(pg_schema_url)
        try:
            rows = [new_row(f"long-{i:03d}-" + "x" * 241) for i in range(70)]
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


# -- appends notify only while a listener has announced itself -------------------------


async def _first_told(conn: psycopg.AsyncConnection[Any], runs: set[str]) -> set[str]:
    """Of ``runs``, those named by the first notification on `RECORDS_CHANNEL` naming
    any (an empty payload names all)."""
    async for note in conn.notifies(timeout=WOKEN):
        named = set(note.payload.split(" ")) if note.payload else runs
        if named & runs:
            return named & runs
    raise AssertionError(f"no notification of {sorted(runs)} within {WOKEN} s")


async def _ear(url: str) -> psycopg.AsyncConnection[Any]:
    """A bare ``LISTEN`` connection: it hears what is notified, announcing nothing."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(f"LISTEN {RECORDS_CHANNEL}")
    return conn


def test_with_nobody_listening_an_append_notifies_nothing(pg_schema_url: str) -> None:  # noqa: F811
    """A notifying commit takes a lock that serialises every notifying commit of the
    cluster: with no listener announced an append notifies nothing; once one is, it does
    (notifications arrive in commit order, so the first heard is the second append's)."""
    async def main() -> None:
        hands = interlock.open_store(pg_schema_url)
        ear = await _ear(pg_schema_url)
        try:
            (a, wa, ea), (b, wb, eb) = new_row(), new_row()
            await hands.create_run(a, ea)
            await hands.create_run(b, eb)
            await _grow(hands, a.run_id, wa)  # nobody announced: told to no one
            ears, other = await _stores(pg_schema_url)
            await _grow(hands, b.run_id, wb)
            assert await _first_told(ear, {a.run_id, b.run_id}) == {b.run_id}
            await ears.close()
            await other.close()
        finally:
            await ear.close()
            await hands.close()

    asyncio.run(main())


class _Held:
    """A connection whose turn of appends stops between its statement and its commit."""

    def __init__(self, conn: Conn, stored: asyncio.Event, commit: asyncio.Event) -> None:
        self._conn, self._stored, self._commit = conn, stored, commit

    def transaction(self) -> Any:
        return self._conn.transaction()

    async def execute(self, sql: Any, params: Any = None) -> Any:
        cur = await self._conn.execute(sql, params)
        if sql is _APPEND_MANY:
            self._stored.set()
            await self._commit.wait()
        return cur


def test_an_append_that_read_nobody_but_commits_after_the_announcement_is_not_missed(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The race of a listener that appears: a turn of appends has read "nobody listens"
    (so it notifies nothing) but commits only after a server's stream announced itself and
    read the run. The wake of every waiter `GRACE` after the announcement makes the stream
    read again and find them (without it, only the slow poll would)."""
    async def main() -> None:
        ears = interlock.open_store(pg_schema_url)
        hands = interlock.open_store(pg_schema_url)
        assert isinstance(ears, PostgresStore) and isinstance(hands, PostgresStore)
        listener = ears._listener()
        listener.grace = (0.5,)
        grace_due, grace_go = asyncio.Event(), asyncio.Event()

        async def pause(seconds: float) -> None:
            grace_due.set()
            await grace_go.wait()

        monkeypatch.setattr(listener, "_pause", pause)
        stored, commit = asyncio.Event(), asyncio.Event()
        inner = hands._do

        async def held_do(op: Any, **kw: Any) -> Any:
            return await inner(lambda conn: op(_Held(conn, stored, commit)), **kw)

        try:
            (a, wa, ea), (b, wb, eb) = new_row(), new_row()
            await hands.create_run(a, ea)
            await hands.create_run(b, eb)
            monkeypatch.setattr(hands, "_do", held_do)
            growing = asyncio.gather(_grow(hands, a.run_id, wa), _grow(hands, b.run_id, wb))
            await asyncio.wait_for(stored.wait(), WOKEN)  # it read "nobody"; not committed
            # the stream's first wait announces it (and wakes every waiter: it reads)
            await ears.wait_changed(0.0, None, a.run_id)
            await asyncio.wait_for(listener.present.wait(), WOKEN)
            await asyncio.wait_for(grace_due.wait(), WOKEN)
            seen = listener.count
            before = len(await ears.entries(a.run_id))  # (not committed yet)
            waiting = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, seen, a.run_id))
            commit.set()
            await asyncio.wait_for(growing, WOKEN)  # committed, told to no one
            assert len(await ears.entries(a.run_id)) == before + 2
            await asyncio.sleep(0)
            assert not waiting.done()
            grace_go.set()
            assert await asyncio.wait_for(waiting, WOKEN) > seen
        finally:
            commit.set()
            grace_go.set()
            await ears.close()
            await hands.close()

    asyncio.run(main())


def test_an_announcement_lapses_when_nobody_waits_and_is_made_again(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Once no stream has waited for `PRESENCE` seconds the announcement is not renewed,
    and once it has run out appends notify nothing again; the next wait announces anew."""
    monkeypatch.setattr(_postgres_listen, "PRESENCE", 0.6)

    async def main() -> None:
        ears, hands = await _stores(pg_schema_url)
        ear = await _ear(pg_schema_url)
        listener = ears._listener()
        try:
            (a, wa, ea), (b, wb, eb) = new_row(), new_row()
            await hands.create_run(a, ea)
            await hands.create_run(b, eb)
            assert listener._presence is not None
            await asyncio.wait_for(listener._presence, WOKEN)  # nobody waited: it ends
            assert not listener.present.is_set()
            async with asyncio.timeout(WOKEN):  # the server's clock passes the last one
                while (await (await ear.execute(
                        "SELECT last_value > (extract(epoch FROM clock_timestamp()) * 1000)"
                        "::bigint FROM interlock_listening")).fetchone() or (True,))[0]:
                    await asyncio.sleep(0.05)
            await _grow(hands, a.run_id, wa)  # told to no one
            await ears.wait_changed(0.0)
            await asyncio.wait_for(listener.present.wait(), WOKEN)
            await _grow(hands, b.run_id, wb)
            assert await _first_told(ear, {a.run_id, b.run_id}) == {b.run_id}
        finally:
            await ear.close()
            await ears.close()
            await hands.close()

    asyncio.run(main())
