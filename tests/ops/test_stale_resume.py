"""A resume that read the run, then claimed it after another process had decided (or
resumed) it and let it go: what it read is stale, so it is refused with a clear error and
records nothing (the race of tests/ops/test_decision_race.py, made deterministic)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import START, Workflow
from interlock._store import open_store


def test_a_resume_whose_reading_went_stale_before_its_claim_is_refused(tmp_path: Path
                                                                      ) -> None:
    wf = Workflow("stale")
    wf.approval("gate").node("after", lambda s: {"after": True})
    wf.edge(START, "gate").edge("gate", "after", when='gate.decision == "approved"')
    url = f"sqlite:///{tmp_path}/runs.db"
    run_id = wf.run_sync(store=url).run_id

    async def main() -> None:
        late = open_store(url)
        claim = late.claim

        async def claim_after_the_winner(*args: Any, **kw: Any) -> None:
            # the other process decides, runs and releases between our read and our claim
            won = await wf.resume(run_id, interlock.approve(by="alice"), store=url)
            assert won.status == "COMPLETED"
            await claim(*args, **kw)

        late.claim = claim_after_the_winner  # type: ignore[method-assign]
        try:
            with pytest.raises(interlock.ConflictError, match=r"changed after this process read "
                               r"it .* nothing was recorded and this resume is refused"):
                await wf.resume(run_id, interlock.reject(by="bob"), store=late)
        finally:
            await late.close()

    asyncio.run(main())
    records = asyncio.run(interlock.trace(run_id, store=url))
    assert [r["by"] for r in records if r["type"] == "approval.decided"] == ["alice"]
    assert asyncio.run(interlock.verify(run_id, store=url)).ok
