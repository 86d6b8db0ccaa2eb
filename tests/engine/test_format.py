"""Log formats 2 and 3 (`_log.FORMAT`): fewer records per node, the same run.

Each workflow runs once writing format 1 and once format 2 (or 3): the newer log has
fewer records, folds to the same run, and read as format 1 writes it (`Expander`, with
``node.visited`` split) is the format-1 log record for record, but for seqs and times.
Format 3's ``node.visited`` carries its node's ``when`` decision: its log folds to its
format-2 twin's view record for record, and `verify` refuses the field where the engine
would not have written it.
And what a crash between two records means is kept: a visit that waits on anything has
its ``node.started`` sealed when it first waits, before its body goes on.
"""

from __future__ import annotations

import asyncio
import json
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


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("name", WORKFLOWS)
def test_formats_2_and_3_write_fewer_records_for_the_same_run(
        name: str, fmt: int, monkeypatch: pytest.MonkeyPatch) -> None:
    old, old_log, plan = _run(WORKFLOWS[name](), 1, monkeypatch)
    new, new_log, _ = _run(WORKFLOWS[name](), fmt, monkeypatch)
    assert "format" not in old_log[0] and new_log[0]["format"] == fmt
    assert (new.status, new.state, new.steps) == (old.status, old.state, old.steps)
    assert len(new_log) < len(old_log)
    assert not any(r["type"] == "node.visited" for r in old_log)
    assert any("when" in r for r in new_log) == (fmt == 3 and name == "chain and loop")
    expanded = Expander(plan, split=True).expand(new_log)
    assert [{k: v for k, v in r.items() if k not in DROP} for r in expanded] == \
        [{k: v for k, v in r.items() if k not in DROP} for r in old_log]
    if fmt == 3:  # fewer than format 2 where a loop's visit carries its decision
        _, fmt2_log, _ = _run(WORKFLOWS[name](), 2, monkeypatch)
        assert (len(new_log) < len(fmt2_log)) == (name == "chain and loop")


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


def loop_to_done(when: str, max: int | None = None) -> Workflow:
    wf = Workflow("loop-done")
    wf.node("step", inc).node("done", lambda s: {"done": True})
    wf.edge(START, "step").edge("step", "step", when=when, max=max)
    wf.edge("step", "done", otherwise=True)
    return wf


def test_a_loops_completion_owes_only_its_when_decision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Format 2: a node with one ``when`` edge and an ``otherwise`` edge owes, once
    completed, only the ``when`` edge's decision -- the fold makes no due of the
    ``otherwise`` edge, which that decision's record implies (the loop's hot path:
    before, a due was made and popped again every iteration). A stored log folds to
    what the run holds, and only ``when`` decisions are recorded."""
    from interlock._engine._fold import RunView

    monkeypatch.setattr(L, "FORMAT", 2)
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


# -- log format 3: a visit's record carries its ``when`` edge's decision -------------------


def _stored_log(wf: Workflow, fmt: int, monkeypatch: pytest.MonkeyPatch,
                **run: Any) -> tuple[interlock.RunResult, list[dict[str, Any]],
                                     list[dict[str, Any]]]:
    """A run of ``wf`` in format ``fmt``: its result, its stored records, and what its
    listener was told (the records as stored, and what each implies)."""
    monkeypatch.setattr(L, "FORMAT", fmt)
    told: list[dict[str, Any]] = []

    async def go() -> tuple[interlock.RunResult, list[dict[str, Any]]]:
        st = open_store("memory://")
        result = await wf.run(run.pop("input", {}), store=st,
                              listener=lambda r, v: told.append(dict(r)), **run)
        assert (await interlock.verify(result.run_id, store=st)).ok
        return result, [e.record() for e in await st.entries(result.run_id)]

    result, records = asyncio.run(go())
    return result, records, told


def _seen(view: Any) -> tuple[Any, ...]:
    """What a view holds, but for seqs (the formats number records differently)."""
    return (view.status, dict(view.state), view.steps, dict(view.visits), dict(view.takes),
            sorted(view.due), list(view.ready), sorted(view.running), dict(view.routed),
            dict(view.route_wait), {k: list(v) for k, v in view.flow.acts.items()},
            {k: list(v) for k, v in view.flow.barriers.items()}, dict(view.flow.active),
            {k: sorted(map(repr, v)) for k, v in view.flow.deferred.items()})


@pytest.mark.parametrize("max", [None, 2])
def test_a_format_3_visit_carries_its_when_decision_and_folds_as_its_format_2_twin(
        max: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Format 3: each visit of the loop's node is one ``node.visited`` with its ``when``
    edge's decision in it (every field its ``edge.taken``/``edge.skipped`` had but
    ``from``: a ``reason`` when its ``max`` stopped it); no edge record of the node is
    written. Folded, the log goes through the same views as its format-2 twin's -- the
    twin's view after a visit's edge record is the format-3 view after that visit -- and
    the listener is told what format 2 told it."""
    from interlock._engine._fold import RunView

    wf = loop_to_done("i < 5", max)
    plan = wf.compile()
    when = plan.implied_when["step"][0].index
    old, old_log, old_told = _stored_log(loop_to_done("i < 5", max), 2, monkeypatch,
                                         input={"i": 0})
    new, new_log, new_told = _stored_log(wf, 3, monkeypatch, input={"i": 0})
    assert (new.status, new.state, new.steps) == (old.status, old.state, old.steps)
    n = 5 if max is None else max + 1
    assert len(new_log) == len(old_log) - n
    assert not any(r["type"].startswith("edge.") and r.get("from") == "step"
                   for r in new_log)
    visits = [r for r in new_log if r.get("node") == "step"]
    assert [r["type"] for r in visits] == ["node.visited"] * n
    last = {"edge": when, "expr": "i < 5", "reads": {"i": n}, "value": max is not None}
    if max is not None:
        last["reason"] = f"max {max} reached"
    assert [r["when"] for r in visits] == [
        {"edge": when, "expr": "i < 5", "reads": {"i": i}, "to": ["step"], "value": True}
        for i in range(1, n)] + [last]
    twins = [r for r in old_log if r["type"].startswith("edge.") and r["from"] == "step"]
    assert [dict(r["when"], **{"from": "step"}) for r in visits] == \
        [{k: v for k, v in r.items() if k not in ("seq", "type", "at")} for r in twins]

    def views(log: list[dict[str, Any]], skip: set[int]) -> list[tuple[Any, ...]]:
        view, out = RunView(plan), []
        for rec in log:
            view.apply(dict(rec))
            if rec["seq"] not in skip:
                out.append(_seen(view))
        return out

    # in format 2, the view between a visit and its decision has no format-3 twin
    between = {r["seq"] for r in old_log if r["type"] == "node.visited" and r["node"] == "step"}
    assert views(new_log, set()) == views(old_log, between)
    drop = {"seq", "at", "duration_ms", "format", "code", "definition_hash", "when", "implied"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in new_told] == \
        [{k: v for k, v in r.items() if k not in drop} for r in old_told]


