"""Reads that scale (issue 27): the inbox from kept approval objects, keyset-paged run
lists, a log streamed or paged, visits folded off the event loop, one poll per followed
run, a notify watcher that reads only what changed.

Behaviour through a real ``interlock serve`` (test_server's `Served`); what a request
costs (folds, store reads) on the server's parts in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_server import Served, events, wait_status

import interlock
from interlock._store import MemoryStore
from interlock.support import RunRow, gate_text, node_visits, parse_definition, patch_schema

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

NODES = '''
def first(state):
    return {"first": state.get("n", 0) + 1}

def last(state):
    return {"last": True}

def count(state):
    return {"n": state.get("n", 0) + 1}
'''

GATED = '''
workflow: gated
input: [n]
nodes:
  first: rnodes:first
  gate: {approval: {show: [first], approvers: [alice, "role:admin"], on_modify: [first]}}
  last: rnodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: gate}
  - {from: gate, to: last, when: 'gate.decision == "approved"'}
  - {from: last, to: END}
'''

CHILD = '''
workflow: child
input: [n]
nodes:
  first: rnodes:first
  check: {approval: {show: [first]}}
edges:
  - {from: START, to: first}
  - {from: first, to: check}
'''

PARENT = '''
workflow: parent
input: [n]
nodes:
  sub: {workflow: child.yaml}
  last: rnodes:last
edges:
  - {from: START, to: sub}
  - {from: sub, to: last}
'''

LOOP = '''
workflow: loop
limits: {steps: 500}
nodes:
  step: {call: rnodes:count, writes: [n]}
edges:
  - {from: START, to: step}
  - {from: step, to: step, when: 'n < 120'}
  - {from: step, to: END, otherwise: true}
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "rnodes.py").write_text(NODES)
    flows = tmp_path / "flows"
    flows.mkdir()
    for name, text in [("gated", GATED), ("child", CHILD), ("parent", PARENT),
                       ("loop", LOOP)]:
        (flows / f"{name}.yaml").write_text(textwrap.dedent(text))
    return tmp_path


@pytest.fixture
def server(project: Path) -> Iterator[Served]:
    s = Served(project)
    yield s
    s.stop()


def load_flow(project: Path, name: str) -> interlock.Workflow:
    """A workflow of the project, its nodes imported from it (in this process)."""
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))
    return interlock.load(str(project / "flows" / f"{name}.yaml"))


def cli(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` in another process, on the server's store (this tree's code)."""
    path = os.pathsep.join(p for p in (str(project), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "interlock", *args, "--store",
                           f"sqlite:///{project / 'runs.db'}"], cwd=project,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=120)


async def approvals_by_folding(store: str) -> list[dict[str, Any]]:
    """The inbox as it was computed before issue 27: every waiting run read whole and
    folded, per request -- the reference the kept objects must equal."""
    out = []
    for row in await interlock.list_runs(store=store, status="WAITING_APPROVAL",
                                         limit=10_000):
        w = row.summary.waiting or {}
        node = w.get("node")
        if not node:
            continue
        spec = parse_definition(row.definition)
        ns = spec.nodes.get(node)
        decisions = w.get("decisions") or []
        modify = None
        if "modify" in decisions:
            if w.get("kind") == "tool":
                modify = {"at": [], "patch_schema": w.get("input") or {}}
            else:
                state = (await interlock.status(row.run_id, store=store)).state
                at = list(ns.approval.on_modify) if ns is not None and ns.approval else []
                modify = {"at": at, "patch_schema": patch_schema(spec, state)}
        out.append({"run_id": row.run_id, "workflow": row.workflow, "node": node,
                    "show": w.get("show") or {}, "decisions": decisions,
                    "since": w.get("requested_at"), "deadline": w.get("deadline"),
                    "approvers": list(ns.approval.approvers)
                    if ns is not None and ns.approval else [],
                    "kind": w.get("kind"), "input": w.get("input"), "modify": modify,
                    "outcome": gate_text.outcome_info(w)})
        out[-1]["parent"] = (row.options.get("parent") or {}).get("run")
    # one row per gate: a child's gate is its waiting parent's ``node/gate`` row
    through = {a["run_id"] for a in out if "/" in a["node"]}
    return [{k: v for k, v in a.items() if k != "parent"} for a in out
            if a["parent"] not in through]


def inbox(c: Any) -> dict[str, dict[str, Any]]:
    r = c.get("/api/approvals")
    assert r.status_code == 200, r.text
    return {a["run_id"]: a for a in r.json()}


