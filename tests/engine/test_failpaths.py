"""The executor's failure paths (issue 26): a store that refuses a record, a fold that
refuses one, a long skipped chain, tokens charged from many threads -- a run never hangs,
never forks or gaps its log, and never takes an outage of its store for a node's failure.

The store's failures are injected with `interlock.testing.FaultyStore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sys
from pathlib import Path
from typing import Any

import pytest
import test_store_conformance as conformance

import interlock
from interlock import END, START, Workflow
from interlock._engine import _journal
from interlock._errors import ConflictError, StoreError
from interlock._ops._load import load_run
from interlock._store import open_store
from interlock.testing import FaultyStore

pg_schema_url = conformance.pg_schema_url  # a fixture: a fresh schema on $INTERLOCK_TEST_POSTGRES

HANG = 30.0  # a run that has not returned by then hangs (the guard, not a timing)


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed append is tried again for 0.3 s (10 s by default), to keep tests short."""
    monkeypatch.setattr(_journal, "RETRY_SECONDS", 0.3, raising=False)


def faulty(url: str = "memory://") -> FaultyStore:
    return FaultyStore(open_store(url))


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store (PostgreSQL with ``$INTERLOCK_TEST_POSTGRES``): each reports a refused
    append its own way (a conflict found by a read, a unique key, a lost answer)."""
    found: str = conformance._url_for(request.param, request, tmp_path)
    return found


async def _run(wf: Workflow, store: FaultyStore, **kw: Any) -> interlock.RunResult:
    return await asyncio.wait_for(wf.run(store=store, **kw), HANG)


async def _only_run(store: FaultyStore) -> str:
    rows = await store.inner.list_runs()
    assert len(rows) == 1
    return rows[0].run_id


def fan_with_retry(attempts: list[int], b2_takes: float = 0.4) -> Workflow:
    """``a -> (b1, b2) -> join``; ``b1`` fails its first attempt after 0.2 s, then
    succeeds (``retry:``); ``b2`` takes ``b2_takes`` seconds: both run as tasks."""
    async def a(state: dict[str, Any]) -> dict[str, Any]:
        return {"a": 1}

    async def b1(state: dict[str, Any]) -> dict[str, Any]:
        attempts.append(1)
        await asyncio.sleep(0.2)
        if len(attempts) == 1:
            raise RuntimeError("flaky")
        return {"b1": 1}

    async def b2(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(b2_takes)
        return {"b2": 1}

    async def join(state: dict[str, Any]) -> dict[str, Any]:
        return {"joined": state["b1"] + state["b2"]}

    wf = Workflow("fan-retry")
    wf.node("a", a).node("b1", b1, retry={"attempts": 3, "backoff": "0s"})
    wf.node("b2", b2).node("join", join)
    wf.edge(START, "a").edge("a", ["b1", "b2"]).edge(["b1", "b2"], "join")
    wf.edge("join", END)
    return wf


# -- a visit always delivers an outcome ----------------------------------------------------


@pytest.mark.parametrize("b2_takes", [0.02, 0.4], ids=["b2-done-first", "b2-running"])
def test_a_store_refusing_a_retry_record_in_a_task_does_not_hang_the_run(
        b2_takes: float, url: str) -> None:
    """The issue's repro: the append holding ``node.retrying`` (committed by the Retry
    guard inside a visit running as a task) fails for good. Before: the task died
    silently; with ``b2`` done already the loop waited for its outcome for ever (its
    lease renewed), with ``b2`` still running its completion found a gap in the log
    and blamed "another writer"."""
    async def go() -> None:
        store = faulty(url)
        fault = store.fail_append(holding="node.retrying", times=None)
        with pytest.raises(StoreError, match="could not be stored") as err:
            await _run(fan_with_retry([], b2_takes), store)
        assert "node.retrying" not in str(err.value)  # the store's cause, named
        assert "FaultyStore: append failed" in str(err.value)
        assert fault.hits >= 2  # tried again before giving up
        run_id = await _only_run(store)
        row = await store.inner.get_run(run_id)
        assert row.summary.status == "RUNNING" and row.owner is None  # left for takeover
        assert (await interlock.verify(run_id, store=store.inner)).ok
        # a healthy store: the run is continued to its end
        store.heal()
        done = await asyncio.wait_for(fan_with_retry([1]).resume(run_id, store=store), HANG)
        assert done.status == "COMPLETED" and done.state["joined"] == 2
        assert (await interlock.verify(run_id, store=store)).ok
        await store.close()

    asyncio.run(go())


def test_a_bug_in_a_visit_task_fails_the_run_with_its_records_committed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a node's error (those are its outcome) but the engine's own, in a visit
    running as a task: the run ends FAILED (an internal error), not RUNNING for ever."""
    from interlock._engine._call import NodeCall

    visit = NodeCall.visit

    async def broken(self: NodeCall, pn: Any, *args: Any, **kw: Any) -> Any:
        if pn.name == "b1":
            raise RuntimeError("a bug in the node call")
        return await visit(self, pn, *args, **kw)

    monkeypatch.setattr(NodeCall, "visit", broken)

    async def go() -> None:
        store = faulty()
        result = await _run(fan_with_retry([], 0.0), store)
        assert result.status == "FAILED"
        assert result.error is not None and result.error["type"] == "internal_error"
        assert "a bug in the node call" in result.error["message"]
        assert (await store.get_run(result.run_id)).owner is None
        assert (await interlock.verify(result.run_id, store=store)).ok

    asyncio.run(go())


