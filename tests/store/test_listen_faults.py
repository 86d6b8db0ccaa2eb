"""The PostgreSQL listener's announcement refused by the store (`_postgres_listen`).

A server's event streams announce that they listen (the ``interlock_listening``
sequence) so that appends notify them. When the store refuses the announcement -- here
for real: the server's database role may read the sequence but not set it -- nothing
dies: the waits still return at their timeouts (the slow poll), the listener keeps
trying, and the log says so once, not at every try. Once the store takes the
announcement again, every waiter is woken (an append made while the announcement had
lapsed notified nobody), and appends notify again. A real ``interlock serve`` on such a
role streams another process's records to its subscriber by the poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import psycopg
import pytest
from test_server import Served, events
from test_store_conformance import log, new_row, pg_schema_url, summary_of  # noqa: F401

import interlock
from interlock._store import _postgres_listen, _postgres_sql
from interlock._store._postgres import PostgresStore

SLOW_POLL = 60.0  # a waiter's timeout: far longer than the test's own `WOKEN`
WOKEN = 20.0  # a waiter not woken by then fails the test


def _schema(url: str) -> str:
    options = dict(parse_qsl(urlsplit(url).query))["options"]
    return options.removeprefix("-csearch_path=")


@pytest.fixture
def role(pg_schema_url: str) -> Iterator[tuple[str, str]]:  # noqa: F811
    """(the schema's URL as a role that may do everything in it but set the
    announcement's sequence, a SQL to let it): the tables made first, as the owner."""
    async def made() -> None:
        store = interlock.open_store(pg_schema_url)
        await store.list_runs()  # sets up the tables
        await store.close()

    asyncio.run(made())
    name, schema = f"ears_{uuid.uuid4().hex[:10]}", _schema(pg_schema_url)
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {name}")
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {name}")
        conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {name}")
    parts = urlsplit(pg_schema_url)
    url = urlunsplit(parts._replace(netloc=f"{name}@{parts.netloc.split('@', 1)[1]}"))
    try:
        yield url, f"GRANT UPDATE ON SEQUENCE {schema}.interlock_listening TO {name}"
    finally:
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE usename = %s", (name,))
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE {name}")


def _refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and "announc" in r.getMessage()]


def test_a_refused_announcement_falls_back_to_the_poll_says_so_once_and_recovers(
        pg_schema_url: str, role: tuple[str, str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_postgres_listen, "RETRY_MAX", 0.05)  # many tries, quickly
    monkeypatch.setattr(_postgres_listen, "PRESENCE", 0.6)  # an announcement lapses soon
    url, grant = role

    async def main() -> None:
        ears, hands = interlock.open_store(url), interlock.open_store(pg_schema_url)
        assert isinstance(ears, PostgresStore) and isinstance(hands, PostgresStore)
        listener = ears._listener()
        listener.grace = ()  # (no wake of every waiter but the one after announcing)
        tries = 0
        announce = listener._announce
        assert announce is not None

        async def counted(seconds: float) -> None:
            nonlocal tries
            tries += 1
            await announce(seconds)

        monkeypatch.setattr(listener, "_announce", counted)
        try:
            row, w, entries = new_row()
            await hands.create_run(row, entries)
            seen = await ears.wait_changed(0.0, None, row.run_id)
            # refused, again and again: each wait returns at its timeout (the poll)
            async with asyncio.timeout(WOKEN):
                while tries < 5:
                    seen = await ears.wait_changed(0.05, seen, row.run_id)
            assert listener._presence is not None and not listener._presence.done()
            assert not listener.present.is_set() and listener.listening.is_set()
            [said] = _refused(caplog)  # once, however many tries
            assert "permission denied" in said and "poll" in said, said
            # an append now notifies no one ...
            w, batch = log(2, w)
            await hands.append(row.run_id, batch, summary_of(w))
            waiting = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, seen, row.run_id))
            await asyncio.sleep(0)
            assert not waiting.done()
            # ... and once the store takes the announcement, every waiter is woken
            async with await psycopg.AsyncConnection.connect(pg_schema_url,
                                                             autocommit=True) as admin:
                await admin.execute(grant)
            now = await asyncio.wait_for(waiting, WOKEN)
            assert now > seen and listener.present.is_set()
            # and appends notify again
            waiting = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, now, row.run_id))
            w, batch = log(2, w)
            await hands.append(row.run_id, batch, summary_of(w))
            assert await asyncio.wait_for(waiting, WOKEN) > now
        finally:
            await ears.close()
            await hands.close()

    asyncio.run(main())