# -- the inbox ------------------------------------------------------------------------


def test_the_inbox_follows_decisions_new_gates_and_child_gates(server: Served,
                                                                project: Path) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    with server.client() as c:
        for rid in ("a1", "a2"):
            assert c.post("/api/workflows/gated/runs",
                          json={"run_id": rid, "input": {"n": 1}}).status_code == 201
            wait_status(c, rid, "WAITING_APPROVAL")
        first = inbox(c)
        assert set(first) == {"a1", "a2"}
        assert first["a1"]["approvers"] == ["alice", "role:admin"]
        assert first["a1"]["modify"]["at"] == ["first"]
        assert "first" in first["a1"]["modify"]["patch_schema"]["properties"]
        assert inbox(c) == first  # asked again: the same, from the kept objects

        # decided: gone at once
        r = c.post("/api/runs/a1/decisions", json={"decision": "approve", "by": "alice"})
        assert r.status_code == 200, r.text
        wait_status(c, "a1", "COMPLETED")
        assert set(inbox(c)) == {"a2"}

        # a modify re-enters at first and waits again at the gate: a new gate, shown anew
        before = inbox(c)["a2"]
        r = c.post("/api/runs/a2/decisions", json={"decision": "modify", "by": "alice",
                                                   "patch": {"first": 41}})
        assert r.status_code == 200, r.text
        after = wait_status(c, "a2", "WAITING_APPROVAL")
        again = inbox(c)["a2"]
        assert again["since"] != before["since"]
        assert again["since"] == after["waiting"]["requested_at"]
        assert again["show"] == {"first": 2}  # first ran again from n = 1

        # a gate requested by another process (the CLI), and a child run's gate
        assert cli(project, "run", "flows/gated.yaml", "--input", '{"n": 5}',
                   "--run-id", "cli1").returncode == 3
        assert cli(project, "run", "flows/parent.yaml", "--input", '{"n": 2}',
                   "--run-id", "p1").returncode == 3
        shown = inbox(c)
        assert "cli1" in shown and shown["cli1"]["show"] == {"first": 6}
        # (a child run's gate is listed with the child gate's own kind, as waiting.pending
        # names it: what the person decides is an approval)
        assert "p1" in shown and shown["p1"]["kind"] == "approval"
        assert sorted(shown.values(), key=lambda a: a["run_id"]) == sorted(
            asyncio.run(approvals_by_folding(store)), key=lambda a: a["run_id"])

        # the child's gate decided through the parent: both leave the inbox
        r = c.post("/api/runs/p1/decisions", json={"decision": "approve", "by": "x"})
        assert r.status_code == 200, r.text
        wait_status(c, "p1", "COMPLETED")
        shown = inbox(c)
        assert set(shown) == {"a2", "cli1"}
        assert sorted(shown.values(), key=lambda a: a["run_id"]) == sorted(
            asyncio.run(approvals_by_folding(store)), key=lambda a: a["run_id"])


def test_the_inbox_computes_a_gate_once_per_seq_and_forgets_decided_runs(
        project: Path) -> None:
    """No fold per request: a second request computes nothing; a run that moved on is
    computed again, one that no longer waits is forgotten."""
    from interlock.server._reads import Approvals

    async def main() -> None:
        store = MemoryStore()
        wf = load_flow(project, "gated")
        for i in range(5):
            await wf.run({"n": i}, store=store, run_id=f"w{i}")
        inbox = Approvals()
        got = await inbox.list(store)
        assert sorted(a["run_id"] for a in got) == [f"w{i}" for i in range(5)]
        assert inbox.computed == 5
        assert await inbox.list(store) == got
        assert inbox.computed == 5  # nothing folded again
        await interlock.resume("w0", interlock.Decision("approve", "alice"), store=store,
                               workflow=wf)
        await interlock.resume("w1", interlock.Decision("modify", "alice",
                                                        patch={"first": 7}),
                               store=store, workflow=wf)
        got = {a["run_id"]: a for a in await inbox.list(store)}
        assert sorted(got) == ["w1", "w2", "w3", "w4"]
        assert inbox.computed == 6  # w1 only: it waits again, at a later seq
        assert "w0" not in inbox.kept

    asyncio.run(main())


# -- run lists ------------------------------------------------------------------------