def test_an_append_that_fails_once_is_tried_again_and_the_run_completes() -> None:
    async def go() -> None:
        store = faulty()
        fault = store.fail_append(holding="node.retrying")
        result = await _run(fan_with_retry([]), store)
        assert fault.hits == 1
        assert result.status == "COMPLETED" and result.state["joined"] == 2
        assert (await interlock.verify(result.run_id, store=store)).ok
        records = await interlock.trace(result.run_id, store=store)
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))

    asyncio.run(go())


def test_an_append_whose_answer_was_lost_is_not_stored_twice(url: str) -> None:
    """The append was committed, then failed (a connection dropped after the commit):
    the retry finds the same records with the same hashes and counts it done."""
    async def go() -> None:
        store = faulty(url)
        fault = store.fail_append(holding="node.retrying", after=True)
        result = await _run(fan_with_retry([]), store)
        assert fault.hits == 1
        assert result.status == "COMPLETED"
        records = await interlock.trace(result.run_id, store=store)
        assert sum(r["type"] == "node.retrying" for r in records) == 1
        assert (await interlock.verify(result.run_id, store=store)).ok
        await store.close()

    asyncio.run(go())


def test_a_store_error_in_a_mapped_nodes_item_ends_the_run() -> None:
    """A map's items run in a task group: a store error in one is the run's error."""
    async def work(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"out": state["x"] * 2}

    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": list(range(6))}

    def workflow() -> Workflow:
        return (Workflow("map-fault", state={"out": "append"}).node("fan", fan)
                .node("work", work).edge(START, "fan")
                .map("fan", "xs", "work", as_="x", max_concurrency=2).edge("work", END))

    async def go() -> None:
        store = faulty()
        store.fail_append(nth=3, when=lambda es: any(e.type == "node.completed"
                                                     for e in es), times=None)
        with pytest.raises(StoreError, match="could not be stored"):
            await _run(workflow(), store)
        run_id = await _only_run(store)
        assert (await store.inner.get_run(run_id)).owner is None
        store.heal()
        done = await asyncio.wait_for(workflow().resume(run_id, store=store), HANG)
        assert done.status == "COMPLETED" and sorted(done.state["out"]) == \
            [0, 2, 4, 6, 8, 10]
        assert (await interlock.verify(run_id, store=store)).ok

    asyncio.run(go())


# -- the journal never drops or gaps ------------------------------------------------------


def chain() -> Workflow:
    async def step(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state.get("n", 0) + 1}

    wf = Workflow("chain")
    for name in ("a", "b", "c"):
        wf.node(name, step)
    return wf.edge(START, "a").edge("a", "b").edge("b", "c").edge("c", END)


