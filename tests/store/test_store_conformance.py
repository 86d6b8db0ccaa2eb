"""The store contract (interlock/_store/_base.py), run against every backend.

``memory`` and ``sqlite`` always run. ``postgres`` runs against the server named by
``$INTERLOCK_TEST_POSTGRES`` (``source .ci/postgres.sh`` starts a throwaway one), each
test in a fresh schema; without that variable it is skipped -- except under CI
(``$CI`` set), where that is a failure, never a silent skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

import interlock
from interlock._log import Entry, LogWriter, verify_chain
from interlock._store import (
    Claim,
    ClaimError,
    ClaimLost,
    ConflictError,
    MemoryStore,
    RunExists,
    RunNotFound,
    RunRow,
    Store,
    StoreError,
    Summary,
    open_store,
    this_owner,
)
from interlock._store._sqlite import SQLiteStore

REPO = Path(interlock.__file__).resolve().parent.parent
PG_ENV = "INTERLOCK_TEST_POSTGRES"


# -- backends --------------------------------------------------------------------------

def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _postgres_url_or_skip() -> str:
    url = os.environ.get(PG_ENV, "")
    if not url:
        message = (f"${PG_ENV} is not set: no PostgreSQL to test against "
                   "(start one with `source .ci/postgres.sh`)")
        if _in_ci():
            pytest.fail(f"{message}; under CI the PostgreSQL store must be tested")
        pytest.skip(message)
    pytest.importorskip("psycopg", reason="the PostgreSQL store needs psycopg")
    return url


def _with_search_path(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose tables go into a fresh schema, dropped afterwards."""
    url = _postgres_url_or_skip()  # skips (before importing psycopg) without the extra
    import psycopg

    schema = f"ilt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield _with_search_path(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _url_for(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'runs.db'}"  # absolute: sqlite:////tmp/...
    url: str = request.getfixturevalue("pg_schema_url")
    return url


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = _url_for(request.param, request, tmp_path)
    s = MemoryStore() if request.param == "memory" else open_store(url)
    try:
        yield s
    finally:
        asyncio.run(s.close())  # a different event loop from the test's: must work


