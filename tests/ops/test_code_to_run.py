"""The nodes a stopped run may still execute (`_ops._code.nodes_to_run`: what code
drift, ``--strict-code`` and a migration's checks look at) include the targets of every
edge still owed a decision -- in log format 2 too, where a completed node with one
``when`` edge and an ``otherwise`` edge owes only the ``when`` edge's decision (its
record implies the other)."""

from __future__ import annotations

import asyncio
from typing import Any

from interlock import START, Workflow
from interlock._engine._fold import RunView
from interlock._ops._code import nodes_to_run
from interlock._store import open_store


async def inc(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": state.get("i", 0) + 1}


def test_a_when_that_failed_still_has_its_otherwise_target_to_run() -> None:
    wf = Workflow("branch").node("a", inc).node("b", inc).node("c", inc)
    wf.edge(START, "a").edge("a", "b", when="i > config.limit")
    wf.edge("a", "c", otherwise=True)
    plan = wf.compile()

    async def go() -> list[dict[str, Any]]:
        st = open_store("memory://")
        failed = await wf.run({}, store=st)  # (no config.limit: the decision fails)
        assert failed.status == "FAILED" and failed.error is not None
        assert failed.error["type"] == "expression_error"
        return [e.record() for e in await st.entries(failed.run_id)]

    view = RunView(plan)
    for rec in asyncio.run(go()):
        view.apply(rec)
    assert nodes_to_run(plan, view) == {"b", "c"}  # (before: c, the otherwise, was lost)