def test_a_when_that_cannot_be_evaluated_leaves_the_visit_as_format_2_stores_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``when`` whose condition raises: the visit is stored without a decision in it
    and the run fails with the decision owed; the resume that decides it writes the
    edge's record of its own, and the visits after it carry theirs again."""
    wf = loop_to_done("i < config.limit")
    monkeypatch.setattr(L, "FORMAT", 3)

    async def go() -> list[dict[str, Any]]:
        st = open_store("memory://")
        failed = await wf.run({"i": 0}, store=st)
        assert failed.status == "FAILED"
        assert (await wf.resume(failed.run_id, store=st, config={"limit": 3})).ok
        assert (await interlock.verify(failed.run_id, store=st)).ok
        return [e.record() for e in await st.entries(failed.run_id)]

    log = [(r["type"], r.get("node") or r.get("from"), "when" in r) for r in asyncio.run(go())
           if r.get("node") == "step" or r.get("from") == "step" or r["type"] == "run.failed"]
    assert log == [("node.visited", "step", False), ("run.failed", "step", False),
                   ("edge.taken", "step", False), ("node.visited", "step", True),
                   ("node.visited", "step", True)]


GATED_LOOP = '''
workflow: gated-loop
nodes:
  gate: {approval: {show: [i]}}
  step: fmt3nodes:step
edges:
  - {from: START, to: gate}
  - {from: gate, to: step, when: 'gate.decision == "approved"'}
  - {from: step, to: step, when: 'i < 3'}
  - {from: step, to: END, otherwise: true}
'''