@pytest.fixture(params=["sqlite", "postgres"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _url_for(request.param, request, tmp_path)


def reopen(store: Store) -> Store:
    """A second store object on the same database (memory: the same object)."""
    return store if isinstance(store, MemoryStore) else open_store(store.url)


def run(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(fn())


# -- building runs ---------------------------------------------------------------------

def new_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


def log(n: int, writer: LogWriter | None = None, node: str = "step") -> tuple[LogWriter,
                                                                              list[Entry]]:
    """``n`` records from ``writer`` (a new log if None)."""
    w = writer or LogWriter()
    out = []
    for i in range(n):
        if w.seq == 0:
            _, e = w.make("run.started", {"input": {"q": "ünïcødé ✓ 🚀"}})
        elif i % 2:
            _, e = w.make("node.started", {"node": f"{node}-{w.seq}", "attempt": 1})
        else:
            _, e = w.make("node.completed", {"node": f"{node}-{w.seq}", "duration": 0.125,
                                             "update": {"items": [1, 2.5, None, "ß"],
                                                        "z": True, "a": {"b": "c"}}})
        out.append(e)
    return w, out


def summary_of(w: LogWriter, status: str = "RUNNING", **kw: Any) -> Summary:
    return Summary(status=status, last_seq=w.seq, last_hash=w.hash,
                   updated_at=kw.pop("updated_at", time.time()), **kw)


def new_row(run_id: str | None = None, *, workflow: str = "triage", status: str = "RUNNING",
            created_at: float | None = None, n: int = 2) -> tuple[RunRow, LogWriter,
                                                                  list[Entry]]:
    w, entries = log(n)
    row = RunRow(
        run_id=run_id or new_id(),
        workflow=workflow,
        # key order matters to a reader of a definition: "nodes" before "edges", "zeta" first
        definition={"name": workflow, "nodes": {"zeta": {"kind": "function"},
                                                "alpha": {"kind": "agent"}},
                    "edges": [{"from": "zeta", "to": "alpha", "when": "x > 1"}]},
        definition_hash="sha256:" + "ab" * 32,
        input={"ticket": "Ünïcode ✓", "n": 3, "ratio": 0.1},
        options={"config": {"model": "m"}, "limits": {"steps": 50}},
        created_at=created_at if created_at is not None else time.time(),
        summary=summary_of(w, status),
        extra={"labels": ["a", "b"]},
    )
    return row, w, entries


# -- runs ------------------------------------------------------------------------------

def test_create_and_get_round_trip(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        row.parent_run, row.parent_seq = "parent-1", 7
        await store.create_run(row, entries)
        got = await store.get_run(row.run_id)
        assert got == row
        assert list(got.definition["nodes"]) == ["zeta", "alpha"]  # order kept
        assert list(got.definition) == ["name", "nodes", "edges"]
        assert got.owner is None and got.lease_until is None

    run(main)


def test_list_runs_newest_first_and_filtered(store: Store) -> None:
    async def main() -> None:
        base = 1_700_000_000.0
        specs = [("triage", "COMPLETED", 1.0), ("triage", "RUNNING", 3.0),
                 ("billing", "RUNNING", 2.0), ("billing", "FAILED", 4.0)]
        ids = {}
        for workflow, status, offset in specs:
            row, _, entries = new_row(workflow=workflow, status=status,
                                      created_at=base + offset)
            await store.create_run(row, entries)
            ids[(workflow, status)] = row.run_id

        every = await store.list_runs()
        assert [r.run_id for r in every] == [ids["billing", "FAILED"], ids["triage", "RUNNING"],
                                             ids["billing", "RUNNING"],
                                             ids["triage", "COMPLETED"]]
        running = await store.list_runs(status="RUNNING")
        assert [r.run_id for r in running] == [ids["triage", "RUNNING"],
                                               ids["billing", "RUNNING"]]
        triage = await store.list_runs(workflow="triage")
        assert [r.run_id for r in triage] == [ids["triage", "RUNNING"],
                                              ids["triage", "COMPLETED"]]
        both = await store.list_runs(status="RUNNING", workflow="billing")
        assert [r.run_id for r in both] == [ids["billing", "RUNNING"]]
        assert [r.run_id for r in await store.list_runs(limit=2)] == [r.run_id
                                                                      for r in every[:2]]
        assert await store.list_runs(status="REJECTED") == []
        assert every[0].summary.status == "FAILED" and every[0].workflow == "billing"

    run(main)


def test_list_page_is_keyset_paged_newest_first_and_light(store: Store) -> None:
    """A list's pages (`Store.list_page`): (created_at, run_id) descending, each page
    after the previous one's last run -- a run created between two pages shifts none of
    them, and runs with the same created_at are neither skipped nor repeated; the rows
    carry the list's columns, not the definition, input or options."""
    async def main() -> None:
        base = 1_700_000_000.0
        made = []
        for i, offset in enumerate([1.0, 2.0, 2.0, 2.0, 3.0, 4.0, 4.0]):
            row, _, entries = new_row(f"k-{i}", workflow="triage" if i % 2 else "billing",
                                      status="RUNNING" if i < 5 else "COMPLETED",
                                      created_at=base + offset)
            row.parent_run, row.parent_seq = ("p", 3) if i == 2 else (None, None)
            await store.create_run(row, entries)
            made.append(row)
        order = [r.run_id for r in sorted(made, key=lambda r: (r.created_at, r.run_id),
                                          reverse=True)]
        assert order == ["k-6", "k-5", "k-4", "k-3", "k-2", "k-1", "k-0"]

        async def pages(size: int, **kw: Any) -> list[list[str]]:
            out: list[list[str]] = []
            before = None
            while True:
                page = await store.list_page(limit=size, before=before, **kw)
                if not page:
                    return out
                out.append([r.run_id for r in page])
                if len(out) == 1 and size == 2 and not kw:
                    # a run created after the first page was read: the next pages are
                    # the same (it is newer than all of them)
                    late, _, late_entries = new_row("k-late", workflow="other",
                                                    status="CANCELLED",
                                                    created_at=base + 9.0)
                    await store.create_run(late, late_entries)
                before = (page[-1].created_at, page[-1].run_id)

        assert await pages(2) == [["k-6", "k-5"], ["k-4", "k-3"], ["k-2", "k-1"], ["k-0"]]
        assert [r.run_id for r in await store.list_page(limit=1)] == ["k-late"]
        assert await pages(3, status="RUNNING") == [["k-4", "k-3", "k-2"], ["k-1", "k-0"]]
        assert await pages(10, workflow="triage") == [["k-5", "k-3", "k-1"]]
        assert await pages(1, status="COMPLETED", workflow="billing") == [["k-6"]]
        assert await store.list_page(status="REJECTED") == []
        assert await store.list_page(limit=0) == []

        rows = {r.run_id: r for r in await store.list_page(limit=100)}
        for full in made:
            light = rows[full.run_id]
            assert (light.definition, light.input, light.options) == ({}, {}, {})
            assert light.summary == full.summary  # status, seq, steps, waiting, ...
            assert (light.workflow, light.definition_hash, light.created_at,
                    light.parent_run, light.parent_seq, light.extra) == \
                (full.workflow, full.definition_hash, full.created_at, full.parent_run,
                 full.parent_seq, full.extra)
        # a light row is a copy: changing it changes nothing stored
        rows["k-0"].summary.status = "FAILED"
        assert (await store.get_run("k-0")).summary.status == "RUNNING"

    run(main)


def test_list_page_of_the_runs_changed_after_a_time(store: Store) -> None:
    """``updated_after``: only the runs whose row changed since (what the notify watcher
    reads each pass)."""
    async def main() -> None:
        rows = []
        for i in range(3):
            row, w, entries = new_row(f"u-{i}", status="WAITING_APPROVAL")
            row.summary.updated_at = 1000.0 + i
            await store.create_run(row, entries)
            rows.append((row, w))
        changed = await store.list_page(status="WAITING_APPROVAL", updated_after=1000.5)
        assert [r.run_id for r in changed] == ["u-2", "u-1"]
        row, w = rows[0]
        w2, more = log(1, w)
        await store.append(row.run_id, more, summary_of(w2, "WAITING_APPROVAL",
                                                        updated_at=2000.0))
        changed = await store.list_page(status="WAITING_APPROVAL", updated_after=1500.0)
        assert [r.run_id for r in changed] == ["u-0"]
        assert changed[0].summary.last_seq == w2.seq

    run(main)


def test_run_exists(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        other, _, other_entries = new_row(row.run_id, workflow="impostor", n=5)
        with pytest.raises(RunExists) as err:
            await store.create_run(other, other_entries)
        assert err.value.run_id == row.run_id
        assert (await store.get_run(row.run_id)).workflow == "triage"
        assert await store.entries(row.run_id) == entries

    run(main)


def test_run_not_found(store: Store) -> None:
    async def main() -> None:
        w, entries = log(1)
        missing = new_id()
        with pytest.raises(RunNotFound) as err:
            await store.get_run(missing)
        assert err.value.run_id == missing
        with pytest.raises(RunNotFound):
            await store.entries(missing)
        with pytest.raises(RunNotFound):
            await store.append(missing, entries, summary_of(w))
        with pytest.raises(RunNotFound):
            await store.claim(missing, "h:1", 10)
        with pytest.raises(RunNotFound):
            await store.heartbeat(missing, "h:1", 10)
        with pytest.raises(RunNotFound):
            await store.release(missing, "h:1")
        assert await store.list_runs() == []  # the failed append created nothing

    run(main)


def test_create_run_without_entries(store: Store) -> None:
    async def main() -> None:
        row, _, _ = new_row(n=0)
        await store.create_run(row, [])
        assert await store.entries(row.run_id) == []
        w, entries = log(2)
        await store.append(row.run_id, entries, summary_of(w))
        assert await store.entries(row.run_id) == entries

    run(main)


# -- the log ---------------------------------------------------------------------------

def test_append_and_entries_round_trip_byte_identical(store: Store) -> None:
    async def main() -> None:
        row, w, first = new_row(n=2)
        await store.create_run(row, first)
        w, more = log(3, w)
        await store.append(row.run_id, more, summary_of(w))
        w, last = log(1, w)
        await store.append(row.run_id, last, summary_of(w))

        stored = await store.entries(row.run_id)
        assert stored == first + more + last  # seq, type, data bytes and hash all equal
        assert [e.data for e in stored] == [e.data for e in first + more + last]
        assert all(isinstance(e.data, bytes) for e in stored)
        assert verify_chain(stored) is None
        assert stored[0].record()["input"] == {"q": "ünïcødé ✓ 🚀"}
        assert stored[-1].hash == w.hash

        assert await store.entries(row.run_id, after=2) == more + last
        assert await store.entries(row.run_id, after=5) == last
        assert await store.entries(row.run_id, after=6) == []

    run(main)


def test_entries_page_and_iter_entries_read_a_log_in_pages(store: Store) -> None:
    async def main() -> None:
        row, w, first = new_row(n=2)
        await store.create_run(row, first)
        w, more = log(5, w)
        await store.append(row.run_id, more, summary_of(w))
        everything = first + more

        assert await store.entries_page(row.run_id, limit=3) == everything[:3]
        assert await store.entries_page(row.run_id, after=3, limit=3) == everything[3:6]
        assert await store.entries_page(row.run_id, after=6, limit=3) == everything[6:]
        assert await store.entries_page(row.run_id, after=7, limit=3) == []
        assert await store.entries_page(row.run_id, after=1, limit=100) == everything[1:]
        for page in (1, 2, 3, 7, 100):
            pages = [p async for p in store.iter_entries(row.run_id, page=page)]
            assert [e for p in pages for e in p] == everything, page
            assert all(1 <= len(p) <= page for p in pages)
        after = [p async for p in store.iter_entries(row.run_id, after=4, page=2)]
        assert [e for p in after for e in p] == everything[4:]
        with pytest.raises(RunNotFound):
            await store.entries_page("no-such-run")
        with pytest.raises(RunNotFound):
            [p async for p in store.iter_entries("no-such-run")]

    run(main)


def test_tampering_is_detectable_after_round_trip(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row(n=3)
        await store.create_run(row, entries)
        stored = await store.entries(row.run_id)
        forged = Entry(stored[1].seq, stored[1].type,
                       stored[1].data.replace(b'"attempt":1', b'"attempt":2'), stored[1].hash)
        assert forged.data != stored[1].data
        problem = verify_chain([stored[0], forged, stored[2]])
        assert problem is not None and problem.seq == 2

    run(main)


def test_append_conflicts_store_nothing(store: Store) -> None:
    async def main() -> None:
        row, w, entries = new_row(n=3)
        await store.create_run(row, entries)
        before = await store.get_run(row.run_id)

        # a writer that forked at seq 2: its batch (3', 4') collides on seq 3
        fork = LogWriter(entries[1].seq, entries[1].hash)
        fork, forked = log(2, fork, node="fork")
        with pytest.raises(ConflictError):
            await store.append(row.run_id, forked, summary_of(fork, "FAILED"))

        # a batch with a gap (5 without 4)
        ahead = LogWriter(w.seq + 1, w.hash)
        ahead, gap = log(1, ahead)
        with pytest.raises(ConflictError):
            await store.append(row.run_id, gap, summary_of(ahead, "FAILED"))

        # a batch whose first record fits but whose second repeats a seq
        good = LogWriter(w.seq, w.hash)
        _, e4 = good.make("node.started", {"node": "x"})
        again = LogWriter(w.seq, w.hash)
        _, e4b = again.make("node.started", {"node": "y"})
        with pytest.raises(ConflictError):
            await store.append(row.run_id, [e4, e4b], summary_of(good, "FAILED"))

        assert await store.entries(row.run_id) == entries  # nothing of any batch stored
        assert await store.get_run(row.run_id) == before   # nor the summary

        # and the rightful next record still goes in
        w, nxt = log(2, w)
        await store.append(row.run_id, nxt, summary_of(w))
        assert verify_chain(await store.entries(row.run_id)) is None

    run(main)


def test_duplicate_seq_from_a_second_store_object(store: Store) -> None:
    async def main() -> None:
        row, w, entries = new_row(n=2)
        await store.create_run(row, entries)
        other = reopen(store)
        try:
            mine = LogWriter(w.seq, w.hash)
            mine, batch_a = log(2, mine, node="a")
            theirs = LogWriter(w.seq, w.hash)
            theirs, batch_b = log(2, theirs, node="b")
            await other.append(row.run_id, batch_b, summary_of(theirs, "WAITING_APPROVAL"))
            with pytest.raises(ConflictError):
                await store.append(row.run_id, batch_a, summary_of(mine, "FAILED"))
            stored = await store.entries(row.run_id)
            assert stored == entries + batch_b
            assert verify_chain(stored) is None
            got = await store.get_run(row.run_id)
            assert got.summary.status == "WAITING_APPROVAL"
            assert got.summary.last_hash == theirs.hash
        finally:
            if other is not store:
                await other.close()

    run(main)


def test_summary_is_updated_with_every_append(store: Store) -> None:
    async def main() -> None:
        row, w, entries = new_row(n=1)
        await store.create_run(row, entries)
        w, more = log(2, w)
        summary = Summary(
            status="WAITING_APPROVAL", last_seq=w.seq, last_hash=w.hash, steps=4, tokens=1234,
            error=None,
            waiting={"node": "approve", "show": {"amount": 12.5, "who": "Zoë"},
                     "decisions": ["approve", "reject", "modify"]},
            updated_at=1_700_000_123.456789,
        )
        await store.append(row.run_id, more, summary)
        assert (await store.get_run(row.run_id)).summary == summary

        failed = Summary(status="FAILED", last_seq=w.seq, last_hash=w.hash, steps=5,
                         tokens=2000, error={"type": "node_error", "message": "boom ✗",
                                             "node": "rca", "details": {"attempt": 3}},
                         waiting=None, updated_at=1_700_000_200.5)
        await store.append(row.run_id, [], failed)  # summary only
        got = await store.get_run(row.run_id)
        assert got.summary == failed
        assert got.created_at == row.created_at and got.definition == row.definition
        assert len(await store.entries(row.run_id)) == 3

    run(main)


def test_successive_event_loops(store: Store) -> None:
    row, _, entries = new_row()
    asyncio.run(store.create_run(row, entries))
    assert asyncio.run(store.get_run(row.run_id)) == row
    assert asyncio.run(store.entries(row.run_id)) == entries


def test_concurrent_appends_to_different_runs(store: Store) -> None:
    async def main() -> None:
        rows = [new_row(n=1) for _ in range(6)]
        await asyncio.gather(*(store.create_run(r, e) for r, _, e in rows))

        async def grow(row: RunRow, w: LogWriter) -> None:
            for _ in range(5):
                w, batch = log(3, w)
                await store.append(row.run_id, batch, summary_of(w))

        await asyncio.gather(*(grow(r, w) for r, w, _ in rows))
        for r, _, _ in rows:
            stored = await store.entries(r.run_id)
            assert len(stored) == 16 and verify_chain(stored) is None

    run(main)


# -- claims ----------------------------------------------------------------------------

def test_claim_lease_refuses_then_expires(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        a, b = "host-a.example:101", "host-b.example:202"  # other hosts: never "gone"
        await store.claim(row.run_id, a, 0.3)
        got = await store.get_run(row.run_id)
        assert got.owner == a and got.lease_until is not None
        assert got.lease_until > time.time()
        await store.claim(row.run_id, a, 0.3)  # re-claiming our own run is fine

        with pytest.raises(ClaimError) as err:
            await store.claim(row.run_id, b, 10)
        assert err.value.owner == a
        assert (await store.get_run(row.run_id)).owner == a

        await asyncio.sleep(0.4)  # the lease runs out
        await store.claim(row.run_id, b, 10)
        assert (await store.get_run(row.run_id)).owner == b
        with pytest.raises(ClaimError):
            await store.heartbeat(row.run_id, a, 10)  # a lost it
        with pytest.raises(ClaimError):
            await store.claim(row.run_id, a, 10)

    run(main)


def test_claim_force(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        await store.claim(row.run_id, "host-a.example:1", 60)
        with pytest.raises(ClaimError):
            await store.claim(row.run_id, "host-b.example:2", 60)
        await store.claim(row.run_id, "host-b.example:2", 60, force=True)
        got = await store.get_run(row.run_id)
        assert got.owner == "host-b.example:2"
        assert got.lease_until is not None and got.lease_until > time.time() + 50

    run(main)


def test_claim_taken_over_when_owner_process_is_gone(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        dead = f"{socket.gethostname()}:{proc.pid}"
        await store.claim(row.run_id, dead, 600)
        await store.claim(row.run_id, "host-b.example:2", 60)  # at once: no waiting
        assert (await store.get_run(row.run_id)).owner == "host-b.example:2"

        # a live process on this host keeps its claim
        other, _, other_entries = new_row()
        await store.create_run(other, other_entries)
        await store.claim(other.run_id, this_owner(), 600)
        with pytest.raises(ClaimError) as err:
            await store.claim(other.run_id, "host-b.example:2", 60)
        assert err.value.owner == this_owner()

    run(main)


def test_claim_next_takes_the_oldest_runnable_run(store: Store) -> None:
    """A worker's claim: the oldest run that is pending, running or retrying and that
    nobody holds -- not a finished or waiting one, a claimed one, a child run, or (given
    ``workflows``) one of another workflow."""
    async def main() -> None:
        t = time.time() - 100
        made = {}
        for i, (name, status, wf) in enumerate([
                ("done", "COMPLETED", "triage"), ("waits", "WAITING_APPROVAL", "triage"),
                ("held", "PENDING", "triage"), ("child", "PENDING", "triage"),
                ("other", "PENDING", "billing"), ("first", "PENDING", "triage"),
                ("second", "RUNNING", "triage"), ("third", "RETRYING", "triage")]):
            row, _, entries = new_row(f"{name}-{new_id()}", workflow=wf, status=status,
                                      created_at=t + i)
            if name == "child":
                row.options = {**row.options, "parent": {"run": "p", "node": "n"}}
            await store.create_run(row, entries)
            made[name] = row.run_id
        await store.claim(made["held"], "host-a.example:1", 60)
        for name, deadline in (("due", time.time() - 1), ("later", time.time() + 600),
                               ("never", None)):  # gates: the engine decides a due one
            row, _, entries = new_row(f"{name}-{new_id()}", workflow="gates",
                                      status="WAITING_APPROVAL", created_at=t)
            row.summary.waiting = {"node": "gate", "deadline": deadline}
            await store.create_run(row, entries)
            made[name] = row.run_id
        me = "host-b.example:2"
        assert await store.claim_next(me, 60, workflows=["gates"]) == made["due"]
        assert await store.claim_next(me, 60, workflows=["gates"]) is None
        assert await store.claim_next(me, 60, workflows=["nothing"]) is None
        assert await store.claim_next(me, 60, workflows=["billing"],
                                      exclude=[made["other"]]) is None
        assert await store.claim_next(me, 60, workflows=["billing"]) == made["other"]
        got = [await store.claim_next(me, 0.3, workflows={"triage"}) for _ in range(4)]
        assert got == [made["first"], made["second"], made["third"], None]
        row = await store.get_run(made["first"])
        assert row.owner == me and row.lease_until is not None
        await store.release(made["second"], me)  # released (a decision recorded): again
        assert await store.claim_next(me, 60) == made["second"]
        await asyncio.sleep(0.4)  # the 0.3 s leases of first and third ran out
        assert await store.claim_next("host-c.example:3", 60) == made["first"]
        assert await store.claim_next("host-c.example:3", 60) == made["third"]
        assert await store.claim_next("host-c.example:3", 60) is None

    run(main)


def test_claim_next_from_two_store_objects_gives_each_run_once(store: Store) -> None:
    """Claimers racing on one database (two store objects, several claims in flight on
    each): every run is claimed exactly once."""
    async def main() -> None:
        ids = set()
        for _ in range(20):
            row, _, entries = new_row(status="PENDING")
            await store.create_run(row, entries)
            ids.add(row.run_id)
        other = reopen(store)
        try:
            async def claimer(st: Store, who: str) -> list[str]:
                out = []
                while (rid := await st.claim_next(who, 60)) is not None:
                    out.append(rid)
                return out

            results = await asyncio.gather(*(claimer(st, f"host-{i}.example:{i}")
                                              for i, st in enumerate([store, other] * 3)))
        finally:
            if other is not store:
                await other.close()
        claimed = [rid for got in results for rid in got]
        assert sorted(claimed) == sorted(ids)  # each once
        for i, got in enumerate(results):
            for rid in got:
                assert (await store.get_run(rid)).owner == f"host-{i}.example:{i}"

    run(main)


def test_a_waiting_worker_is_woken_by_a_pending_run_and_an_unfinished_release(
        pg_schema_url: str) -> None:
    """PostgreSQL tells a worker idle in `wait_runnable` (LISTEN) of a detached run
    created and of a run released unfinished, by another process's store object."""
    async def main() -> None:
        waiter, other = open_store(pg_schema_url), open_store(pg_schema_url)
        try:
            await waiter.list_runs(limit=1)
            await waiter.wait_runnable(0.01)  # LISTENing from here on
            pending, _, pending_entries = new_row(status="PENDING")
            held, _, held_entries = new_row(status="RUNNING")
            held.owner, held.lease_until = "host-a.example:1", time.time() + 60
            await other.create_run(held, held_entries)  # claimed: nobody is told
            for make_runnable in (lambda: other.create_run(pending, pending_entries),
                                  lambda: other.release(held.run_id, "host-a.example:1")):
                woken = asyncio.create_task(waiter.wait_runnable(600))
                await asyncio.sleep(0.05)  # (waiting; a notification before it is kept too)
                await make_runnable()
                await asyncio.wait_for(woken, 30)  # woken, long before its 600 s
        finally:
            await waiter.close()
            await other.close()

    run(main)


def test_heartbeat_and_release(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        a, b = "host-a.example:1", "host-b.example:2"
        with pytest.raises(ClaimError):
            await store.heartbeat(row.run_id, a, 10)  # nobody holds it
        await store.claim(row.run_id, a, 5)
        first = (await store.get_run(row.run_id)).lease_until
        await asyncio.sleep(0.02)
        await store.heartbeat(row.run_id, a, 60)
        extended = (await store.get_run(row.run_id)).lease_until
        assert first is not None and extended is not None and extended > first + 50
        with pytest.raises(ClaimError) as err:
            await store.heartbeat(row.run_id, b, 60)
        assert err.value.owner == a

        await store.release(row.run_id, b)  # not ours: no error, no effect
        assert (await store.get_run(row.run_id)).owner == a
        await store.release(row.run_id, a)
        got = await store.get_run(row.run_id)
        assert got.owner is None and got.lease_until is None
        await store.release(row.run_id, a)  # again: no error
        await store.claim(row.run_id, b, 60)  # free for anyone
        assert (await store.get_run(row.run_id)).owner == b

    run(main)


# -- claim generations: a stale executor cannot write -----------------------------------

async def claimed(store: Store, run_id: str, owner: str, *, force: bool = False) -> Claim:
    """``owner``'s claim of the run (60 s), as the executor holds it."""
    generation = await store.claim(run_id, owner, 60, force=force)
    assert generation is not None
    return Claim(owner, generation)


def test_every_claim_bumps_the_generation(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        assert (await store.get_run(row.run_id)).generation == 0  # created unclaimed
        a, b = "host-a.example:1:x", "host-b.example:2:y"
        assert await store.claim(row.run_id, a, 60) == 1
        assert await store.claim(row.run_id, a, 60) == 2  # a claim again, by its owner too
        assert await store.claim(row.run_id, b, 60, force=True) == 3
        await store.release(row.run_id, b)
        assert await store.claim_next("host-c.example:3:z", 60) == row.run_id
        got = await store.get_run(row.run_id)
        assert (got.owner, got.generation) == ("host-c.example:3:z", 4)
        # a holder whose process is gone (on this host) is taken over: a claim too
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
        await store.claim(row.run_id, f"{socket.gethostname()}:{dead}:old", 60, force=True)
        assert await store.claim(row.run_id, a, 60) == 6
        # a run created claimed starts at the generation its row says (1: its first claim)
        made, _, first = new_row()
        made.owner, made.lease_until, made.generation = a, time.time() + 60, 1
        await store.create_run(made, first)
        assert (await store.get_run(made.run_id)).generation == 1
        assert await store.claim(made.run_id, a, 60) == 2

    run(main)


def test_a_stale_claims_append_is_refused_and_stores_nothing(store: Store) -> None:
    async def main() -> None:
        row, w, entries = new_row()
        await store.create_run(row, entries)
        a, b = "host-a.example:1:x", "host-b.example:2:y"
        mine = await claimed(store, row.run_id, a)
        _, more = log(2, w)
        await store.append(row.run_id, more, summary_of(w), claim=mine)  # current: stored
        theirs = await claimed(store, row.run_id, b, force=True)
        before = await store.get_run(row.run_id)
        _, late = log(2, w)  # the next seqs: they fit the log, the claim does not
        for release in (None, a):
            with pytest.raises(ClaimLost) as err:
                await store.append(row.run_id, late, summary_of(w, status="COMPLETED"),
                                   release, claim=mine)
            assert (err.value.owner, err.value.generation, err.value.held) == (b, 2, 1)
            text = str(err.value)
            assert f"moved to owner {b} (claim generation 2)" in text
            assert "held generation 1" in text and "nobody" not in text
        assert await store.entries(row.run_id) == entries + more  # nothing of it stored
        after = await store.get_run(row.run_id)
        assert after.summary == before.summary and after.owner == b  # nor its summary
        assert isinstance(err.value, ClaimError)  # (callers catching ClaimError see it)
        await store.append(row.run_id, late, summary_of(w), claim=theirs)  # theirs is current
        assert await store.entries(row.run_id) == entries + more + late
        # released by its owner, then claimed by nobody: the claim is still the latest one
        await store.release(row.run_id, b)
        _, last = log(1, w)
        await store.append(row.run_id, last, summary_of(w), claim=theirs)
        with pytest.raises(ClaimLost):
            await store.append(row.run_id, log(1, w)[1], summary_of(w), claim=mine)

    run(main)


def test_a_stale_claims_append_in_a_group_commit_fails_alone(store: Store) -> None:
    async def main() -> None:
        (x, wx, ex), (y, wy, ey) = new_row(), new_row()
        for row, entries in ((x, ex), (y, ey)):
            await store.create_run(row, entries)
        gx = await claimed(store, x.run_id, "a:1:x")
        gy = await claimed(store, y.run_id, "a:1:y")
        await store.claim(x.run_id, "b:2:x", 60, force=True)  # x moved on
        _, mx = log(2, wx)
        _, my = log(2, wy)
        async with one_turn(store):
            results = await asyncio.gather(
                store.append(x.run_id, mx, summary_of(wx), claim=gx),
                store.append(y.run_id, my, summary_of(wy), claim=gy),
                return_exceptions=True)
        assert isinstance(results[0], ClaimLost) and results[1] is None
        assert await store.entries(x.run_id) == ex
        assert await store.entries(y.run_id) == ey + my

    run(main)


def test_a_stale_claim_can_neither_renew_nor_release(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        a, b = "host-a.example:1:x", "host-b.example:2:y"
        mine = await claimed(store, row.run_id, a)
        await store.heartbeat(row.run_id, a, 60, mine.generation)
        theirs = await claimed(store, row.run_id, b, force=True)
        with pytest.raises(ClaimLost) as err:
            await store.heartbeat(row.run_id, a, 60, mine.generation)
        assert (err.value.owner, err.value.generation) == (b, theirs.generation)
        assert "nobody" not in str(err.value)
        with pytest.raises(ClaimLost):  # its owner, an older generation: stale too
            await store.heartbeat(row.run_id, b, 60, mine.generation)
        # the lease keeper's renewals, from a thread with a connection of its own
        renewer = store.lease_renewer()
        assert renewer is not None
        lease_before = (await store.get_run(row.run_id)).lease_until
        try:
            with pytest.raises(ClaimLost):
                await asyncio.to_thread(renewer.renew, row.run_id, mine, 60)
            await asyncio.sleep(0.01)
            await asyncio.to_thread(renewer.renew, row.run_id, theirs, 120)
        finally:
            await asyncio.to_thread(renewer.close)
        got = await store.get_run(row.run_id)
        assert got.lease_until is not None and lease_before is not None
        assert got.lease_until > lease_before + 30 and got.owner == b
        await store.release(row.run_id, a)  # a stale release: no error, no effect
        got = await store.get_run(row.run_id)
        assert (got.owner, got.generation) == (b, theirs.generation)

    run(main)


# -- real processes --------------------------------------------------------------------

_RACER = r"""
import asyncio, sys, time
from interlock._log import LogWriter
from interlock._store import ConflictError, Summary, open_store

url, run_id, tag, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

async def main():
    store = open_store(url)
    try:
        for k in range(rounds):
            last = (await store.entries(run_id))[-1]  # also opens the connection
            w = LogWriter(last.seq, last.hash)
            _, e = w.make("approval.decided", {"node": "gate", "by": tag, "round": k})
            summary = Summary(status="RUNNING", last_seq=w.seq, last_hash=w.hash,
                              updated_at=time.time())
            print("ready", e.seq, flush=True)
            sys.stdin.readline()  # the start barrier: both go at once
            try:
                await store.append(run_id, [e], summary)
            except ConflictError:
                print("conflict", e.seq, flush=True)
            else:
                print("ok", e.seq, flush=True)
    finally:
        await store.close()

asyncio.run(main())
"""


def test_a_run_created_with_an_owner_is_claimed_by_it(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        row.owner, row.lease_until = "host:1:first", time.time() + 30
        await store.create_run(row, entries)
        got = await store.get_run(row.run_id)
        assert got.owner == "host:1:first"
        assert got.lease_until is not None and got.lease_until > time.time() + 20
        with pytest.raises(ClaimError):
            await store.claim(row.run_id, "host:1:second", 30)

    run(main)


def test_an_append_with_release_gives_up_only_its_owners_lease(store: Store) -> None:
    async def main() -> None:
        row, w, entries = new_row()
        await store.create_run(row, entries)
        await store.claim(row.run_id, "host:1:me", 30)
        _, more = log(1, w)
        await store.append(row.run_id, more, summary_of(w), release="host:1:other")
        assert (await store.get_run(row.run_id)).owner == "host:1:me"  # not theirs to give
        _, last = log(1, w)
        await store.append(row.run_id, last, summary_of(w, status="COMPLETED"),
                           release="host:1:me")
        got = await store.get_run(row.run_id)
        assert (got.owner, got.lease_until, got.summary.status) == (None, None, "COMPLETED")
        assert await store.entries(row.run_id) == entries + more + last
        await store.claim(row.run_id, "host:1:next", 30)  # free for the next executor

    run(main)


@contextlib.asynccontextmanager
async def one_turn(store: Store) -> AsyncIterator[None]:
    """Whatever is appended inside goes to the store's next turn together: a SQLite
    store's writer thread is held by a job until the block ends, so the appends queue
    behind it (the PostgreSQL store's committer takes every append queued by the time it
    runs, and appends made in one loop iteration are; the memory store has no turns)."""
    if not isinstance(store, SQLiteStore):
        yield
        return
    held, release = threading.Event(), threading.Event()

    def hold(_conn: Any) -> None:
        held.set()
        release.wait(30)

    job = asyncio.ensure_future(store._call(hold))
    await asyncio.to_thread(held.wait, 30)
    try:
        yield
    finally:
        release.set()
        await job


def test_a_refused_append_in_a_group_commit_fails_only_its_caller(store: Store) -> None:
    """A second executor of run a appends the seq its first executor has just stored, in
    one turn (one transaction) with two other runs' appends: only its append fails, the
    others are stored, and run a keeps its first executor's records."""
    async def main() -> None:
        made = [new_row() for _ in range(3)]
        for row, _, entries in made:
            await store.create_run(row, entries)
        (a, wa, a0), (b, wb, b0), (c, wc, c0) = made
        rival = LogWriter(wa.seq, wa.hash)  # a second executor of run a, from the same seq
        _, ea = log(2, wa, node="first")
        await store.append(a.run_id, ea, summary_of(wa))
        _, eb = log(2, wb)
        _, e_rival = log(2, rival, node="rival")
        _, ec = log(1, wc)
        spy = _BatchSpy.install(store)
        async with one_turn(store):
            outcomes = await asyncio.gather(
                store.append(b.run_id, eb, summary_of(wb)),
                store.append(a.run_id, e_rival, summary_of(rival, status="FAILED")),
                store.append(c.run_id, ec, summary_of(wc, steps=7)),
                return_exceptions=True)
        assert [type(o).__name__ for o in outcomes] == ["NoneType", "ConflictError",
                                                        "NoneType"]
        assert "another writer" in str(outcomes[1])
        if not isinstance(store, MemoryStore):
            assert spy.turns == [3]  # one transaction for the three
        for (row, w, _), more in ((made[0], a0 + ea), (made[1], b0 + eb),
                                      (made[2], c0 + ec)):
            assert await store.entries(row.run_id) == more
            got = (await store.get_run(row.run_id)).summary
            assert (got.status, got.last_seq, got.last_hash) == ("RUNNING", w.seq, w.hash)
        assert (await store.get_run(c.run_id)).summary.steps == 7
        assert b"rival" not in b"".join(e.data for e in await store.entries(a.run_id))

    run(main)


def test_a_group_commit_with_a_missing_run_stores_the_others(store: Store) -> None:
    async def main() -> None:
        row, w, first = new_row()
        await store.create_run(row, first)
        _, more = log(2, w)
        ghost_w, ghost = log(2)
        async with one_turn(store):
            outcomes = await asyncio.gather(
                store.append("no-such-run", ghost, summary_of(ghost_w)),
                store.append(row.run_id, more, summary_of(w)),
                return_exceptions=True)
        assert isinstance(outcomes[0], RunNotFound) and outcomes[1] is None
        assert await store.entries(row.run_id) == first + more

    run(main)


def test_a_taken_run_id_in_a_group_commit_fails_only_its_creator(store: Store) -> None:
    async def main() -> None:
        taken, w, first = new_row()
        await store.create_run(taken, first)
        fresh, _, fresh_entries = new_row()
        again, _, again_entries = new_row(taken.run_id)
        _, more = log(2, w)
        async with one_turn(store):
            outcomes = await asyncio.gather(
                store.create_run(fresh, fresh_entries),
                store.create_run(again, again_entries),
                store.append(taken.run_id, more, summary_of(w)),
                return_exceptions=True)
        assert outcomes[0] is None and isinstance(outcomes[1], RunExists) \
            and outcomes[2] is None
        assert await store.entries(fresh.run_id) == fresh_entries
        assert await store.entries(taken.run_id) == first + more

    run(main)


def _insert_stray_record(url: str, run_id: str) -> None:
    """A record row of a run that has no row (what a run deleted behind the store's back
    leaves behind), written behind the store's back. SQLite keys a run's records by the
    run's number in the file: the stray one is where the next run's number would be."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        with conn:
            conn.execute("INSERT INTO entries VALUES (((SELECT max(run_key) FROM runs) + 1) "
                         "<< 32 | 1, '{}', zeroblob(32))")
        conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("INSERT INTO records VALUES (%s, %s, %s, %s, %s, %s)",
                   (run_id, 1, "run.started", None, "{}", "00" * 32))


def test_a_write_that_fails_the_whole_statement_is_retried_alone(durable_url: str) -> None:
    """A new run whose id has leftover records fails its turn's statement as a whole
    (PostgreSQL: a unique violation); the turn's other writes are stored all the same and
    only its creator gets the error. In SQLite, where a new run's records never share a
    key with leftovers, the new run is stored with its own log alone."""
    sqlite = durable_url.startswith("sqlite")

    async def main() -> None:
        store = open_store(durable_url)
        try:
            row, w, first = new_row()
            await store.create_run(row, first)  # the schema exists now
            stray, _, stray_entries = new_row()
            _insert_stray_record(durable_url, stray.run_id)
            fresh, _, fresh_entries = new_row()
            _, more = log(2, w)
            async with one_turn(store):
                outcomes = await asyncio.gather(
                    store.create_run(stray, stray_entries),
                    store.append(row.run_id, more, summary_of(w)),
                    store.create_run(fresh, fresh_entries),
                    return_exceptions=True)
            if sqlite:
                assert outcomes == [None, None, None]
                assert await store.entries(stray.run_id) == stray_entries
            else:
                assert isinstance(outcomes[0], ConflictError), outcomes
                assert outcomes[1:] == [None, None]
                with pytest.raises(RunNotFound):
                    await store.get_run(stray.run_id)
            assert await store.entries(row.run_id) == first + more
            assert await store.entries(fresh.run_id) == fresh_entries
        finally:
            await store.close()

    run(main)


class _BatchSpy:
    """Counts the appends of each transaction with more than one (SQLite, PostgreSQL)."""

    def __init__(self) -> None:
        self.turns: list[int] = []

    @classmethod
    def install(cls, store: Store) -> _BatchSpy:
        spy = cls()
        if isinstance(store, SQLiteStore):
            inner = store._together

            def counting(conn: Any, batch: list[Any]) -> Any:
                spy.turns.append(len(batch))
                return inner(conn, batch)

            store._together = counting  # type: ignore[method-assign]
        elif not isinstance(store, MemoryStore):
            inner_pg = store._write_many  # type: ignore[attr-defined]

            async def counting_pg(turn: list[Any]) -> Any:
                spy.turns.append(len(turn))
                return await inner_pg(turn)

            store._write_many = counting_pg  # type: ignore[attr-defined]
        return spy


def test_two_processes_race_for_the_same_seq(durable_url: str) -> None:
    rounds = 5
    row, _, entries = new_row(n=3)

    async def setup() -> None:
        s = open_store(durable_url)
        try:
            await s.create_run(row, entries)
        finally:
            await s.close()

    run(setup)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    procs = {
        tag: subprocess.Popen(
            [sys.executable, "-c", _RACER, durable_url, row.run_id, tag, str(rounds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, cwd=REPO,
        )
        for tag in ("left", "right")
    }

    def kill_all() -> None:  # a hung child must fail the test, not hang it
        for p in procs.values():
            p.kill()

    def line(tag: str) -> list[str]:
        p = procs[tag]
        assert p.stdout is not None and p.stderr is not None
        words = p.stdout.readline().split()
        if len(words) != 2:  # the child died or hung: show why
            kill_all()
            pytest.fail(f"racer {tag} said {words}; its stderr:\n{p.stderr.read()}")
        return words

    watchdog = threading.Timer(30, kill_all)
    watchdog.start()
    winners: dict[int, str] = {}
    try:
        for k in range(rounds):
            seq = len(entries) + k + 1
            for tag in procs:
                assert line(tag) == ["ready", str(seq)]
            for p in procs.values():  # release both as close together as possible
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = {}
            for tag in procs:
                result, got_seq = line(tag)
                assert got_seq == str(seq)
                results[tag] = result
            assert sorted(results.values()) == ["conflict", "ok"], (k, results)
            winners[seq] = next(t for t, r in results.items() if r == "ok")
        for tag, p in procs.items():
            _, err = p.communicate(timeout=20)
            assert p.returncode == 0, (tag, err)
    finally:
        watchdog.cancel()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()

    async def check() -> None:
        s = open_store(durable_url)
        try:
            stored = await s.entries(row.run_id)
            assert [e.seq for e in stored] == list(range(1, len(entries) + rounds + 1))
            assert verify_chain(stored) is None
            for e in stored[len(entries):]:
                assert e.record()["by"] == winners[e.seq]
            got = await s.get_run(row.run_id)
            assert got.summary.last_seq == stored[-1].seq
            assert got.summary.last_hash == stored[-1].hash
        finally:
            await s.close()

    run(check)


def test_durable_reopen_sees_everything(durable_url: str) -> None:
    row, _, entries = new_row(n=4)

    async def write() -> None:
        s = open_store(durable_url)
        await s.create_run(row, entries)
        await s.claim(row.run_id, "host-a.example:1", 60)
        await s.close()

    async def read() -> None:
        s = open_store(durable_url)
        try:
            got = await s.get_run(row.run_id)
            assert got.owner == "host-a.example:1"
            assert got.generation == 1  # the claim's
            got.owner = got.lease_until = None
            got.generation = 0
            assert got == row
            assert await s.entries(row.run_id) == entries
        finally:
            await s.close()

    run(write)
    run(read)


# -- SQLite specifics ------------------------------------------------------------------

def _sqlite_store_at(path: Path) -> SQLiteStore:
    return SQLiteStore(f"sqlite:///{path}")


def test_sqlite_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(os.urandom(8192))
    before = path.read_bytes()
    store = _sqlite_store_at(path)

    async def main() -> None:
        try:
            with pytest.raises(StoreError, match="not a SQLite database") as err:
                await store.get_run("x")
            assert str(path) in str(err.value)
            row, _, entries = new_row()
            with pytest.raises(StoreError):
                await store.create_run(row, entries)
        finally:
            await store.close()

    run(main)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


def test_sqlite_refuses_a_foreign_database(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    store = _sqlite_store_at(path)

    async def main() -> None:
        try:
            with pytest.raises(StoreError, match="something else") as err:
                await store.list_runs()
            assert str(path) in str(err.value) and "users" in str(err.value)
            row, _, entries = new_row()
            with pytest.raises(StoreError):
                await store.create_run(row, entries)
        finally:
            await store.close()

    run(main)
    assert path.read_bytes() == before
    check = sqlite3.connect(path)
    tables = [r[0] for r in check.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    check.close()
    assert tables == ["users"]


def test_sqlite_file_is_readable_with_plain_sqlite(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore("sqlite:///nested/dir/runs.db")  # relative, parents created
    row, _, entries = new_row(n=3)

    async def main() -> None:
        try:
            await store.create_run(row, entries)
        finally:
            await store.close()

    run(main)
    path = tmp_path / "nested" / "dir" / "runs.db"
    assert path.exists()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        meta = dict(conn.execute("SELECT key, value FROM interlock_meta"))
        assert meta == {"schema": "interlock", "version": "3"}
        rows = conn.execute(
            "SELECT seq, type, node, typeof(data), json_extract(data, '$.type'), data, hash "
            "FROM records WHERE run_id = ? ORDER BY seq", (row.run_id,)).fetchall()
        assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
            (e.seq, e.type, e.record().get("node"), "text", e.type) for e in entries]
        assert [r[5].encode() for r in rows] == [e.data for e in entries]
        assert [r[6] for r in rows] == [e.hash for e in entries]  # hex, as verify shows it
        status, definition = conn.execute(
            "SELECT status, json_extract(definition, '$.nodes.zeta.kind') "
            "FROM runs JOIN run_specs USING (run_key)").fetchone()
        assert (status, definition) == ("RUNNING", "function")
    finally:
        conn.close()
    # and the store reopens its own file
    again = SQLiteStore(f"sqlite:///{path}")

    async def reopen_main() -> None:
        try:
            assert await again.entries(row.run_id) == entries
        finally:
            await again.close()

    run(reopen_main)


def test_sqlite_url_parameters(tmp_path: Path) -> None:
    async def pragma(store: SQLiteStore) -> int:
        try:
            value: int = await store._call(
                lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
            return value
        finally:
            await store.close()

    assert asyncio.run(pragma(SQLiteStore(f"sqlite:///{tmp_path}/a.db"))) == 1  # NORMAL
    full = SQLiteStore(f"sqlite:///{tmp_path}/b.db?synchronous=full&busy_timeout=2000")
    assert asyncio.run(pragma(full)) == 2  # FULL
    for bad in (f"sqlite:///{tmp_path}/c.db?synchronous=sometimes",
                f"sqlite:///{tmp_path}/c.db?colour=blue", "sqlite://relative.db", "sqlite:///"):
        with pytest.raises(StoreError):
            SQLiteStore(bad)
    assert not (tmp_path / "c.db").exists()


def test_sqlite_checkpoints_on_a_thread_of_its_own_not_in_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import interlock._store._sqlite_wal as sq

    monkeypatch.setattr(sq, "CHECKPOINT_EVERY", 4)
    path = tmp_path / "runs.db"
    store = _sqlite_store_at(path)
    row, w, entries = new_row()

    async def main() -> None:
        try:
            await store.create_run(row, entries)
            # the writer's connection never checkpoints on commit
            assert await store._call(
                lambda conn: conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
            in_file = path.stat().st_size  # the schema and the run are still in the WAL
            ck = store._checkpointer
            assert ck is not None and not ck.ran.is_set()
            for _ in range(3):
                _, more = log(2, w)
                await store.append(row.run_id, more, summary_of(w))
            assert ck.ran.wait(10), "no checkpoint after CHECKPOINT_EVERY jobs"
            assert path.stat().st_size > in_file  # the WAL's pages were copied back
            assert await store.entries(row.run_id) == entries + (await store.entries(
                row.run_id, after=len(entries)))
        finally:
            await store.close()

    run(main)
    assert not Path(f"{path}-wal").exists()  # closed: the whole WAL is in the file


def test_sqlite_checkpoints_after_so_many_bytes_of_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import interlock._store._sqlite_wal as sq

    monkeypatch.setattr(sq, "CHECKPOINT_BYTES", 2000)  # jobs alone would not trigger one
    store = _sqlite_store_at(tmp_path / "runs.db")
    row, w, entries = new_row()

    async def main() -> None:
        try:
            await store.create_run(row, entries)
            writer = LogWriter(w.seq, w.hash)
            _, entry = writer.make("node.completed", {"node": "n", "update": {"t": "x" * 3000}})
            await store.append(row.run_id, [entry], summary_of(writer))
            await store.list_runs()  # the next job asks for the checkpoint
            ck = store._checkpointer
            assert ck is not None and ck.ran.wait(10)
        finally:
            await store.close()

    run(main)


def test_sqlite_checkpoints_on_commit_again_if_its_checkpointer_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import interlock._store._sqlite_thread as sqt
    import interlock._store._sqlite_wal as sq

    def broken(self: Any) -> None:
        self.failed = "unable to open database file"

    monkeypatch.setattr(sq, "CHECKPOINT_EVERY", 2)
    monkeypatch.setattr(sqt._Checkpointer, "_main", broken)
    store = _sqlite_store_at(tmp_path / "runs.db")
    row, w, entries = new_row()

    async def main() -> None:
        try:
            await store.create_run(row, entries)
            for _ in range(2):
                _, more = log(2, w)
                await store.append(row.run_id, more, summary_of(w))
            assert await store._call(
                lambda conn: conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 1000
            assert store._checkpointer is None
            assert len(await store.entries(row.run_id)) == w.seq
        finally:
            await store.close()

    run(main)


def test_sqlite_empty_existing_file_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.touch()
    store = _sqlite_store_at(path)
    row, _, entries = new_row()

    async def main() -> None:
        try:
            await store.create_run(row, entries)
            assert await store.entries(row.run_id) == entries
        finally:
            await store.close()

    run(main)



def test_sqlite_stores_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Processes (here: stores of their own, each with its connection and thread) that
    open one new file at the same moment all get it. Two connections turning a new file
    to WAL at once: SQLite refuses one of them at once with "database is locked" (a
    deadlock it avoids, so without waiting for the busy timeout); the store retries that
    within its busy timeout, so no run fails to start."""

    async def main(path: Path) -> None:
        stores = [_sqlite_store_at(path) for _ in range(4)]
        for store in stores:  # their threads up and waiting: the opens start together
            store._thread()
        rows = [new_row() for _ in stores]
        try:
            await asyncio.gather(*(s.create_run(row, entries)
                                   for s, (row, _, entries) in zip(stores, rows, strict=True)))
            assert {r.run_id for r in await stores[0].list_runs()} \
                == {row.run_id for row, _, _ in rows}
        finally:
            for store in stores:
                await store.close()

    for k in range(40):  # the race is narrow: without the retry, some of these fail
        run(lambda k=k: main(tmp_path / f"runs{k}.db"))  # type: ignore[misc]

# -- PostgreSQL specifics --------------------------------------------------------------

def test_postgres_refuses_foreign_tables(pg_schema_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE runs (id serial PRIMARY KEY, note text)")
        conn.execute("INSERT INTO runs (note) VALUES ('theirs')")
    store = open_store(pg_schema_url)

    async def main() -> None:
        try:
            with pytest.raises(StoreError, match=r"not an\s+interlock store"):
                await store.list_runs()
        finally:
            await store.close()

    run(main)
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        assert conn.execute("SELECT note FROM runs").fetchall() == [("theirs",)]
        assert conn.execute("SELECT to_regclass('interlock_meta')").fetchone() == (None,)


def test_postgres_url_in_errors_hides_the_password() -> None:
    pytest.importorskip("psycopg")
    from interlock._store._postgres import PostgresStore

    store = PostgresStore("postgresql://user:s3cret@127.0.0.1:1/db", connect_timeout=2)

    async def main() -> None:
        with pytest.raises(StoreError) as err:
            await store.get_run("x")
        assert "s3cret" not in str(err.value) and "***" in str(err.value)
        await store.close()

    run(main)



def test_cancel_request_is_seen_by_every_reader(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        assert await store.cancel_requested(row.run_id) is None
        await store.request_cancel(row.run_id, "alice")
        seen = await store.cancel_requested(row.run_id)
        assert seen is not None and seen["by"] == "alice" and seen["at"] > 0
        assert (await store.get_run(row.run_id)).summary.status == row.summary.status
        with pytest.raises(RunNotFound):
            await store.request_cancel("no-such-run", "alice")

    asyncio.run(main())


def test_one_decision_is_offered_per_gate_even_at_once(store: Store) -> None:
    """`Store.offer_decision` (several gates at once): the first offer on a gate is kept,
    a later one gets the kept one back; offers on two gates are both kept; many at once
    on one gate -- one wins. Kept with the run, not in its summary."""
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        assert await store.decisions(row.run_id) == {}
        assert await store.offer_decision(row.run_id, "a#1", {"by": "alice"}) is None
        assert await store.offer_decision(row.run_id, "a#1", {"by": "bob"}) == {"by": "alice"}
        assert await store.offer_decision(row.run_id, "b#1", {"by": "bob"}) is None
        assert await store.decisions(row.run_id) == {"a#1": {"by": "alice"},
                                                     "b#1": {"by": "bob"}}
        won = await asyncio.gather(*(store.offer_decision(row.run_id, "c#1", {"by": str(i)})
                                     for i in range(8)))
        assert sum(w is None for w in won) == 1
        await store.request_cancel(row.run_id, "carol")  # another use of the row's extra
        assert set(await store.decisions(row.run_id)) == {"a#1", "b#1", "c#1"}
        assert (await store.get_run(row.run_id)).summary.status == row.summary.status
        with pytest.raises(RunNotFound):
            await store.offer_decision("no-such-run", "a#1", {})

    asyncio.run(main())


def test_snapshots_keep_the_latest(store: Store) -> None:
    async def main() -> None:
        row, _, entries = new_row()
        await store.create_run(row, entries)
        assert await store.load_snapshot(row.run_id) is None
        await store.save_snapshot(row.run_id, 5, b'{"a": 1}')
        await store.save_snapshot(row.run_id, 9, b'{"b": 2}')
        await store.save_snapshot(row.run_id, 7, b'{"stale": true}')  # an older one loses
        assert await store.load_snapshot(row.run_id) == (9, b'{"b": 2}')

    asyncio.run(main())


_OPEN_READ_CLOSE = """
import asyncio, sys
from interlock._store import open_store

async def main():
    for _ in range(int(sys.argv[2])):
        store = open_store(sys.argv[1])
        await store.list_runs()
        await store.close()

asyncio.run(main())
"""


def test_sqlite_a_second_store_in_one_process_keeps_the_first_ones_locks(
        tmp_path: Path) -> None:
    """Opening a second store on a file another store of this process holds, while another
    process opens and closes the file, must not corrupt it: on Linux closing *any*
    descriptor of a file drops every POSIX lock the process holds on it, so a raw
    ``open()`` of the database let the other process delete the WAL still in use."""
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    written: list[str] = []

    async def main() -> None:
        holder = open_store(url)
        try:
            for round_ in range(6):
                for _ in range(5):
                    row, w, entries = new_row()
                    await holder.create_run(row, entries)
                    written.append(row.run_id)
                    _, more = log(6, w)
                    await holder.append(row.run_id, more, summary_of(w))
                second = open_store(url)  # a second store of this process, same file
                await second.list_runs()
                await second.close()
                # another process opens and closes the file while the holder is open
                subprocess.run([sys.executable, "-c", _OPEN_READ_CLOSE, url, "3"],
                               check=True, cwd=REPO, timeout=60)
                assert len(await holder.list_runs(limit=1000)) == len(written), round_
        finally:
            await holder.close()

    run(main)
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored = {r for (r,) in check.execute("SELECT run_id FROM runs")}
    finally:
        check.close()
    assert stored == set(written)


# -- pruning ---------------------------------------------------------------------------

def test_delete_finished_removes_only_finished_unclaimed_runs_with_their_records(
        store: Store) -> None:
    async def main() -> None:
        done, _, done_log = new_row(status="COMPLETED", n=5)
        failed, _, failed_log = new_row(status="FAILED", n=3)
        waiting, _, waiting_log = new_row(status="WAITING_APPROVAL", n=2)
        claimed, _, claimed_log = new_row(status="CANCELLED", n=2)
        for row, entries in ((done, done_log), (failed, failed_log), (waiting, waiting_log),
                             (claimed, claimed_log)):
            await store.create_run(row, entries)
        await store.save_snapshot(done.run_id, 3, b"cached")
        await store.claim(claimed.run_id, "host:1", 30.0)
        deleted, records = await store.delete_finished(
            [done.run_id, failed.run_id, waiting.run_id, claimed.run_id, "no-such-run"])
        assert sorted(deleted) == sorted([done.run_id, failed.run_id])
        assert records == 8
        for gone in (done.run_id, failed.run_id):
            with pytest.raises(RunNotFound):
                await store.get_run(gone)
        try:  # (a store may say the run is gone, or that it has no snapshot)
            snapshot = await store.load_snapshot(done.run_id)
        except RunNotFound:
            snapshot = None
        assert snapshot is None
        assert len(await store.entries(waiting.run_id)) == 2
        assert len(await store.entries(claimed.run_id)) == 2
        assert await store.delete_finished([]) == ([], 0)

    run(main)
