"""Two decisions on one gate, the second made between the first's read and its claim:
the decision offered first wins (a decision is offered before its process claims the
run), the other is refused and records nothing (the race of
tests/ops/test_decision_race.py, made deterministic)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import START, Workflow
from interlock._store import open_store


def test_a_decision_racing_another_between_read_and_claim(tmp_path: Path) -> None:
    wf = Workflow("stale")
    wf.approval("gate").node("after", lambda s: {"after": True})
    wf.edge(START, "gate").edge("gate", "after", when='gate.decision == "approved"')
    url = f"sqlite:///{tmp_path}/runs.db"
    run_id = wf.run_sync(store=url).run_id

    async def main() -> None:
        late = open_store(url)
        claim = late.claim

        async def claim_after_another_decider(*args: Any, **kw: Any) -> None:
            # another process decides the same gate between our read and our claim: the
            # decision offered first (ours: a decision is offered before the claim) wins,
            # the other is refused and records nothing
            with pytest.raises(interlock.UsageError, match=r"decided already: rejected by "
                               r"bob at .* UTC; exactly one decision per gate wins"):
                await wf.resume(run_id, interlock.approve(by="alice"), store=url)
            await claim(*args, **kw)

        late.claim = claim_after_another_decider  # type: ignore[method-assign]
        try:
            done = await wf.resume(run_id, interlock.reject(by="bob"), store=late)
            assert done.status == "REJECTED"
        finally:
            await late.close()

    asyncio.run(main())
    records = asyncio.run(interlock.trace(run_id, store=url))
    assert [r["by"] for r in records if r["type"] == "approval.decided"] == ["bob"]
    assert asyncio.run(interlock.verify(run_id, store=url)).ok
