"""The lease keeper's thread, idle (no lease to keep, waiting out `_lease.IDLE_SECONDS`
before it ends), wakes for a lease held meanwhile and renews it when it is due -- not
when its idle wait ends. Before, it slept on: a worker whose runs came one after
another, idle in between, renewed a new run's lease only up to 10 s late, and with a
lease shorter than that (``interlock worker --lease 2``) lost it to another worker while
the node ran."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from interlock import END, START, Workflow
from interlock._engine import _lease
from interlock._store import Claim, open_store

HANG = 30.0  # a renewal not made by then never comes (the guard, not a timing)


async def _until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + HANG
    while not cond():
        assert time.monotonic() < deadline, f"waited {HANG}s for {what}"
        await asyncio.sleep(0.01)


def test_an_idle_keeper_wakes_for_a_new_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lease, "IDLE_SECONDS", 120.0)  # idle far past the guard

    async def go() -> None:
        store = open_store("memory://")
        wf = Workflow("held")
        wf.node("a", lambda s: {}).edge(START, "a").edge("a", END)
        claims = []
        for run_id in ("r1", "r2"):
            await wf.submit({}, store=store, run_id=run_id)
            generation = await store.claim(run_id, "me:1:x", 60)
            assert generation is not None
            claims.append(Claim("me:1:x", generation))
        keeper = _lease.Keeper()  # (its own thread: no other test's keeper involved)
        lost: list[Any] = []
        first = keeper.hold(store, "r1", claims[0], 0.3, lost.append)
        start = first.renewed
        await _until(lambda: first.renewed > start, "the first lease's renewal")
        keeper.drop(first)
        # idle: no lease left, its store's renewer closed, waiting out IDLE_SECONDS
        await _until(lambda: not keeper._renewers, "the keeper to go idle")
        second = keeper.hold(store, "r2", claims[1], 0.3, lost.append)
        start = second.renewed
        await _until(lambda: second.renewed > start, "the new lease's renewal")
        keeper.drop(second)
        assert lost == []
        await store.close()

    asyncio.run(go())
