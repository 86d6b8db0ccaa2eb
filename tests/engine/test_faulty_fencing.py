"""`interlock.testing.FaultyStore` fences appends as the store it wraps does: a claim
returns its generation, an append made after another owner claimed the run is refused
(`ClaimLost`), and the lease keeper renews leases through it -- so the failure tests
that use it run the executor as it runs on a real store. And a store that fences
appends but has no `LeaseRenewer` of its own (a wrapper, another package's store) still
has its leases renewed: by heartbeats on the executor's loop.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import test_store_conformance as conformance

from interlock import END, START, Workflow
from interlock._errors import ClaimError, ClaimLost
from interlock._store import LeaseRenewer, Store, open_store
from interlock.support import Worker
from interlock.testing import FaultyStore

pg_schema_url = conformance.pg_schema_url  # a fixture: a fresh schema on $INTERLOCK_TEST_POSTGRES

HANG = 30.0  # a run or a wait that has not ended by then hangs (the guard, not a timing)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    found: str = conformance._url_for(request.param, request, tmp_path)
    return found


def _taken_over(store: FaultyStore) -> Workflow:
    """``a`` hands the run to another owner (``lose_lease``) and returns: its completion
    is the first append made after the claim moved on."""
    async def a(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await store.lose_lease(ctx.run_id)
        return {"n": 1}

    async def b(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 2}

    wf = Workflow("fenced", input=["n"])
    wf.node("a", a).node("b", b)
    wf.edge(START, "a").edge("a", "b").edge("b", END)
    return wf


async def _completed(store: FaultyStore, run_id: str) -> list[str | None]:
    return [e.node for e in await store.inner.entries(run_id) if e.type == "node.completed"]


@pytest.mark.parametrize("how", ["run", "resume"])
def test_a_faulty_store_refuses_an_append_after_a_takeover(url: str, how: str) -> None:
    """Before, `FaultyStore.fences_appends` was False (and its `claim` returned no
    generation): the stale executor's ``node.completed`` and everything after it were
    stored under another owner's claim."""
    async def go() -> None:
        store = FaultyStore(open_store(url))
        try:
            assert store.fences_appends is store.inner.fences_appends is True
            wf = _taken_over(store)
            if how == "run":
                with pytest.raises(ClaimLost, match="moved to owner faulty-store:another"):
                    await asyncio.wait_for(wf.run({"n": 0}, store=store, run_id="r1"), HANG)
            else:  # a resume claims the run: the claim's generation fences its appends
                await wf.submit({"n": 0}, store=store, run_id="r1")
                with pytest.raises(ClaimLost, match="moved to owner faulty-store:another"):
                    await asyncio.wait_for(wf.resume("r1", store=store), HANG)
            assert await _completed(store, "r1") == []
            row = await store.inner.get_run("r1")
            assert row.owner == "faulty-store:another-owner"
            assert row.summary.status not in ("COMPLETED", "FAILED")
        finally:
            await store.close()

    asyncio.run(go())


async def _until(cond: Any, what: str, within: float = HANG) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, f"waited {within}s for {what}"
        await asyncio.sleep(0.02)


def _held_while(store: Store, renewals: Any, seen: dict[str, Any]) -> Workflow:
    """``work`` waits until ``renewals()`` is true (or 10 s: none came), then tries to
    claim the run for another owner: refused while its lease (0.9 s, past its first
    end) is kept."""
    async def work(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        started = time.monotonic()
        seen["renewed"] = True
        try:
            await _until(lambda: renewals() and time.monotonic() - started > 1.0,
                         "the lease's renewals", within=10.0)
        except AssertionError:
            seen["renewed"] = False
        try:
            await store.claim(ctx.run_id, "another-host:1:x", 60)
            seen["taken"] = True
        except ClaimError:
            seen["taken"] = False
        return {"n": 1}

    wf = Workflow("held", input=["n"])
    wf.node("work", work).edge(START, "work").edge("work", END)
    return wf


async def _work_one(store: Store, wf: Workflow) -> str:
    """A worker (lease 0.9 s) executes one run of ``wf`` to its end; its status."""
    await wf.submit({"n": 0}, store=store, run_id="r1")
    worker = Worker(store, workflows={"held": wf}, poll=0.05, lease=0.9)
    task = asyncio.create_task(worker.run())
    try:
        await _until(lambda: worker.executed >= 1, "the worker's run")
    finally:
        worker.stop()
        await asyncio.wait_for(task, HANG)
    return (await store.get_run("r1")).summary.status


def test_the_keeper_renews_through_a_faulty_store_and_its_heartbeat_faults(
        tmp_path: Path) -> None:
    """A renewal is a ``heartbeat`` of the `FaultyStore`: counted, and failed by a
    heartbeat fault (the keeper tries again: the run keeps its lease)."""
    async def go() -> None:
        store = FaultyStore(open_store(f"sqlite:///{tmp_path / 'runs.db'}"))
        try:
            fault = store.fail_heartbeat()
            seen: dict[str, Any] = {}
            wf = _held_while(store, lambda: fault.hit.is_set()
                             and store.calls["heartbeat"] >= 3, seen)
            status = await _work_one(store, wf)
            assert seen == {"renewed": True, "taken": False}
            assert fault.hits == 1 and status == "COMPLETED"
        finally:
            await store.close()

    asyncio.run(go())


class _NoRenewer(FaultyStore):
    """A store that fences appends but renews no lease from a thread of its own."""

    def lease_renewer(self) -> LeaseRenewer | None:
        return None


def test_a_fencing_store_without_a_renewer_is_renewed_by_heartbeats(tmp_path: Path) -> None:
    """Before, the keeper dropped such a lease and the executor, counting on the
    keeper, sent no heartbeat: the lease ran out under a running node and another
    worker could claim the run."""
    async def go() -> None:
        store = _NoRenewer(open_store(f"sqlite:///{tmp_path / 'runs.db'}"))
        store.fences_appends = True
        try:
            seen: dict[str, Any] = {}
            wf = _held_while(store, lambda: store.calls["heartbeat"] >= 2, seen)
            status = await _work_one(store, wf)
            assert seen == {"renewed": True, "taken": False}  # before: no renewal, taken
            assert status == "COMPLETED"
        finally:
            await store.close()

    asyncio.run(go())