def test_runs_pages_follow_the_cursor_and_a_new_run_shifts_none(server: Served,
                                                               project: Path) -> None:
    with server.client() as c:
        for i in range(5):
            assert cli(project, "run", "flows/loop.yaml", "--input", '{"n": 118}',
                       "--run-id", f"r{i}").returncode == 0
        seen: list[str] = []
        page = c.get("/api/runs", params={"limit": 2}).json()
        seen += [r["run_id"] for r in page["runs"]]
        # a run created after the first page: not on the later pages, none repeated
        assert cli(project, "run", "flows/loop.yaml", "--input", '{"n": 118}',
                   "--run-id", "late").returncode == 0
        while page["next"]:
            page = c.get("/api/runs", params={"limit": 2, "cursor": page["next"]}).json()
            seen += [r["run_id"] for r in page["runs"]]
        assert seen == ["r4", "r3", "r2", "r1", "r0"]
        everything = c.get("/api/runs", params={"limit": 100}).json()
        assert [r["run_id"] for r in everything["runs"]] == ["late", *seen]
        assert everything["next"] is None
        row = everything["runs"][0]
        assert row["status"] == "COMPLETED" and row["steps"] == 2 and "input" not in row
        bad = c.get("/api/runs", params={"cursor": "page-2"})
        assert bad.status_code == 422
        assert bad.headers["content-type"] == "application/problem+json"


# -- a run's log ----------------------------------------------------------------------


