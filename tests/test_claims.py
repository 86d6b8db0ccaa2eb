"""A lost claim stops the run at once (issue 26), in one process: another owner claims
the run while a node runs; the lease keeper's renewal (or ``ctx.once``'s check) finds
the claim gone; the node in hand is cancelled, nothing more is appended, the effect
after the takeover never runs, and the executor is told the run moved. ``ctx.claim``
is the claim the run executes under."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import _lease
from interlock._runs import continue_claimed
from interlock._store import Claim, ClaimLost, MemoryStore, Store, open_store
from interlock.support import Worker


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else \
        open_store(f"sqlite:///{tmp_path / 'runs.db'}")


def _workflow(seen: dict[str, Any], waiting: asyncio.Event, go: asyncio.Event
              ) -> interlock.Workflow:
    async def work(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        seen["claim"] = ctx.claim
        def before() -> int:
            seen["before"] = seen.get("before", 0) + 1
            return 1

        await ctx.once("before", before)
        waiting.set()
        try:
            await go.wait()
            await ctx.once("after", lambda: seen.__setitem__("after", True))
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return {"n": 1}

    wf = interlock.Workflow("claimed", input=["n"])
    wf.node("work", work)
    wf.edge("START", "work")
    wf.edge("work", "END")
    return wf


async def _takeover(store: Store, caplog: pytest.LogCaptureFixture, *, go_first: bool
                    ) -> tuple[dict[str, Any], int, int]:
    seen: dict[str, Any] = {}
    waiting, go = asyncio.Event(), asyncio.Event()
    wf = _workflow(seen, waiting, go)
    await wf.submit({"n": 0}, store=store, run_id="r1")
    worker = Worker(store, workflows={"claimed": wf}, poll=0.05, lease=0.9)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(waiting.wait(), 30)
        row = await store.get_run("r1")
        assert seen["claim"] == Claim(str(row.owner), row.generation)
        taken = await store.claim("r1", "other-host:1:x", 60, force=True)  # another owner
        assert taken is not None
        stored = len(await store.entries("r1"))
        if go_first:
            go.set()  # the node goes on before any renewal: ctx.once checks the claim
        for _ in range(600):
            if "moved to owner other-host:1:x" in caplog.text:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        return seen, stored, taken
    finally:
        worker.stop()
        await task


def test_a_lost_claim_cancels_the_node_and_appends_nothing(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        try:
            seen, stored, taken = await _takeover(store, caplog, go_first=False)
            assert seen.get("cancelled") and "after" not in seen  # stopped, as a cancel
            assert len(await store.entries("r1")) == stored  # nothing appended after
            row = await store.get_run("r1")
            assert (row.owner, row.generation) == ("other-host:1:x", taken)
            assert f"(claim generation {taken}) while this process held generation " \
                   f"{taken - 1}" in caplog.text
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="interlock"):
        asyncio.run(main())


def test_ctx_once_checks_a_claim_whose_renewals_stopped(
        store: Store, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the keeper renews nothing (as in a paused process); the lease is "near its end"
    # when the node goes on, so ctx.once asks the store before the effect
    monkeypatch.setattr(_lease.Keeper, "_renew", lambda self, held: setattr(
        held, "due", held.due + 3600))
    monkeypatch.setattr("interlock._runs.ONCE_CHECK_LEFT", 1.0)  # always "near its end"

    async def main() -> None:
        try:
            seen, stored, _ = await _takeover(store, caplog, go_first=True)
            assert "after" not in seen and seen.get("before") == 1
            assert seen.get("cancelled")
            assert len(await store.entries("r1")) == stored
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="interlock"):
        asyncio.run(main())


def test_a_stale_append_is_told_as_a_moved_run(store: Store) -> None:
    async def main() -> None:
        try:
            async def step(state: dict[str, Any]) -> dict[str, Any]:
                return {"n": state["n"] + 1}

            wf = interlock.Workflow("one", input=["n"])
            wf.node("a", step)
            wf.edge("START", "a")
            wf.edge("a", "END")
            await wf.submit({"n": 0}, store=store, run_id="r2")
            gen = await store.claim("r2", "me:1:x", 60)
            await store.claim("r2", "them:2:y", 60, force=True)
            with pytest.raises(ClaimLost, match="moved to owner them:2:y"):
                await continue_claimed(store, "r2", "me:1:x", workflow=wf)
            assert gen == 1
        finally:
            await store.close()

    asyncio.run(main())