@pytest.mark.parametrize("fmt", [1, 2, 3])
def test_a_run_keeps_its_format_when_a_newer_version_continues_it(
        fmt: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that waits, started in format 1, 2 or 3, continued by this version (which
    writes format 3): its records after the decision are of its own format -- no
    ``node.visited`` in format 1, no ``when`` in a visit before format 3."""
    (tmp_path / "fmt3nodes.py").write_text("async def step(state):\n"
                                           "    return {'i': state.get('i', 0) + 1}\n")
    (tmp_path / "gated.yaml").write_text(GATED_LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = interlock.load(str(tmp_path / "gated.yaml"))

    async def go() -> list[dict[str, Any]]:
        st = open_store("memory://")
        monkeypatch.setattr(L, "FORMAT", fmt)
        assert (await wf.run({}, store=st, run_id="g")).status == "WAITING_APPROVAL"
        monkeypatch.setattr(L, "FORMAT", 3)
        done = await interlock.resume("g", interlock.Decision("approve", "x"), store=st,
                                      workflow=wf)
        assert done.status == "COMPLETED" and done.state["i"] == 3
        assert (await interlock.verify("g", store=st)).ok
        return [e.record() for e in await st.entries("g")]

    log = asyncio.run(go())
    assert log[0].get("format", 1) == fmt
    steps = [r for r in log if r.get("node") == "step" or r.get("from") == "step"]
    assert any(r["type"] == "node.visited" for r in steps) == (fmt > 1)
    assert any("when" in r for r in steps) == (fmt == 3)
    assert any(r["type"].startswith("edge.") for r in steps) == (fmt < 3)


def _forged(log: list[dict[str, Any]], change: Any) -> list[L.Entry]:
    """``log`` with ``change`` made to its records (a dict of them by seq, in place), and
    chained again: what someone who can write a plain log's store can make."""
    writer = L.LogWriter()
    entries = []
    records = {r["seq"]: dict(r) for r in log}
    change(records)
    for seq in sorted(records):
        rec = records[seq]
        fields = {k: v for k, v in rec.items() if k not in ("seq", "type", "at")}
        entries.append(writer.seal(rec["type"], fields, rec["at"])[1])
    return entries


def _verified(row: Any, entries: list[L.Entry]) -> Any:
    """`verify` of ``entries`` stored as a run of ``row``'s definition."""
    import dataclasses

    async def go() -> Any:
        st = open_store("memory://")
        await st.create_run(dataclasses.replace(row, run_id="f", summary=dataclasses.replace(
            row.summary, last_seq=entries[-1].seq, last_hash=entries[-1].hash)), entries)
        return await interlock.verify("f", store=st)

    return asyncio.run(go())


def _chain_loop() -> Workflow:
    wf = Workflow("chain-then-loop")
    wf.node("a", inc).node("step", inc)
    wf.edge(START, "a").edge("a", "step")
    wf.edge("step", "step", when="i < 3").edge("step", END, otherwise=True)
    return wf


def _visit(records: dict[int, dict[str, Any]], node: str, n: int = 0) -> dict[str, Any]:
    return [r for _, r in sorted(records.items()) if r.get("node") == node
            and r["type"] == "node.visited"][n]


def _move_when(records: dict[int, dict[str, Any]]) -> None:
    """The first loop visit's decision moved onto the chain's node ``a``."""
    _visit(records, "a")["when"] = _visit(records, "step").pop("when")


def _wrong_edge(records: dict[int, dict[str, Any]]) -> None:
    _visit(records, "step")["when"]["edge"] = 0


def _in_format_2(records: dict[int, dict[str, Any]]) -> None:
    records[1]["format"] = 2


def _in_format_4(records: dict[int, dict[str, Any]]) -> None:
    """A log a newer version wrote: refused at its first record, not misread."""
    records[1]["format"] = 4


@pytest.mark.parametrize(("change", "says"), [
    (_move_when, "'a' is not a node whose edges are one `when` edge"),
    (_wrong_edge, "its completion owed no decision of that edge"),
    (_in_format_2, "a log of format 2 never holds one"),
    (_in_format_4, "record 1: the run's log is in format 4, and this version of interlock "
                   "reads formats 1 to 3"),
])
def test_verify_refuses_a_when_where_the_engine_would_not_write_one(
        change: Any, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``when`` on the visit of a node that is not a loop's ``when``/``otherwise`` node,
    naming another edge, or in a log before format 3: the log is refused at that record
    -- the fold does not follow it."""
    monkeypatch.setattr(L, "FORMAT", 3)

    async def go() -> tuple[Any, list[dict[str, Any]]]:
        st = open_store("memory://")
        result = await _chain_loop().run({"i": 0}, store=st)
        return await st.get_run(result.run_id), [e.record() for e in
                                                  await st.entries(result.run_id)]

    row, log = asyncio.run(go())
    assert _verified(row, _forged(log, lambda r: None)).ok  # (re-chained, unchanged: fine)
    found = _verified(row, _forged(log, change))
    assert not found.ok and says in found.message, found.message


def test_a_format_3_run_exported_verifies_from_the_file_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`export` writes a format-3 run's records as stored (its visits' ``when`` in them),
    and `verify --file` folds them, with no store, to the same end."""
    from click.testing import CliRunner

    from interlock.cli import cli

    monkeypatch.setattr(L, "FORMAT", 3)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = loop_to_done("i < 4").run_sync({"i": 0}, store=store).run_id
    out = CliRunner().invoke(cli, ["export", run_id, "--store", store],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = out.stdout_bytes.splitlines()
    records = [json.loads(line) for line in lines[1:]]
    assert sum("when" in r for r in records) == 4
    (tmp_path / "runs.db").unlink()
    (tmp_path / "run.jsonl").write_bytes(out.stdout_bytes)
    checked = CliRunner().invoke(cli, ["verify", "--file", str(tmp_path / "run.jsonl")],
                                 catch_exceptions=False)
    assert checked.exit_code == 0, checked.output
    assert checked.output.startswith(f"ok: {run_id} ({len(records)} records")
