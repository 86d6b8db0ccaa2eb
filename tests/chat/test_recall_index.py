"""The recall index (``recall: true``) is the store's, kept as the log is: a
conversation's messages are in it once they are written -- before anyone searches --,
a pruned run's rows leave with its records, and an index an earlier version filled at
search time (with ``chat_search_progress``) is rebuilt whole, on SQLite (FTS5) and
PostgreSQL (full-text search)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_recall import CHAT
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

import interlock


def _converse(url: str, run_ids: list[str], end: list[str]) -> None:
    """A conversation per run id, two messages each; the ones in ``end`` ended."""

    async def go() -> None:
        store = interlock.open_store(url)
        wf = interlock.load(CHAT)
        try:
            for rid in run_ids:
                await wf.run({}, store=store, run_id=rid)
                await wf.send(rid, f"the broker of {rid} is kafka-{rid}", store=store)
                await wf.send(rid, "and the database?", store=store)
                if rid in end:
                    await wf.send(rid, "/end", store=store)
        finally:
            await store.close()

    asyncio.run(go())


def _search(url: str, query: str) -> list[str]:
    async def go() -> list[str]:
        store = interlock.open_store(url)
        try:
            return [f.run_id for f in await store.search_messages("remembering", query)]
        finally:
            await store.close()

    return asyncio.run(go())


def _prune(url: str, run_ids: list[str]) -> list[str]:
    async def go() -> list[str]:
        store = interlock.open_store(url)
        try:
            deleted, _ = await store.delete_finished(run_ids)
            return deleted
        finally:
            await store.close()

    return asyncio.run(go())


def _sqlite_rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT r.run_id, s.seq, s.type, s.text FROM chat_search s "
                            "JOIN runs r ON r.run_key = s.run_key ORDER BY r.run_id, s.seq"
                            ).fetchall()


def _pg_rows(url: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT run_id, seq, type, text FROM chat_search "
                            "ORDER BY run_id, seq").fetchall()


def _expected(run_ids: list[str], ended: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    out = []
    for rid in run_ids:
        out += [(rid, f"the broker of {rid} is kafka-{rid}"), (rid, "ok"),
                (rid, "and the database?"), (rid, "ok")]
        if rid in ended:
            out.append((rid, "/end"))
    return out


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_messages_are_indexed_as_written_and_leave_with_a_pruned_run(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "postgres":
        url: str = request.getfixturevalue("pg_schema_url")
        rows = lambda: _pg_rows(url)  # noqa: E731
    else:
        db = tmp_path / "runs.db"
        url = f"sqlite:///{db}"
        rows = lambda: _sqlite_rows(db)  # noqa: E731
    _converse(url, ["a1", "a2"], end=["a1"])
    # in the index before any search
    assert [(r[0], r[3]) for r in rows()] == _expected(["a1", "a2"], ended=("a1",))
    assert {r[2] for r in rows()} == {"chat.message", "chat.reply"}
    assert sorted(_search(url, "kafka")) == ["a1", "a2"]
    assert _prune(url, ["a1", "a2"]) == ["a1"]  # (a2 waits for a message: not pruned)
    assert [(r[0], r[3]) for r in rows()] == _expected(["a2"])
    assert _search(url, "kafka") == ["a2"]
    _converse(url, ["a3"], end=[])  # later writes go on filling it
    assert [(r[0], r[3]) for r in rows()] == _expected(["a2", "a3"])


def test_an_index_filled_at_search_time_by_an_earlier_version_is_rebuilt(
        tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    url = f"sqlite:///{db}"
    _converse(url, ["b1"], end=[])
    # the earlier layout: an FTS5 table with rowids of its own, filled up to a progress
    # mark that is behind the log (b2's messages are missing)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE chat_search")
        conn.execute("CREATE VIRTUAL TABLE chat_search USING fts5("
                     "text, run_key UNINDEXED, seq UNINDEXED, type UNINDEXED)")
        conn.execute("CREATE TABLE chat_search_progress (run_key INTEGER PRIMARY KEY, "
                     "seq INTEGER NOT NULL)")
        conn.execute("INSERT INTO chat_search (text, run_key, seq, type) "
                     "VALUES ('stale row', 1, 1, 'chat.message')")
        conn.execute("INSERT INTO chat_search_progress VALUES (1, 3)")
    _converse(url, ["b2"], end=[])  # the first write of a message rebuilds it
    assert [(r[0], r[3]) for r in _sqlite_rows(db)] == _expected(["b1", "b2"])
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = "
                            "'chat_search_progress'").fetchall() == []