def test_a_full_disk_is_reported_as_such_not_as_another_writer(url: str) -> None:
    """Before: the first failed append dropped its batch, every later one found a gap
    and said "another writer got there first" (there was none)."""
    async def go() -> None:
        store = faulty(url)
        store.fail_append(nth=2, times=None,
                          error=OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(StoreError) as err:
            await _run(chain(), store)
        assert not isinstance(err.value, ConflictError)
        assert "No space left on device" in str(err.value)
        assert "another writer" not in str(err.value)
        run_id = await _only_run(store)
        assert (await interlock.verify(run_id, store=store.inner)).ok
        store.heal()
        done = await asyncio.wait_for(chain().resume(run_id, store=store), HANG)
        assert done.status == "COMPLETED" and done.state["n"] == 3
        await store.close()

    asyncio.run(go())


def test_a_record_the_fold_refuses_is_not_numbered() -> None:
    """`Journal.put` folds before it stages: a record the fold refuses leaves no gap."""
    def failing() -> Workflow:
        def boom(state: dict[str, Any]) -> dict[str, Any]:
            raise RuntimeError("boom")

        return Workflow("fails").node("a", boom).edge(START, "a").edge("a", END)

    async def go() -> None:
        store = open_store("memory://")
        result = await failing().run(store=store)  # FAILED: records may follow (a resume)
        assert result.status == "FAILED"
        loaded = await load_run(store, result.run_id, workflow=failing())
        journal = _journal.Journal(store, result.run_id, loaded.view, loaded.writer())
        seq = journal.writer.seq
        with pytest.raises(KeyError):
            journal.put("node.completed", {})  # no node: the fold cannot take it
        assert journal.writer.seq == seq
        journal.put("test.note", {"ok": True})
        await journal.flush()
        assert (await interlock.verify(result.run_id, store=store)).ok
        assert (await interlock.trace(result.run_id, store=store))[-1]["seq"] == seq + 1

    asyncio.run(go())


# -- store outages are not node failures ---------------------------------------------------


def test_a_store_error_under_ctx_once_is_not_the_nodes_failure() -> None:
    """The body catches every Exception and the node has ``retry:``: neither may take
    the store's outage for the node's error. Before: the body swallowed the
    StoreError and the run completed without the effect in its log."""
    calls: list[str] = []

    def charge(key: str) -> str:
        calls.append(key)
        return "receipt"

    async def pay(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        try:
            return {"receipt": await ctx.once("charge", charge, ctx.idempotency_key)}
        except Exception as exc:
            return {"receipt": f"swallowed {type(exc).__name__}"}

    def workflow() -> Workflow:
        return (Workflow("pay").node("pay", pay, retry={"attempts": 3, "backoff": "0s"})
                .edge(START, "pay").edge("pay", END))

    async def go() -> None:
        store = faulty()
        store.fail_append(holding="effect.recorded", times=None)
        with pytest.raises(StoreError, match="could not be stored"):
            await _run(workflow(), store)
        assert len(calls) == 1  # the effect ran once, its commit was retried
        run_id = await _only_run(store)
        records = await interlock.trace(run_id, store=store.inner)
        assert not [r for r in records if r["type"] in ("node.retrying", "node.failed",
                                                         "node.completed")]
        assert (await store.inner.get_run(run_id)).owner is None

    asyncio.run(go())


def test_a_ctx_once_commit_that_fails_once_is_retried_and_the_effect_runs_once() -> None:
    calls: list[str] = []

    def charge() -> str:
        calls.append("x")
        return "r"

    async def pay(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        return {"receipt": await ctx.once("charge", charge)}

    async def go() -> None:
        store = faulty()
        fault = store.fail_append(holding="effect.recorded",
                                  error=ConnectionResetError("server closed the connection"))
        wf = Workflow("pay").node("pay", pay).edge(START, "pay").edge("pay", END)
        result = await _run(wf, store)
        assert fault.hits == 1 and calls == ["x"]
        assert result.status == "COMPLETED" and result.state["receipt"] == "r"

    asyncio.run(go())


# -- dead paths ---------------------------------------------------------------------------


def test_a_skipped_chain_of_10000_nodes_is_ruled_out_without_recursion() -> None:
    """docs/design.md: dead paths are resolved with a worklist, a 10,000-node chain
    does not recurse. Before: RecursionError at about 340 nodes, the run left RUNNING."""
    n = 10_000

    def noop(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    wf = Workflow("skipped", input=["go"]).node("a", noop).edge(START, "a")
    wf.edge("a", "s0", when="go").edge("a", END, otherwise=True)
    for i in range(n):
        wf.node(f"s{i}", noop)
        wf.edge(f"s{i}", f"s{i + 1}" if i + 1 < n else END)
    limit = sys.getrecursionlimit()
    result = wf.run_sync({"go": False}, store="memory://")
    assert sys.getrecursionlimit() == limit
    assert result.status == "COMPLETED"
    assert result.steps == 1  # only a ran


# -- the budget's state, one lock ---------------------------------------------------------


def test_tokens_charged_from_many_threads_while_visits_come_and_go() -> None:
    """Sync nodes charge tokens on their threads while the loop enters and leaves the
    budget for a map's items. Before: ``enter``/``leave`` changed the in-flight table
    without the lock ``charge`` sums it under -- "dictionary changed size during
    iteration" inside a body."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    charges = 20_000

    def spender(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        for _ in range(charges):
            ctx.record_tokens(1)
        return {"spent": 1}

    async def item(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"done": 1}

    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": list(range(5000))}

    wf = Workflow("budget-race", state={"spent": "add", "done": "add"},
                  limits={"tokens": 10**9})
    wf.node("start", fan).node("fan", fan).node("item", item)
    wf.edge(START, "start").edge("start", ["fan", "s1", "s2", "s3", "s4"])
    for s in ("s1", "s2", "s3", "s4"):
        wf.node(s, spender).edge(s, END)
    wf.map("fan", "xs", "item", as_="x", max_concurrency=500).edge("item", END)
    try:
        result = wf.run_sync(store="memory://")
    finally:
        sys.setswitchinterval(old)
    assert result.status == "COMPLETED", result.error
    assert result.state["spent"] == 4 and result.tokens == 4 * charges


# -- FaultyStore itself -------------------------------------------------------------------


def test_faulty_store_forwards_and_fails_what_it_is_told() -> None:
    async def go() -> None:
        store = faulty()
        result = await chain().run(store=store)
        assert store.calls["append"] >= 1
        reads = store.fail_reads(times=2)
        for _ in range(2):
            with pytest.raises(StoreError, match="injected"):
                await store.get_run(result.run_id)
        assert (await store.get_run(result.run_id)).summary.status == "COMPLETED"
        assert reads.hits == 2
        store.fail_heartbeat(error=TimeoutError("store unreachable"))
        with pytest.raises(TimeoutError):
            await store.heartbeat(result.run_id, "me", 10)
        down = store.fail_for(60, "get_run")
        with pytest.raises(StoreError):
            await store.get_run(result.run_id)
        assert not down.spent
        store.heal()
        await store.lose_lease(result.run_id)
        assert (await store.get_run(result.run_id)).owner == "faulty-store:another-owner"
        # a keyword argument a store grows later goes through as given
        seen: list[dict[str, Any]] = []

        async def release(run_id: str, owner: str, **kw: Any) -> None:
            seen.append(kw)

        store.inner.release = release  # type: ignore[method-assign]
        await store.release(result.run_id, "me", claim=("me", 3))
        assert seen == [{"claim": ("me", 3)}]

    asyncio.run(go())


SUB_NODES = '''
def fix(s):
    return {"fixed": True}
'''


def test_a_store_error_under_a_sub_workflow_is_not_the_parent_nodes_failure(
        make_project: Any) -> None:
    """The child run's store refuses its records for good: the parent node does not
    retry (``retry:``) nor fail -- the parent stops unfinished with the store's error,
    and both continue on a healthy store."""
    p = make_project(SUB_NODES, prefix="fpsub")
    p.workflow("""
        workflow: child
        nodes:
          fix: {mod}:fix
        edges:
          - {from: START, to: fix}
        """, "child.yaml")
    p.workflow("""
        workflow: parent
        nodes:
          sub: {workflow: child.yaml, output: fixed, retry: {attempts: 3, backoff: 0s}}
        edges:
          - {from: START, to: sub}
        """, "parent.yaml")

    async def go() -> None:
        store = faulty(p.store)
        store.fail_append(when=lambda es: any(e.type == "node.completed" and e.node == "fix"
                                              for e in es), times=None)
        wf = interlock.load("parent.yaml")
        with pytest.raises(StoreError, match="could not be stored"):
            await asyncio.wait_for(wf.run(store=store, run_id="p1"), HANG)
        records = await interlock.trace("p1", store=store)
        assert not [r for r in records if r["type"] in ("node.retrying", "node.failed",
                                                         "run.failed")]
        assert (await store.get_run("p1")).owner is None
        store.heal()
        done = await asyncio.wait_for(wf.resume("p1", store=store), HANG)
        assert done.status == "COMPLETED" and done.state["sub"] is True
        assert (await interlock.verify("p1", store=store)).ok
        await store.close()

    asyncio.run(go())


def test_no_effect_runs_once_the_runs_records_cannot_be_stored() -> None:
    """Once the journal is broken, ``ctx.once`` does not call its function (its result
    could not be recorded, so the next executor would do it again) -- even for a body
    that swallows the outage itself."""
    calls: list[str] = []

    async def node(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        with contextlib.suppress(BaseException):  # what a careless body does
            await ctx.log("test.note", {"n": 1})
        await ctx.once("charge", lambda: calls.append("charged"))
        return {}

    async def go() -> None:
        store = faulty()
        store.fail_append(holding="test.note", times=None)
        wf = Workflow("swallow").node("n", node).edge(START, "n").edge("n", END)
        with pytest.raises(StoreError, match="could not be stored"):
            await _run(wf, store)
        assert calls == []

    asyncio.run(go())


def test_a_dropped_postgresql_connection_under_ctx_once_does_not_repeat_the_effect(
        pg_schema_url: str) -> None:
    """A real outage: the server drops the store's connections (``pg_terminate_backend``)
    while the effect runs, so its commit fails on a dead connection. The journal tries
    it again on a new one: the effect ran once, the run completes. Before: the store's
    error reached the body as the node's own, and the node failed."""
    import psycopg

    calls: list[int] = []

    def charge() -> str:
        calls.append(1)
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                         "AND backend_type = 'client backend'")
        return "receipt"

    async def pay(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        return {"receipt": await ctx.once("charge", charge)}

    async def go() -> None:
        store = open_store(pg_schema_url)
        wf = Workflow("pay").node("pay", pay).edge(START, "pay").edge("pay", END)
        result = await asyncio.wait_for(wf.run(store=store), HANG)
        assert result.status == "COMPLETED", result.error
        assert result.state["receipt"] == "receipt" and calls == [1]
        assert (await interlock.verify(result.run_id, store=store)).ok
        await store.close()

    asyncio.run(go())


ISOLATED = '''
import os

async def pay(state, ctx):
    def charge():
        with open("effects.log", "a") as f:
            f.write("charged\\n")
        return "receipt"
    try:
        return {"receipt": await ctx.once("charge", charge)}
    except Exception as exc:
        return {"receipt": "swallowed " + type(exc).__name__}
'''


def test_a_store_error_under_ctx_once_in_a_worker_process_is_not_the_nodes_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``isolation: process``: the effect runs in a real worker process and its result
    comes back to the engine's journal, whose store refuses it for good. The body in
    the worker does not get the store's error to swallow, ``retry:`` does not run it
    again: the run stops unfinished with the store's error."""
    name = f"fpiso_{tmp_path.name[-8:].replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(ISOLATED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    mod = __import__(name)

    async def go() -> None:
        store = faulty()
        store.fail_append(holding="effect.recorded", times=None)
        wf = (Workflow("iso-pay").node("pay", mod.pay, isolation="process", timeout="60s",
                                       retry={"attempts": 3, "backoff": "0s"})
              .edge(START, "pay").edge("pay", END))
        with pytest.raises(StoreError, match="could not be stored"):
            await _run(wf, store)
        assert (tmp_path / "effects.log").read_text() == "charged\n"
        run_id = await _only_run(store)
        records = await interlock.trace(run_id, store=store.inner)
        assert not [r for r in records if r["type"] in ("node.retrying", "node.failed",
                                                         "node.completed")]

    try:
        asyncio.run(go())
    finally:
        sys.modules.pop(name, None)


def test_a_retry_that_finds_another_writers_records_says_the_run_was_taken_over() -> None:
    """The append fails; before it is tried again, another writer stores its own records
    at those seqs. The retry does not count that as done (the hashes differ): it stops
    with a conflict saying the run was taken over -- nothing of this batch is stored."""
    import dataclasses

    from interlock._log import LogWriter

    class Overtaken(FaultyStore):
        taken = False

        async def append(self, run_id: str, entries: list[Any], summary: Any,
                         *args: Any, **kwargs: Any) -> None:
            if not self.taken and any(e.type in ("node.completed", "node.visited")
                                      for e in entries):
                self.taken = True
                row = await self.inner.get_run(run_id)
                w = LogWriter(row.summary.last_seq, row.summary.last_hash)
                theirs = [w.make("test.other", {"by": "another writer"})[1]
                          for _ in entries]
                await self.inner.append(run_id, theirs, dataclasses.replace(
                    row.summary, last_seq=w.seq, last_hash=w.hash))
                raise StoreError("connection reset")
            await super().append(run_id, entries, summary, *args, **kwargs)

    async def go() -> None:
        store = Overtaken(open_store("memory://"))
        with pytest.raises(ConflictError, match="taken over"):
            await _run(chain(), store)
        run_id = await _only_run(store)
        records = await interlock.trace(run_id, store=store.inner)
        assert records[-1]["type"] == "test.other"
        assert (await interlock.verify(run_id, store=store.inner)).ok

    asyncio.run(go())


def test_a_transient_error_of_the_watchers_poll_does_not_fail_a_completed_run() -> None:
    """One failed cancellation poll: the watcher should poll on (and heartbeat), and the
    caller get the completed run -- today it gets the poll's StoreError."""
    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(1.0)
        return {"x": 1}

    async def go() -> None:
        store = faulty()
        store.fail("cancel_requested", times=1)
        wf = Workflow("watched").node("a", slow).edge(START, "a").edge("a", END)
        result = await _run(wf, store)
        assert result.status == "COMPLETED"

    asyncio.run(go())
