"""The scheduler's fast paths write the records its general path writes.

Two shortcuts skip machinery on the common step: a node alone in the run is awaited in
the loop's own task (`Runner.inline`), and the edges of a node whose every out-edge is
plain and unconditional are taken without being decided (`Decider.fast`, over
`Plan.always_taken`). With both off, every visit is a task and every edge is decided:
the records must be the same (but for when they were written and how long nodes took).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

import interlock
from interlock import END, START, Workflow
from interlock._decide import Decider
from interlock._runner import Runner

TIMING = ("at", "duration_ms")


def chain() -> Workflow:
    async def inc(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state.get("i", 0) + 1}

    wf = Workflow("chain")
    names = [f"n{k}" for k in range(5)]
    for name in names:
        wf.node(name, inc)
    wf.edge(START, names[0])
    for a, b in itertools.pairwise(names):
        wf.edge(a, b)
    return wf


def loop() -> Workflow:
    async def inc(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state.get("i", 0) + 1}

    wf = Workflow("loop")
    wf.node("inc", inc).node("done", lambda s: {"done": True})
    wf.edge(START, "inc").edge("inc", "inc", when="i < 4")
    wf.edge("inc", "done", otherwise=True)
    return wf


def fan_out_and_join() -> Workflow:
    wf = Workflow("fan", state={"seen": "append"})
    wf.node("start", lambda s: None)
    for name in ("a", "b", "c"):
        wf.node(name, lambda s, name=name: {"seen": [name]})
    wf.node("join", lambda s: {"n": len(s["seen"])})
    wf.edge(START, "start").edge("start", ["a", "b", "c"]).edge(["a", "b", "c"], "join")
    return wf


def retried_and_choosing() -> Workflow:
    calls: list[int] = []

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> Any:
        calls.append(1)
        ctx.record_tokens(3)
        if len(calls) < 2:
            raise ValueError("not yet")
        kept = await ctx.once("send", lambda: {"sent": len(calls)})
        return interlock.goto("end_here", {"kept": kept})

    wf = Workflow("retry")
    wf.node("flaky", flaky, retry={"attempts": 3})
    wf.node("end_here", lambda s: {"ok": True}).node("never", lambda s: None)
    wf.edge(START, "flaky").choose("flaky", ["end_here", "never"]).edge("end_here", END)
    return wf


def switched() -> Workflow:
    wf = Workflow("switch")
    wf.node("pick", lambda s: {"kind": "b"}).node("a", lambda s: None)
    wf.node("b", lambda s: {"b": True})
    wf.edge(START, "pick").switch("pick", "kind", {"a": "a", "b": "b"})
    return wf


WORKFLOWS: dict[str, Callable[[], Workflow]] = {
    "chain": chain, "loop": loop, "fan-out and join": fan_out_and_join,
    "retry, tokens, once and goto": retried_and_choosing, "switch": switched,
}


def records(wf: Workflow) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    wf.run_sync({}, store="memory://", listener=lambda r, v: recs.append(dict(r)))
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs]


@pytest.mark.parametrize("name", WORKFLOWS)
def test_fast_paths_write_the_records_of_the_general_path(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks: list[str] = []
    start_task = Runner._start_task

    def counting(self: Runner, node: str, *args: Any, **kw: Any) -> None:
        tasks.append(node)
        start_task(self, node, *args, **kw)

    monkeypatch.setattr(Runner, "_start_task", counting)
    fast = records(WORKFLOWS[name]())
    fast_tasks = list(tasks)
    monkeypatch.setattr(Runner, "inline", False)
    monkeypatch.setattr(Decider, "fast", False)
    tasks.clear()
    general = records(WORKFLOWS[name]())
    assert fast == general
    assert fast[-1]["type"] == "run.completed"
    # the general path did run every visit as a task; the fast one, only the branches
    assert len(tasks) == sum(r["type"] == "node.started" and r["attempt"] == 1
                             for r in general)
    assert len(fast_tasks) < len(tasks)


def test_the_chain_takes_the_always_taken_shortcut() -> None:
    wf = chain()
    assert wf.compile().always_taken >= {"n0", "n1", "n2", "n3"}
