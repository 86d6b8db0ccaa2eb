"""What a plan remembers of the functions it was given: while they live, not after.

A plan is built for every run a process loads, and builds are fast because a function's
signature is read once. A process that makes its functions as it goes (a lambda per
workflow it builds, closing over that workflow's client or data) must get them back
when it drops the workflow.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from interlock import END, START, Workflow


class Payload:
    """Stands for what a node's function closes over (a client, a model, a dataset)."""


def made(payload: Payload) -> Workflow:
    wf = Workflow("made")
    wf.node("a", lambda state: {"seen": type(payload).__name__})
    wf.edge(START, "a").edge("a", END)
    return wf


def alive() -> int:
    gc.collect()
    return sum(type(o) is Payload for o in gc.get_objects())


def test_a_workflow_built_per_run_leaves_its_functions_behind_no_more() -> None:
    # Before, the signature caches (functools.cache) held every function a plan was
    # built with, and what it closed over, for as long as the process lived: 60 here.
    async def main() -> None:
        for _ in range(60):
            result = await made(Payload()).run({}, store="memory://")
            assert result.status == "COMPLETED" and result.state["seen"] == "Payload"

    asyncio.run(main())
    assert alive() <= 10


class Unhashable:
    """A callable object that defines equality (so no hash) and wants ``ctx``."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unhashable)

    __hash__ = None  # type: ignore[assignment]

    async def __call__(self, state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"run": ctx.run_id}


def test_callables_no_cache_can_hold_still_run() -> None:
    wf = Workflow("odd")
    wf.node("a", Unhashable())
    wf.node("b", dict.copy)  # a builtin: no weak reference can point to it
    wf.edge(START, "a").edge("a", "b").edge("b", END)
    result = wf.run_sync({}, store="memory://", run_id="odd-1")
    assert result.status == "COMPLETED", result.error
    assert result.state["run"] == "odd-1"
