"""``recall: true`` (SPEC §11): a conversation's agent finds a fact from an earlier
conversation of its workflow through the store's full-text search (SQLite FTS5,
PostgreSQL's text search; memory:// scans), with the run id and seq of the message; a
later conversation's messages are indexed as they come (the index follows the log)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

import interlock


def chat(workflow: str, *replies: Any) -> dict[str, Any]:
    """A conversation's file (scripted replies start afresh in every run: each
    conversation of the test gets its own)."""
    return {"workflow": workflow, "chat": "assistant", "nodes": {"assistant": {"agent": {
        "provider": "scripted", "recall": True, "replies": list(replies)}}}}


CHAT = chat("remembering", "ok", "ok", "ok")


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_recall_finds_a_fact_from_an_earlier_conversation(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "postgres":
        url = request.getfixturevalue("pg_schema_url")
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        url = "memory://"
    store = interlock.open_store(url)
    earlier = interlock.load(chat("remembering",
                                  "Noted: the payments database is pg-payments-7."))
    later = interlock.load(chat("remembering", {"tool_calls": [{"name": "recall", "arguments": {
        "query": "which database does payments use?"}}]},
        "It is pg-payments-7 (from an earlier conversation)."))
    other = interlock.load(chat("other", "ok"))

    async def go() -> tuple[str, interlock.RunResult, list[dict[str, Any]]]:
        try:
            first = await earlier.run({}, store=store, run_id="conv-1")
            await earlier.send(first.run_id, "Remember: payments runs on pg-payments-7.",
                               store=store)
            await earlier.send(first.run_id, "/end", store=store)
            # a conversation of another workflow is not searched
            o = await other.run({}, store=store, run_id="other-1")
            await other.send(o.run_id, "payments database is elsewhere-1", store=store)
            second = await later.run({}, store=store, run_id="conv-2")
            result = await later.send(second.run_id, "what was the payments database again?",
                                      store=store)
            trace = await interlock.trace(second.run_id, store=store)
            called = [r for r in trace if r["type"] == "tool.called"]
            return first.run_id, result, called
        finally:
            await store.close()

    first_id, result, called = asyncio.run(go())
    assert result.status == "WAITING_INPUT", result.error
    found: list[dict[str, Any]] = called[0]["result"]
    assert found, "recall found nothing"
    assert {f["run_id"] for f in found} == {first_id}  # not this run, not another workflow
    texts = {f["kind"]: f["text"] for f in found}
    assert texts["message"] == "Remember: payments runs on pg-payments-7."
    assert texts["reply"] == "Noted: the payments database is pg-payments-7."
    message = next(f for f in found if f["kind"] == "message")
    assert isinstance(message["seq"], int) and message["seq"] > 0


def test_the_sqlite_index_follows_conversations_as_they_grow(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def go() -> list[list[str]]:
        store = interlock.open_store(url)
        wf = interlock.load(CHAT)
        try:
            seen = []
            r = await wf.run({}, store=store, run_id="grow")
            await wf.send(r.run_id, "the broker is kafka-3", store=store)
            found = await store.search_messages("remembering", "broker")
            seen.append([f.text for f in found])
            await wf.send(r.run_id, "another broker is kafka-9", store=store)
            found = await store.search_messages("remembering", "broker kafka")
            seen.append([f.text for f in found])
            seen.append([f.text for f in await store.search_messages("remembering", "zebra")])
            seen.append([f.text for f in await store.search_messages("remembering", "' OR")])
            return seen
        finally:
            await store.close()

    one, two, none, odd = asyncio.run(go())
    assert one == ["the broker is kafka-3"]
    assert sorted(two) == ["another broker is kafka-9", "the broker is kafka-3"]
    assert none == [] and odd == []