def test_the_announcement_is_made_anew_after_failures_outlast_it(
        pg_schema_url: str, role: tuple[str, str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Announced, then refused for longer than an announcement lasts, while a stream
    waits all along: an append made in between notifies nobody, so the announcement made
    again must wake every waiter as a first one does (before, only a new connection or
    a new announcing task did: the waiter slept until its timeout)."""
    monkeypatch.setattr(_postgres_listen, "RETRY_MAX", 0.05)
    monkeypatch.setattr(_postgres_listen, "PRESENCE", 0.6)
    url, grant = role

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_schema_url,
                                                         autocommit=True) as admin:
            await admin.execute(grant)  # announcing works at first
            ears, hands = interlock.open_store(url), interlock.open_store(pg_schema_url)
            assert isinstance(ears, PostgresStore)
            listener = ears._listener()
            listener.grace = ()
            refused = asyncio.Event()
            announce = listener._announce
            assert announce is not None

            async def noted(seconds: float) -> None:
                try:
                    await announce(seconds)
                except Exception:
                    refused.set()
                    raise

            monkeypatch.setattr(listener, "_announce", noted)
            try:
                row, w, entries = new_row()
                await hands.create_run(row, entries)
                seen = await ears.wait_changed(0.0, None, row.run_id)
                await asyncio.wait_for(listener.present.wait(), WOKEN)
                # a stream that waits all along (the server's poll of a followed run)
                stream = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, None, "other"))
                await admin.execute(grant.replace("GRANT", "REVOKE").replace(" TO ",
                                                                              " FROM "))
                await asyncio.wait_for(refused.wait(), WOKEN)
                async with asyncio.timeout(WOKEN):  # the last announcement runs out
                    while (await (await admin.execute(
                            f"SELECT {_postgres_sql._LISTENED}")).fetchone() or (True,))[0]:
                        await asyncio.sleep(0.05)
                seen = listener.count
                waiting = asyncio.ensure_future(ears.wait_changed(SLOW_POLL, seen,
                                                                  row.run_id))
                w, batch = log(2, w)
                await hands.append(row.run_id, batch, summary_of(w))  # told to no one
                await admin.execute(grant)
                assert await asyncio.wait_for(waiting, WOKEN) > seen
                assert not stream.done() or stream.result() > seen
                stream.cancel()
            finally:
                await ears.close()
                await hands.close()

    asyncio.run(main())


# one gate (YAML takes JSON)
GATED = json.dumps({"workflow": "gated", "nodes": {"check": {"approval": {"show": []}}},
                    "edges": [{"from": "START", "to": "check"}]})


def test_a_server_whose_announcement_is_refused_streams_by_the_poll(
        pg_schema_url: str, role: tuple[str, str], tmp_path: Path) -> None:  # noqa: F811
    """``interlock serve`` on a role that cannot announce: a run waiting, decided by
    another process (the CLI), reaches the server's event stream all the same; the
    server stays up and its log says once that it polls."""
    from click.testing import CliRunner

    from interlock.cli import cli

    url, _ = role
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "gated.yaml").write_text(GATED)
    runner = CliRunner()
    started = runner.invoke(cli, ["run", str(tmp_path / "flows" / "gated.yaml"), "--run-id",
                                  "g1", "--store",
                                  pg_schema_url], catch_exceptions=False)
    assert started.exit_code == 3, started.output
    served = Served(tmp_path, store=url)
    try:
        with served.client() as http:
            seen = []
            for event in events(http, "g1", params={"after": 0}, until="run.completed"):
                seen.append(event["event"])
                if event["event"] == "run.waiting":  # decided by another process
                    done = runner.invoke(cli, ["resume", "g1", "--approve", "--store",
                                               pg_schema_url], catch_exceptions=False)
                    assert done.exit_code == 0, done.output
            assert seen[-1] == "run.completed"
        assert served.proc.poll() is None
    finally:
        served.stop()
    said = [line for line in served.lines if "announc" in line]
    assert len(said) == 1 and "permission denied" in said[0], served.lines
