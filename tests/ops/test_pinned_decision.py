"""A decision made for one asking of a gate (`Decision.requested_at`, as a chat's button
carries it) decides only that asking: once the gate was asked again (here a modify that
re-enters before it: its next visit), it is refused with nothing recorded, and the
decision made for the asking that waits now is taken."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import START, Workflow


def plan(state: dict[str, Any]) -> dict[str, Any]:
    return {"level": state.get("level") or "HIGH"}


def ship(state: dict[str, Any]) -> dict[str, Any]:
    return {"shipped": state["level"]}


def test_a_decision_for_an_earlier_asking_of_the_gate_is_refused(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    wf = Workflow("pinned", input=["x"], state={"level": "replace"})
    wf.node("plan", plan, writes=["level"])
    wf.approval("gate", show=["level"], on_modify=["plan"])
    wf.node("ship", ship, writes=["shipped"])
    wf.edge(START, "plan").edge("plan", "gate").edge("gate", "ship")
    first = wf.run_sync({"x": 0}, store=store)
    asked = first.waiting["requested_at"]
    # the same asking still waits: a decision pinned to it is taken (modify: asked again)
    again = wf.resume_sync(first.run_id, replace(interlock.modify({"level": "LOW"}, by="al",
                                                                  node="gate"),
                                                 requested_at=asked), store=store)
    assert again.status == "WAITING_APPROVAL" and again.waiting["requested_at"] != asked
    records = asyncio.run(interlock.trace(first.run_id, store=store))

    stale = replace(interlock.approve(by="bob", node="gate"), requested_at=asked)
    with pytest.raises(interlock.UsageError, match="no longer waiting") as refused:
        wf.resume_sync(first.run_id, stale, store=store)
    assert "asked again" in str(refused.value) and "visit 2" in str(refused.value)
    assert asyncio.run(interlock.trace(first.run_id, store=store)) == records

    now = replace(stale, requested_at=again.waiting["requested_at"])
    done = wf.resume_sync(first.run_id, now, store=store)
    assert done.status == "COMPLETED" and done.state["shipped"] == "LOW"