def test_records_whole_streamed_or_paged_are_the_same_log(server: Served,
                                                         project: Path) -> None:
    assert cli(project, "run", "flows/loop.yaml", "--input", '{"n": 0}',
               "--run-id", "long").returncode == 0
    with server.client() as c:
        whole = c.get("/api/runs/long/records")
        assert whole.status_code == 200 and whole.headers["content-type"] == \
            "application/json"
        records = whole.json()
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        assert records[-1]["type"] == "run.completed" and len(records) > 250
        paged: list[dict[str, Any]] = []
        after: int | None = 0
        pages = 0
        while after is not None:
            r = c.get("/api/runs/long/records", params={"after": after, "limit": 100})
            assert r.status_code == 200
            got = r.json()
            assert len(got) <= 100
            paged += got
            pages += 1
            nxt = r.headers.get("x-next-after")
            after = int(nxt) if nxt is not None else None
        assert paged == records and pages == -(-len(records) // 100)
        tail = c.get("/api/runs/long/records", params={"after": len(records) - 2}).json()
        assert tail == records[-2:]
        assert c.get("/api/runs/long/records",
                     params={"after": len(records)}).json() == []
        assert c.get("/api/runs/nope/records").status_code == 404
        # the CLI's remote trace reads the whole log through the server, a page at a time
        done = subprocess.run(
            [sys.executable, "-m", "interlock", "trace", "long", "--json", "--server",
             server.url], cwd=project, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(project), os.environ.get("PYTHONPATH")) if p)})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == records
        # ... and its client follows the pages
        from interlock.cli import _remote

        remote = _remote.Remote(server.url, None)
        asked: list[dict[str, Any]] = []
        remote.client.event_hooks["request"].append(
            lambda request: asked.append(dict(request.url.params)))
        try:
            _remote.RECORDS_PAGE, page_size = 100, _remote.RECORDS_PAGE
            assert remote.records("long") == records
            assert remote.records("long", after=len(records) - 150) == records[-150:]
        finally:
            _remote.RECORDS_PAGE = page_size
            remote.close()
        assert len(asked) == -(-(len(records) + 1) // 100) + 2
        assert asked[0] == {"after": "0", "limit": "100"}


def test_visits_fold_sharing_the_event_loop_with_the_same_result(project: Path) -> None:
    """Sharing the loop, the fold lets other tasks run while it goes (it used to hold the
    loop from the first record to the last: no other task ran meanwhile)."""

    async def main() -> None:
        store = MemoryStore()
        await load_flow(project, "loop").run({"n": 0}, store=store, run_id="long")
        ticks = 0
        running = True

        async def ticker() -> None:
            nonlocal ticks
            while running:
                ticks += 1
                await asyncio.sleep(0)

        plain = await node_visits("long", store=store)
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        offloaded = await node_visits("long", store=store, share_loop=True)
        during = ticks
        running = False
        await task
        assert offloaded == plain and len(plain) == 120
        assert during > 0

    asyncio.run(main())


# -- followers of a run ---------------------------------------------------------------


def test_two_streams_on_a_run_written_elsewhere_see_the_same_records(
        server: Served, project: Path) -> None:
    assert cli(project, "run", "flows/gated.yaml", "--input", '{"n": 1}',
               "--run-id", "ext").returncode == 3
    with server.client() as c1, server.client() as c2:
        got: list[list[dict[str, Any]]] = [[], []]

        def follow(c: Any, out: list[dict[str, Any]], last_id: str | None) -> None:
            headers = {"Last-Event-ID": last_id} if last_id else None
            out.extend(events(c, "ext", headers=headers, until="run.completed"))

        import threading
        # one from the start, one resuming after its 3rd record
        t1 = threading.Thread(target=follow, args=(c1, got[0], None))
        t2 = threading.Thread(target=follow, args=(c2, got[1], "3"))
        t1.start()
        t2.start()
        deadline = time.monotonic() + 30
        while (len(got[0]) < 5 or len(got[1]) < 2) and time.monotonic() < deadline:
            time.sleep(0.05)  # both have sent what was there before the decision
        assert cli(project, "resume", "ext", "--approve", "--by", "alice").returncode == 0
        t1.join(60)
        t2.join(60)
        seqs = [[int(e["id"]) for e in g] for g in got]
        assert seqs[0] == list(range(1, len(seqs[0]) + 1))
        assert seqs[1] == seqs[0][3:]  # after its Last-Event-ID: no gap, no duplicate
        assert [e["data"] for e in got[1]] == [e["data"] for e in got[0][3:]]
        assert got[0][-1]["event"] == "run.completed"


def test_the_followers_of_a_run_share_one_poll(project: Path) -> None:
    """N followers of one run written elsewhere: one store read per poll interval, not
    N; each is woken when a record lands after the seq it has sent."""
    from interlock.server._hub import Hub
    from interlock.server._reads import Polls

    class Counting(MemoryStore):
        pages = 0

        async def entries_page(self, run_id: str, after: int = 0, limit: int = 1000
                               ) -> list[Any]:
            Counting.pages += 1
            return await super().entries_page(run_id, after, limit)

    async def main() -> None:
        store = Counting()
        wf = load_flow(project, "gated")
        result = await wf.run({"n": 1}, store=store, run_id="w")
        last = (await store.get_run("w")).summary.last_seq
        hub = Hub()
        polls = Polls(lambda: store, hub, 0.01, lambda run_id: False)
        woken = 0
        with polls.following("w", last) as a, polls.following("w", last) as b, \
                polls.following("w", last):
            assert a is not b
            Counting.pages = 0
            for _ in range(5):  # nothing new: five polls, no wake
                waiter = hub.waiter("w")
                await hub.wait(waiter, 0.012)
                woken += waiter.is_set()
            assert woken == 0
            reads = polls.reads
            assert reads >= 1 and Counting.pages == reads  # one read per poll, all three
            waiter = hub.waiter("w")
            await interlock.resume("w", interlock.Decision("approve", "alice"), store=store,
                                   workflow=wf)
            await hub.wait(waiter, 5)
            assert waiter.is_set()  # a record after their seq: all woken by one poll
        assert result.status == "WAITING_APPROVAL"
        await asyncio.sleep(0.03)
        assert polls.reads <= reads + 2  # nobody follows: no more polls
        await polls.close()

    asyncio.run(main())


# -- the notify watcher ---------------------------------------------------------------


def test_the_notify_watcher_reads_light_rows_changed_since_its_last_pass(
        project: Path) -> None:
    from interlock.server._hub import Hub
    from interlock.server._notify import Notifier

    class NoWholeRows(MemoryStore):
        calls: ClassVar[list[dict[str, Any]]] = []

        async def list_runs(self, **kw: Any) -> list[RunRow]:
            raise AssertionError("the watcher read whole rows (with their inputs)")

        async def list_page(self, **kw: Any) -> list[RunRow]:
            NoWholeRows.calls.append(kw)
            return await super().list_page(**kw)

    async def main() -> None:
        store = NoWholeRows()
        wf = load_flow(project, "gated")
        for i in range(3):
            await wf.run({"n": i}, store=store, run_id=f"w{i}")
        sent: list[str] = []
        notifier = Notifier(["http://127.0.0.1:9/hook"], "http://x", store, Hub(), None)
        notifier.requested = lambda workflow, run_id, rec: sent.append(run_id)  # type: ignore[method-assign]
        task = asyncio.create_task(notifier.watch(0.01))
        while len(NoWholeRows.calls) < 3 and not task.done():
            await asyncio.sleep(0.01)
        assert not task.done(), task.exception()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(sent) == ["w0", "w1", "w2"] and notifier.looked == 3
        assert NoWholeRows.calls[0]["updated_after"] is None
        later = [c["updated_after"] for c in NoWholeRows.calls[1:]]
        assert all(u is not None and u > time.time() - 120 for u in later)

    asyncio.run(main())
