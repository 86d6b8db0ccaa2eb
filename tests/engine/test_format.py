"""Log format 2 (`_log.FORMAT`): fewer records per node, the same run.

Each workflow runs twice, once writing format 1 and once format 2: the format-2 log has
fewer records, folds to the same run, and read as format 1 writes it (`Expander`, with
``node.visited`` split) is the format-1 log record for record, but for seqs and times.
And what a crash between two records means is kept: a visit that waits on anything has
its ``node.started`` sealed when it first waits, before its body goes on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import END, START, Workflow
from interlock import _log as L
from interlock._engine._expand import Expander
from interlock._store import open_store

DROP = frozenset({"seq", "at", "duration_ms", "implied", "format"})


async def inc(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": state.get("i", 0) + 1}


def chain_and_loop() -> Workflow:
    wf = Workflow("chain-loop")
    wf.node("a", inc).node("b", inc).node("step", inc)
    wf.edge(START, "a").edge("a", "b").edge("b", "step")
    wf.edge("step", "step", when="i < 6").edge("step", END, otherwise=True)
    return wf


def fan_join_and_waits() -> Workflow:
    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.001)  # waits: node.started, then node.completed
        return {"seen": ["slow"]}

    wf = Workflow("fan", state={"seen": "append"})
    wf.node("start", inc).node("slow", slow)
    wf.node("x", lambda s: {"seen": ["x"]}).node("y", lambda s: {"seen": ["y"]})
    wf.node("join", lambda s: {"n": len(s["seen"])}).node("last", inc)
    wf.edge(START, "start").edge("start", "slow").edge("slow", ["x", "y"])
    wf.edge(["x", "y"], "join").edge("join", "last")
    return wf


def two_whens_retry_and_goto() -> Workflow:
    tries: list[int] = []

    async def flaky(state: dict[str, Any]) -> Any:
        tries.append(1)
        if len(tries) % 2:
            raise ValueError("not yet")
        return interlock.goto("picked", {"k": 2})

    wf = Workflow("mixed")
    wf.node("pick", inc).node("one", inc).node("two", inc).node("other", inc)
    wf.node("flaky", flaky, retry={"attempts": 3}).node("picked", inc).node("never", inc)
    wf.edge(START, "pick")
    wf.edge("pick", "one", when="i == 1").edge("pick", "two", when="i == 2")
    wf.edge("pick", "other", otherwise=True)
    wf.edge("one", "flaky").choose("flaky", ["picked", "never"])
    return wf


WORKFLOWS = {"chain and loop": chain_and_loop, "fan, join, a node that waits":
             fan_join_and_waits, "two whens, retry, goto": two_whens_retry_and_goto}


def _run(wf: Workflow, fmt: int, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[interlock.RunResult, list[dict[str, Any]], Any]:
    monkeypatch.setattr(L, "FORMAT", fmt)

    async def go() -> tuple[interlock.RunResult, list[dict[str, Any]]]:
        st = open_store("memory://")
        result = await wf.run({}, store=st)
        assert (await interlock.verify(result.run_id, store=st)).ok
        return result, [e.record() for e in await st.entries(result.run_id)]

    result, records = asyncio.run(go())
    return result, records, wf.compile()


@pytest.mark.parametrize("name", WORKFLOWS)
def test_format_2_writes_fewer_records_for_the_same_run(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old, old_log, plan = _run(WORKFLOWS[name](), 1, monkeypatch)
    new, new_log, _ = _run(WORKFLOWS[name](), 2, monkeypatch)
    assert "format" not in old_log[0] and new_log[0]["format"] == 2
    assert (new.status, new.state, new.steps) == (old.status, old.state, old.steps)
    assert len(new_log) < len(old_log)
    assert not any(r["type"] == "node.visited" for r in old_log)
    expanded = Expander(plan, split=True).expand(new_log)
    assert [{k: v for k, v in r.items() if k not in DROP} for r in expanded] == \
        [{k: v for k, v in r.items() if k not in DROP} for r in old_log]


def test_a_visit_that_waits_has_its_start_sealed_when_it_first_waits() -> None:
    """The start of a visit that waits on anything is sealed -- and told to listeners,
    and flushed by the next flush (the watcher's, for a long wait) -- before its body
    goes on: a crash while it waits finds it started, as in format 1."""
    seen: list[str] = []

    async def waits(state: dict[str, Any]) -> dict[str, Any]:
        seen.append("body before its wait")
        await asyncio.sleep(0)
        seen.append("body after its wait")
        return {"w": 1}

    wf = Workflow("waits").node("quick", inc).node("w", waits)
    wf.edge(START, "quick").edge("quick", "w")
    result = wf.run_sync({}, store="memory://",
                         listener=lambda r, v: seen.append(f"{r['type']} {r.get('node')}"))
    assert result.ok
    assert seen == ["run.started None", "edge.taken None", "node.visited quick",
                    "edge.taken None",  # (implied: told to listeners as format 1 wrote it)
                    "body before its wait", "node.started w", "body after its wait",
                    "node.completed w", "run.completed None"]


NODES = '''
def first(state):
    return {"first": state.get("n", 0) + 1}

def last(state):
    return {"last": True}
'''

CHILD = '''
workflow: child
input: [n]
nodes:
  first: fmt2nodes:first
  check: {approval: {show: [first]}}
edges:
  - {from: START, to: first}
  - {from: first, to: check}
'''

PARENT = '''
workflow: parent
input: [n]
nodes:
  sub: {workflow: child.yaml}
  last: fmt2nodes:last
edges:
  - {from: START, to: sub}
  - {from: sub, to: last}
'''


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_child_gate_decided_through_its_parent_lets_the_child_finish(
        fmt: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's gate (``check``, its last node) decided through the parent: the
    decision and the gate's completion are recorded in the child, which the parent then
    continues. In format 2 ``check``'s edges are implied (none: the child ends there), so
    nothing is due in the child after that completion -- yet it does not wait for anyone
    any more: it is to finish, as in format 1. (It was taken for a child still waiting
    at no gate: the parent asked again, and a server's stream waited for ever.)"""
    from interlock._ops._children import _decide_child, waiting_paths

    monkeypatch.setattr(L, "FORMAT", fmt)
    (tmp_path / "fmt2nodes.py").write_text(NODES)
    (tmp_path / "child.yaml").write_text(CHILD)
    (tmp_path / "parent.yaml").write_text(PARENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = interlock.load(str(tmp_path / "parent.yaml"))

    async def go() -> None:
        st = open_store("memory://")
        for rid in ("p", "q"):
            assert (await wf.run({"n": 2}, store=st, run_id=rid)).status == \
                "WAITING_APPROVAL"
        # recorded in the child only (what deciding through the parent does first)
        await _decide_child(st, "p.sub.1", interlock.Decision("approve", "x"))
        assert await waiting_paths(st, "p.sub.1", "p") is None  # not waiting at a gate
        assert (await interlock.resume("p", store=st, workflow=wf)).status == "COMPLETED"
        # and in one call, as `interlock resume q --approve` and the server decide
        done = await interlock.resume("q", interlock.Decision("approve", "x"), store=st,
                                      workflow=wf)
        assert done.status == "COMPLETED", done
        assert done.state["last"] is True and done.state["sub"]["first"] == 3
        for rid in ("p.sub.1", "q.sub.1"):
            assert (await st.get_run(rid)).summary.status == "COMPLETED"

    asyncio.run(go())


DRIFT = '''
workflow: drift
nodes:
  a: fmt2nodes:first
  gate: {approval: {show: [first]}}
  b: fmt2nodes:last
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: b, to: END}
'''

# c between the gate and b; its edge first, so the edges' indexes all move
DRIFT_V2 = DRIFT.replace("  b: fmt2nodes:last", "  c: fmt2nodes:first\n  b: fmt2nodes:last") \
    .replace("edges:\n", "edges:\n  - {from: c, to: b}\n").replace("{from: gate, to: b,",
                                                                  "{from: gate, to: c,")


def test_a_migrated_runs_records_read_from_after_the_migration_imply_the_new_edges(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a record implies is the definition's in force at that record: after a
    ``run.migrated``, the new one's -- also for a reader that starts after it (a
    server's event stream reads from the last record it sent). It read the run's first
    definition there: c's edge to b was missing, and b's edge named by a wrong index."""
    from interlock._ops import _load
    from interlock.support import migrate_run

    (tmp_path / "fmt2nodes.py").write_text(NODES)
    (tmp_path / "v1.yaml").write_text(DRIFT)
    (tmp_path / "v2.yaml").write_text(DRIFT_V2)
    monkeypatch.syspath_prepend(str(tmp_path))
    v1, v2 = (interlock.load(str(tmp_path / f)) for f in ("v1.yaml", "v2.yaml"))

    def shown(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(r["seq"], r["type"], r.get("edge"), r.get("from"), tuple(r.get("to") or ()),
                 "implied" in r) for rec in records for r in (rec, *rec.get("implies", ()))]

    async def go() -> None:
        st = open_store("memory://")
        assert (await v1.run({}, store=st, run_id="m")).status == "WAITING_APPROVAL"
        at = (await migrate_run("m", v2.spec, store=st, by="ops")).recorded
        done = await interlock.resume("m", interlock.Decision("approve", "x"), store=st,
                                      workflow=v2)
        assert done.status == "COMPLETED", done
        whole = shown(await interlock.trace("m", store=st))
        assert ("edge.taken", 0, "c", ("b",), True) in [r[1:] for r in whole]  # (implied)
        for cache in ("kept", "cleared"):  # this process read it before / a new reader
            if cache == "cleared":
                for kept in _load._EXPANDING:
                    kept.clear()
            later = [r async for page in interlock.support.trace_pages("m", store=st,
                                                                       after=at)
                     for r in page]
            assert shown(later) == [r for r in whole if r[0] > at], cache

    asyncio.run(go())


def loop_to_done(when: str) -> Workflow:
    wf = Workflow("loop-done")
    wf.node("step", inc).node("done", lambda s: {"done": True})
    wf.edge(START, "step").edge("step", "step", when=when)
    wf.edge("step", "done", otherwise=True)
    return wf


def test_a_loops_completion_owes_only_its_when_decision() -> None:
    """Format 2: a node with one ``when`` edge and an ``otherwise`` edge owes, once
    completed, only the ``when`` edge's decision -- the fold makes no due of the
    ``otherwise`` edge, which that decision's record implies (the loop's hot path:
    before, a due was made and popped again every iteration). A stored log folds to
    what the run holds, and only ``when`` decisions are recorded."""
    from interlock._engine._fold import RunView

    wf = loop_to_done("i < 5")
    plan = wf.compile()
    step_edges = [e.index for e in plan.nodes["step"].out]

    async def go() -> tuple[interlock.RunResult, list[dict[str, Any]]]:
        st = open_store("memory://")
        result = await wf.run({"i": 0}, store=st)
        assert (await interlock.verify(result.run_id, store=st)).ok
        return result, [e.record() for e in await st.entries(result.run_id)]

    result, records = asyncio.run(go())
    assert result.ok and result.state == {"i": 5, "done": True}
    when = next(e.index for e in plan.nodes["step"].out if e.cond is not None)
    decided = [r["edge"] for r in records if r["type"].startswith("edge.") and
               r.get("from") == "step"]
    assert decided == [when] * 5  # the otherwise edge: implied, never written
    view = RunView(plan)
    owed = []
    for rec in records:
        view.apply(dict(rec))
        if rec["type"] == "node.visited" and rec["node"] == "step":
            owed.append(sorted(view.due))
    assert owed == [[(when, "step")]] * 5
    assert view.state == result.state and view.status == "COMPLETED"
    assert [view.takes[i] for i in step_edges] == [4, 1]  # (when 4 times, otherwise once)


def test_a_condition_that_could_not_be_evaluated_is_decided_on_resume() -> None:
    """A ``when`` that fails (it reads a config key the run was not given) fails the
    run with its decision still owed; a resume with the key decides it -- and the
    ``otherwise`` edge its record implies is taken when it is false."""
    wf = loop_to_done("i < config.limit")

    async def go() -> list[dict[str, Any]]:
        st = open_store("memory://")
        failed = await wf.run({"i": 0}, store=st)
        assert failed.status == "FAILED" and failed.error is not None
        assert failed.error["type"] == "expression_error", failed.error
        assert "config.limit" in failed.error["message"]
        done = await wf.resume(failed.run_id, store=st, config={"limit": 3})
        assert done.status == "COMPLETED" and done.state == {"i": 3, "done": True}
        assert (await interlock.verify(failed.run_id, store=st)).ok
        return [r for rec in await interlock.trace(failed.run_id, store=st)
                for r in (rec, *rec.get("implies", ()))]

    shown = [(r["type"], r.get("expr"), r.get("value"), tuple(r.get("to") or ()))
             for r in asyncio.run(go()) if r["type"].startswith("edge.")
             and r.get("from") == "step"]
    again = [("edge.taken", "i < config.limit", True, ("step",)),
             ("edge.skipped", "otherwise", False, ())]
    assert shown == again * 2 + [("edge.skipped", "i < config.limit", False, ()),
                                 ("edge.taken", "otherwise", True, ("done",))]
