"""The operations' failure paths: a store that fails under `migrate` and under a gate's
decision (`decide_gate`, the offer of SPEC §3's several gates) -- the caller gets the
store's error, nothing half-recorded stays behind, the run's claim is let go, and doing
it again once the store is back works exactly once.

The store's failures are injected with `interlock.testing.FaultyStore`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from interlock import END, START, Decision, Workflow
from interlock import _log as L
from interlock._engine import _journal
from interlock._errors import StoreError
from interlock._store import open_store
from interlock.support import GateTaken, decide_gate, migrate_run
from interlock.testing import FaultyStore

HANG = 30.0  # a call that has not returned by then hangs (the guard, not a timing)


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_journal, "RETRY_SECONDS", 0.3, raising=False)


def start(state: dict[str, Any]) -> dict[str, Any]:
    return {"x": 1}


def done(state: dict[str, Any]) -> dict[str, Any]:
    return {"done": True}


def audit(state: dict[str, Any]) -> dict[str, Any]:
    return {"audited": True}


def gated(extra: bool = False) -> Workflow:
    """``start -> [legal, finance] -> done`` (``extra``: a node ``audit`` after ``done``,
    the definition a waiting run is migrated onto)."""
    wf = Workflow("ops-failpaths")
    wf.node("start", start)
    wf.approval("legal", show=["x"])
    wf.approval("finance", show=["x"])
    wf.node("done", done)
    wf.edge(START, "start").edge("start", ["legal", "finance"]).edge(["legal", "finance"],
                                                                       "done")
    if extra:
        wf.node("audit", audit)
        wf.edge("done", "audit").edge("audit", END)
    return wf


async def _waiting(tmp_path: Path) -> tuple[FaultyStore, str]:
    store = FaultyStore(open_store(f"sqlite:///{tmp_path / 'runs.db'}"))
    result = await asyncio.wait_for(gated().run(store=store), HANG)
    assert result.status == "WAITING_APPROVAL"
    return store, result.run_id


async def _types(store: FaultyStore, run_id: str) -> list[str]:
    out: list[str] = []
    async for page in store.inner.iter_entries(run_id, page=500):
        out.extend(e.type for e in page)
    return out


def test_a_migrate_whose_record_cannot_be_stored_records_nothing_and_lets_the_run_go(
        tmp_path: Path) -> None:
    async def main() -> None:
        store, run_id = await _waiting(tmp_path)
        before = await _types(store, run_id)
        store.fail_append(holding=L.RUN_MIGRATED, times=None, error=StoreError("disk gone"))
        with pytest.raises(StoreError, match="disk gone"):
            await asyncio.wait_for(migrate_run(run_id, gated(extra=True).spec,
                                               store=store, by="ops"), HANG)
        assert await _types(store, run_id) == before  # nothing half-recorded
        row = await store.inner.get_run(run_id)
        assert row.summary.status == "WAITING_APPROVAL"
        store.faults.clear()
        # the claim was let go: the same migrate goes through now, once
        moved = await asyncio.wait_for(migrate_run(run_id, gated(extra=True).spec,
                                                   store=store, by="ops"), HANG)
        assert moved.recorded is not None
        assert (await _types(store, run_id)).count(L.RUN_MIGRATED) == 1
        for gate in ("legal", "finance"):
            await decide_gate(run_id, gate, Decision("approve"), by="alice", store=store)
        done = await store.inner.get_run(run_id)
        assert done.summary.status == "COMPLETED"
    asyncio.run(main())


def test_a_decision_whose_offer_fails_is_the_stores_error_and_can_be_made_again(
        tmp_path: Path) -> None:
    async def main() -> None:
        store, run_id = await _waiting(tmp_path)
        before = await _types(store, run_id)
        store.fail("offer_decision", error=StoreError("connection reset"))
        with pytest.raises(StoreError, match="connection reset"):
            await decide_gate(run_id, "legal", Decision("approve"), by="alice", store=store)
        assert await _types(store, run_id) == before
        assert await store.inner.decisions(run_id) == {}
        decided = await decide_gate(run_id, "legal", Decision("approve"), by="alice",
                                    store=store)
        assert decided.result.status == "WAITING_APPROVAL"  # finance still waits
        assert (await _types(store, run_id)).count(L.APPROVAL_DECIDED) == 1
    asyncio.run(main())


def test_a_decision_whose_record_cannot_be_stored_stays_offered_and_is_folded_in_once(
        tmp_path: Path) -> None:
    """The offer won the gate, then recording it under the run's claim failed: the
    decider gets the store's error; the offer stands (another decider is refused), and
    the next process to continue the run folds it in -- once."""
    async def main() -> None:
        store, run_id = await _waiting(tmp_path)
        store.fail_append(holding=L.APPROVAL_DECIDED, times=None,
                          error=StoreError("disk gone"))
        with pytest.raises(StoreError, match="disk gone"):
            await decide_gate(run_id, "legal", Decision("approve"), by="alice", store=store)
        assert L.APPROVAL_DECIDED not in await _types(store, run_id)
        with pytest.raises(GateTaken, match="decided already"):
            await decide_gate(run_id, "legal", Decision("reject"), by="mallory",
                              store=store)
        store.faults.clear()
        decided = await decide_gate(run_id, "finance", Decision("approve"), by="bob",
                                    store=store)
        assert decided.result.status == "COMPLETED", decided.result
        types = await _types(store, run_id)
        assert types.count(L.APPROVAL_DECIDED) == 2
        decisions = [r async for r in _decided(store, run_id)]
        assert sorted((d["node"], d["by"]) for d in decisions) == [("finance", "bob"),
                                                                   ("legal", "alice")]
    asyncio.run(main())


async def _decided(store: FaultyStore, run_id: str) -> Any:
    async for page in store.inner.iter_entries(run_id, page=500):
        for e in page:
            if e.type == L.APPROVAL_DECIDED:
                yield e.record()
