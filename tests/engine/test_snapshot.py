"""Snapshots are a cache of the fold: restoring one and folding the rest gives the same view."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

import interlock
from interlock import START, Workflow
from interlock._engine import _snapshot as snapshots
from interlock._engine._flow import PortExit
from interlock._engine._fold import RunView


def canon(view: RunView) -> Any:
    data = orjson.loads(snapshots.dump(view, "h"))
    for key in ("running", "effects", "gates", "confirmations", "takes", "active"):
        data[key] = sorted(map(repr, data[key]))
    for key in ("deferred", "taken_exits"):
        data[key] = sorted(repr((c, sorted(map(repr, items)))) for c, items in data[key])
    return data


def loop_with_join() -> Workflow:
    wf = Workflow("snap", state={"i": "add", "log": "append"}, input=["stop"])
    wf.node("top", lambda s: {"i": 1, "log": "top"})
    wf.node("left", lambda s: {"log": "left"})
    wf.node("right", lambda s: {"log": "right"})
    wf.node("join", lambda s: {"log": "join"})
    wf.node("side", lambda s: {"log": "side"})
    wf.node("end", lambda s: {"done": True})
    wf.edge(START, "top").edge("top", "left").edge("top", "right", when="i % 2 == 0")
    wf.edge(["left", "right"], "join")
    wf.edge("join", "top", when="i < stop").edge("join", "side", otherwise=True)
    wf.edge("side", "end")
    return wf


def approval_flow() -> Workflow:
    wf = Workflow("gated")
    wf.node("a", lambda s: {"a": 1})
    wf.approval("gate", show=["a"], on_modify=["a"])
    wf.node("b", lambda s: {"b": 2})
    wf.edge(START, "a").edge("a", "gate").edge("gate", "b", when='gate.decision == "approved"')
    return wf


def map_in_a_loop() -> Workflow:
    wf = Workflow("mapped", state={"i": "add", "out": "extend"})
    wf.node("plan", lambda s: {"i": 1, "xs": [s.get("i", 0) * 10 + k for k in range(3)]})
    wf.node("work", lambda s: {"x": s["x"] * 2})
    wf.node("check", lambda s: {"n": len(s["out"])})
    wf.edge(START, "plan").map("plan", "xs", "work", as_="x", collect="out")
    wf.edge("work", "check").edge("check", "plan", when="i < 3")
    wf.edge("check", "END", otherwise=True)
    return wf


def records_of(wf: Workflow, *args: Any, **kw: Any) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    wf.run_sync(*args, store="memory://", listener=lambda r, v: recs.append(r), **kw)
    return recs


@pytest.mark.parametrize("make, args", [(loop_with_join, ({"stop": 6},)),
                                        (approval_flow, ()), (map_in_a_loop, ())])
def test_restoring_at_every_record_gives_the_same_view(make: Any, args: Any) -> None:
    wf = make()
    recs = records_of(wf, *args)
    plan = wf.compile()
    full = RunView(plan)
    for rec in recs:
        full.apply(rec)
    for k in range(1, len(recs)):
        head = RunView(plan)
        for rec in recs[:k]:
            head.apply(rec)
        restored = snapshots.load(plan, snapshots.dump(head, "h"))
        assert restored is not None
        view, _ = restored
        assert canon(view) == canon(head)
        for rec in recs[k:]:
            view.apply(rec)
        assert canon(view) == canon(full), f"diverged after a snapshot at record {k}"


# A snapshot as main wrote it before the view owned its codec and its loop exits were
# typed: ``loop_with_join`` at record 20 (stop 6), a join half full, a loop exit deferred.
STORED = (
    b'{"version":4,"seq":20,"hash":"h","state":{"stop":6,"i":2,"log":["top","left","join",'
    b'"top","left"]},"ready":[],"running":[["right",1,1,19,0,0,0]],"due":[],"visits":{"top'
    b'":2,"left":2,"right":0,"join":1,"side":0,"end":0},"started":{"top":2,"left":2,"join"'
    b':1,"right":1},"takes":[[0,1],[1,2],[3,1],[4,1],[2,1]],"steps":6,"tokens":0,"config":'
    b'{},"limits":{"steps":10000},"parent":null,"status":"RUNNING","error":null,"waiting":'
    b'null,"writers":{"i":["top",15],"log":["left",20]},"effects":[],"gates":[],"confirmat'
    b'ions":[],"routed":{"START":true,"top":true,"left":false,"*":true,"join":true},"route'
    b'_wait":{"top":0,"left":1,"join":0},"acts":{},"barriers":[[3,[[["left",true]]]]],"act'
    b'ive":[[2,1]],"deferred":[[2,[["port",4]]]],"taken_exits":[],"maps":[],"map_items":{}'
    b'}'
)


def test_a_stored_snapshot_is_read_and_dumped_back_byte_for_byte() -> None:
    plan = loop_with_join().compile()
    restored = snapshots.load(plan, STORED)
    assert restored is not None
    view, last_hash = restored
    assert (view.seq, last_hash) == (20, "h")
    assert view.flow.deferred == {2: {PortExit(4)}}
    assert list(view.flow.barriers[3]) == [{"left": True}]
    assert snapshots.dump(view, "h") == STORED


def test_an_unreadable_or_foreign_snapshot_is_ignored() -> None:
    plan = loop_with_join().compile()
    assert snapshots.load(plan, b"not json") is None
    assert snapshots.load(plan, orjson.dumps({"version": 999})) is None


def test_resume_reads_only_what_follows_the_snapshot(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "EVERY", 20)
    store = f"sqlite:///{tmp_path}/runs.db"
    fail_at = {"n": 25}

    def step(state: dict[str, Any]) -> dict[str, Any]:
        if state.get("i", 0) + 1 == fail_at["n"]:
            raise RuntimeError("transient")
        return {"i": 1, "log": state.get("i", 0)}

    wf = Workflow("long", state={"i": "add", "log": "append"})
    wf.node("step", step).edge(START, "step")
    wf.edge("step", "step", when="i < 40").edge("step", "END", otherwise=True)
    first = wf.run_sync(store=store)
    assert first.status == "FAILED"

    async def snapshot_seq() -> int:
        from interlock._store import open_store

        st = open_store(store)
        try:
            snap = await st.load_snapshot(first.run_id)
            return snap[0] if snap else 0
        finally:
            await st.close()

    assert asyncio.run(snapshot_seq()) >= 60  # several snapshots were taken on the way
    fail_at["n"] = -1
    done = wf.resume_sync(first.run_id, store=store)
    assert done.status == "COMPLETED"
    assert done.state["i"] == 40 and done.state["log"] == list(range(40))
    assert asyncio.run(interlock.verify(first.run_id, store=store)).ok
    status = asyncio.run(interlock.status(first.run_id, store=store))
    assert status.state == done.state and status.steps == done.steps
