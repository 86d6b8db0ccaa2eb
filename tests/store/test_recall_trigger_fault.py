"""PostgreSQL's recall index is filled by a trigger inside the append that writes a
conversation's message: when the trigger fails, the whole append fails -- the caller
gets the store's error, nothing of it is in the run's log (or the index), the run is not
left claimed -- and the next append works. (Needs INTERLOCK_TEST_POSTGRES.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_recall import CHAT
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

import interlock
from interlock import StoreError


def _sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def test_a_failing_recall_trigger_fails_the_append_and_changes_nothing(
        pg_schema_url: str) -> None:  # noqa: F811 (the fixture)
    url = pg_schema_url
    wf = interlock.load(CHAT)

    async def go() -> None:
        store = interlock.open_store(url)
        try:
            await wf.run({}, store=store, run_id="rt")
            await wf.send("rt", "the broker is kafka-1", store=store)
            # the trigger's insert now fails for this text (as a full disk, a broken
            # index or a bug in it would, inside the append's transaction)
            _sql(url, "ALTER TABLE chat_search ADD CONSTRAINT no_boom "
                      "CHECK (text NOT LIKE '%boom%')")
            before = await interlock.trace("rt", store=store)
            row = await store.get_run("rt")
            with pytest.raises(StoreError, match="no_boom"):
                await wf.send("rt", "boom: the broker fell over", store=store)
            assert await interlock.trace("rt", store=store) == before
            after = await store.get_run("rt")
            assert after.summary == row.summary and after.owner is None
            assert (await interlock.verify("rt", store=store)).ok
            # the next append works, and goes on filling the index
            result = await wf.send("rt", "and the database?", store=store)
            assert result.status == "WAITING_INPUT"
            assert (await interlock.verify("rt", store=store)).ok
            found = await store.search_messages("remembering", "database")
            assert [f.run_id for f in found] == ["rt"]
        finally:
            await store.close()

    asyncio.run(go())
    assert [t for (t,) in _sql(url, "SELECT text FROM chat_search ORDER BY seq")] == [
        "the broker is kafka-1", "ok", "and the database?", "ok"]
    sent = [r[0] for r in _sql(url, "SELECT data::jsonb ->> 'text' FROM records "
                                    "WHERE run_id = 'rt' AND type = 'chat.message' "
                                    "ORDER BY seq")]
    assert sent == ["the broker is kafka-1", "and the database?"]
