"""The scheduler's semantics (SPEC §1), through the public API, one construct at a time."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import interlock
from interlock import END, START, Workflow
from interlock._engine._expand import Expander


def run(wf: Workflow, input: dict[str, Any] | None = None, **kw: Any) -> tuple[Any, list[dict]]:
    records: list[dict] = []
    kw.setdefault("store", "memory://")
    result = wf.run_sync(input or {}, listener=lambda rec, view: records.append(rec), **kw)
    return result, records


def started(records: list[dict]) -> list[str]:
    return [r["node"] for r in records if r["type"] in ("node.started", "node.visited")]


def node(update: dict[str, Any] | None = None):
    async def fn(state: dict[str, Any]) -> dict[str, Any] | None:
        return update

    return fn


# -- chains, fan-out, joins ------------------------------------------------------------


def test_sequential_chain_passes_state_along() -> None:
    wf = Workflow("chain")
    wf.node("a", lambda s: {"x": 1})
    wf.node("b", lambda s: {"y": s["x"] + 1})
    wf.node("c", lambda s: {"z": s["y"] * 10})
    wf.edge(START, "a").edge("a", "b").edge("b", "c").edge("c", END)
    result, records = run(wf)
    assert result.status == "COMPLETED"
    assert result.state == {"x": 1, "y": 2, "z": 20}
    assert started(records) == ["a", "b", "c"]
    assert result.steps == 3


def test_fan_out_branches_run_concurrently() -> None:
    # Two sync nodes each wait for the other at a barrier: only concurrent execution
    # (worker threads) gets both through; lock-step execution would time out.
    barrier = threading.Barrier(2, timeout=5)

    def branch(name: str):
        def fn(state: dict[str, Any]) -> dict[str, Any]:
            barrier.wait()
            return {name: True}

        return fn

    wf = Workflow("fan")
    wf.node("a", node())
    wf.node("b", branch("b"))
    wf.node("c", branch("c"))
    wf.node("d", lambda s: {"both": s["b"] and s["c"]})
    wf.edge(START, "a").edge("a", ["b", "c"]).edge(["b", "c"], "d")
    result, records = run(wf)
    assert result.status == "COMPLETED", result.error
    assert result.state["both"] is True
    assert started(records).count("d") == 1


def test_fast_branch_successor_does_not_wait_for_slow_sibling() -> None:
    # slow finishes only after fast2 (the successor of the fast branch) has run: an
    # engine that waits for every branch of a step before starting the next would hang.
    fast2_ran = asyncio.Event()

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(fast2_ran.wait(), timeout=5)
        return {"slow": True}

    async def fast2(state: dict[str, Any]) -> dict[str, Any]:
        fast2_ran.set()
        return {"fast2": True}

    wf = Workflow("event-driven")
    wf.node("a", node()).node("fast", node({"fast": True})).node("fast2", fast2)
    wf.node("slow", slow).node("end", node())
    wf.edge(START, "a").edge("a", ["fast", "slow"]).edge("fast", "fast2")
    wf.edge(["fast2", "slow"], "end")
    result, records = run(wf)
    assert result.status == "COMPLETED", result.error
    order = started(records)
    assert order.index("fast2") < [r["node"] for r in records
                                   if r["type"] == "node.completed"].index("slow") + 10
    assert result.state == {"fast": True, "fast2": True, "slow": True}


def test_join_after_skipped_branch_fires_once_and_does_not_hang() -> None:
    wf = Workflow("skip-join", input=["go"])
    wf.node("a", node()).node("b", node({"b": 1})).node("c", node({"c": 1}))
    wf.node("d", node({"d": 1}))
    wf.edge(START, "a")
    wf.edge("a", "b", when="go")
    wf.edge("a", "c")
    wf.edge(["b", "c"], "d")
    result, records = run(wf, {"go": False})
    assert result.status == "COMPLETED", result.error
    assert started(records) == ["a", "c", "d"]
    assert "b" not in result.state


def test_join_whose_sources_are_all_ruled_out_is_ruled_out() -> None:
    wf = Workflow("dead-join", input=["go"])
    wf.node("a", node()).node("b", node()).node("c", node()).node("d", node({"d": 1}))
    wf.node("e", node({"e": 1}))
    wf.edge(START, "a")
    wf.edge("a", ["b", "c"], when="go")
    wf.edge("a", "e", otherwise=True)
    wf.edge(["b", "c"], "d")
    result, records = run(wf, {"go": False})
    assert result.status == "COMPLETED"
    assert started(records) == ["a", "e"]


def test_ruling_out_propagates_through_a_chain_to_a_join() -> None:
    wf = Workflow("deep", input=["go"])
    for n in ["a", "b1", "b2", "b3", "c", "j"]:
        wf.node(n, node({n: True}))
    wf.edge(START, "a").edge("a", "b1", when="go").edge("b1", "b2").edge("b2", "b3")
    wf.edge("a", "c")
    wf.edge(["b3", "c"], "j")
    result, records = run(wf, {"go": False})
    assert result.status == "COMPLETED"
    assert started(records) == ["a", "c", "j"]


def test_diamond_without_join_runs_bottom_once_per_edge() -> None:
    wf = Workflow("diamond", state={"hits": "add"})
    wf.node("a", node()).node("b", node()).node("c", node()).node("d", node({"hits": 1}))
    wf.edge(START, "a").edge("a", ["b", "c"]).edge("b", "d").edge("c", "d")
    result, _ = run(wf)
    assert result.state["hits"] == 2
    assert any(d.code == "diamond" for d in wf.warnings)


# -- conditions --------------------------------------------------------------------


def test_when_and_otherwise_route_on_state_and_config() -> None:
    wf = Workflow("policy", config={"min_conf": 0.5}, input=["rca", "decision"])
    wf.node("gate", node()).node("fix", node({"fixed": True}))
    wf.edge(START, "gate")
    wf.edge("gate", "fix", when='decision == "approved" && rca.confidence >= config.min_conf '
                                '&& rca.severity != "low"')
    wf.edge("gate", END, otherwise=True)
    ok, recs = run(wf, {"decision": "approved", "rca": {"confidence": 0.9, "severity": "high"}})
    assert ok.state.get("fixed") is True
    taken = next(r for r in recs if r["type"] == "edge.taken" and r.get("to") == ["fix"])
    assert taken["reads"] == {"decision": "approved", "rca.confidence": 0.9,
                              "config.min_conf": 0.5, "rca.severity": "high"}
    low, _ = run(wf, {"decision": "approved", "rca": {"confidence": 0.4, "severity": "high"}})
    assert "fixed" not in low.state and low.status == "COMPLETED"
    # the threshold is a per-run knob
    knob, _ = run(wf, {"decision": "approved", "rca": {"confidence": 0.4, "severity": "high"}},
                  config={"min_conf": 0.3})
    assert knob.state.get("fixed") is True


def test_int_and_double_compare() -> None:
    wf = Workflow("num", input=["x"])
    wf.node("a", node()).node("hi", node({"hi": True}))
    wf.edge(START, "a").edge("a", "hi", when="x >= 1").edge("a", END, otherwise=True)
    assert "hi" not in run(wf, {"x": 0.9})[0].state
    assert run(wf, {"x": 1.0})[0].state["hi"] is True
    assert run(wf, {"x": 2})[0].state["hi"] is True


def test_condition_reading_a_missing_field_fails_the_run_loudly() -> None:
    wf = Workflow("missing")
    wf.node("a", node()).node("b", node())
    wf.edge(START, "a").edge("a", "b", when="risk.level == 'HIGH'")
    wf.edge("a", END, otherwise=True)
    result, _ = run(wf)
    assert result.status == "FAILED"
    assert result.error["type"] == "expression_error"
    assert "risk" in result.error["message"] and "a -> b" in result.error["message"]


def test_condition_with_a_wrong_type_fails_with_the_expression() -> None:
    wf = Workflow("types", input=["x"])
    wf.node("a", node()).node("b", node())
    wf.edge(START, "a").edge("a", "b", when="x > 1").edge("a", END, otherwise=True)
    result, _ = run(wf, {"x": "text"})
    assert result.status == "FAILED"
    assert "x > 1" in result.error["message"]
    assert result.error["node"] == "a"  # the edge's source: where `status` points


def test_non_boolean_condition_fails() -> None:
    wf = Workflow("nonbool", input=["x"])
    wf.node("a", node()).node("b", node())
    wf.edge(START, "a").edge("a", "b", when="x").edge("a", END, otherwise=True)
    result, _ = run(wf, {"x": 3})
    assert result.status == "FAILED" and "not a boolean" in result.error["message"]


def test_no_route_lists_each_edge_and_its_value() -> None:
    wf = Workflow("noroute", input=["level"])
    wf.node("a", node()).node("b", node()).node("c", node())
    wf.edge(START, "a")
    wf.edge("a", "b", when='level == "HIGH"').edge("a", "c", when='level == "LOW"')
    result, _ = run(wf, {"level": "MEDIUM"})
    assert result.status == "FAILED"
    assert result.error["type"] == "no_route" and result.error["node"] == "a"
    assert "a -> b" in result.error["message"] and "a -> c" in result.error["message"]
    assert '[level == "HIGH" = false]' in result.error["message"]  # as CEL writes it


# -- routing ------------------------------------------------------------------------


def test_switch_routes_by_value_with_default() -> None:
    wf = Workflow("switch", input=["risk"])
    wf.node("risk_node", node()).node("approval_like", node({"gated": True}))
    wf.node("evidence", node({"evidence": True}))
    wf.edge(START, "risk_node")
    wf.switch("risk_node", "risk.level", {"HIGH": "approval_like"}, default="evidence")
    high, _ = run(wf, {"risk": {"level": "HIGH"}})
    low, _ = run(wf, {"risk": {"level": "LOW"}})
    assert high.state.get("gated") and "evidence" not in high.state
    assert low.state.get("evidence") and "gated" not in low.state


def test_router_may_return_several_declared_targets() -> None:
    wf = Workflow("router")
    wf.node("t", node()).node("x", node({"x": 1})).node("y", node({"y": 1}))
    wf.node("z", node({"z": 1}))
    wf.edge(START, "t")
    wf.router("t", lambda s: ["x", "y"], to=["x", "y", "z"])
    result, _ = run(wf)
    assert result.state == {"x": 1, "y": 1}


def test_router_returning_an_undeclared_target_fails() -> None:
    wf = Workflow("router-bad")
    wf.node("t", node()).node("x", node())
    wf.edge(START, "t")
    wf.router("t", lambda s: "elsewhere", to=["x"])
    result, _ = run(wf)
    assert result.status == "FAILED"
    assert result.error["type"] == "invalid_route" and "elsewhere" in result.error["message"]
    assert result.error["node"] == "t"


def test_router_returning_end_stops_there() -> None:
    wf = Workflow("router-end")
    wf.node("t", node()).node("x", node({"x": 1}))
    wf.edge(START, "t")
    wf.router("t", lambda s: END, to=["x", END])
    result, _ = run(wf)
    assert result.status == "COMPLETED" and "x" not in result.state


def test_router_may_return_end_without_declaring_it() -> None:
    # SPEC §1: "returns one or more of the declared targets (or END)"
    wf = Workflow("router-end-undeclared")
    wf.node("t", node()).node("x", node({"x": 1}))
    wf.edge(START, "t")
    wf.router("t", lambda s: END, to=["x"])
    result, records = run(wf)
    assert result.status == "COMPLETED" and "x" not in result.state
    taken = [r for r in records if r["type"] == "edge.taken" and r.get("from") == "t"]
    assert taken and taken[0]["to"] == [END]


def test_an_async_router_is_awaited(tmp_path: Any) -> None:
    """An `async def` router passed validate, then the run died with a raw TypeError
    ('coroutine' object is not iterable) that escaped wf.run and left it RUNNING."""
    async def pick(state: dict[str, Any]) -> list[str]:
        await asyncio.sleep(0)  # really suspends: it is awaited, not stepped
        return ["y"] if state["n"] > 1 else ["x"]

    wf = Workflow("async-router")
    wf.node("t", node({"n": 2})).node("x", node({"x": 1})).node("y", node({"y": 1}))
    wf.node("z", node({"z": 1}))
    wf.edge(START, "t").edge("y", "z")
    wf.router("t", pick, to=["x", "y"])
    assert wf.check() == []
    store = f"sqlite:///{tmp_path}/runs.db"
    result, records = run(wf, store=store)
    assert result.status == "COMPLETED", result.error
    assert result.state == {"n": 2, "y": 1, "z": 1}
    [decided] = [r for r in records if r.get("from") == "t"]
    assert decided["type"] == "edge.taken" and decided["to"] == ["y"]
    assert asyncio.run(interlock.verify(result.run_id, store=store)).ok


@pytest.mark.parametrize("router, message", [
    (lambda s: 1 / 0, "raised ZeroDivisionError"),
    (lambda s: 42, "returned 42 (int)"),
    (lambda s: asyncio.sleep(0), "returned an awaitable"),
])
def test_a_router_that_raises_or_misbehaves_fails_the_run_cleanly(
        router: Any, message: str, tmp_path: Any) -> None:
    async def raising(state: dict[str, Any]) -> list[str]:
        raise ZeroDivisionError("division by zero")

    for fn in (router, raising) if "Zero" in message else (router,):
        wf = Workflow("bad-router")
        wf.node("t", node({"n": 1})).node("x", node())
        wf.edge(START, "t")
        wf.router("t", fn, to=["x"])
        store = f"sqlite:///{tmp_path}/runs.db"
        result, _ = run(wf, store=store)
        assert result.status == "FAILED"
        assert result.error["type"] == "invalid_route" and message in result.error["message"]
        stored = asyncio.run(interlock.status(result.run_id, store=store))
        assert stored.status == "FAILED" and stored.state == {"n": 1}  # committed, not stuck
        assert asyncio.run(interlock.verify(result.run_id, store=store)).ok


def test_an_unexpected_error_inside_the_engine_fails_the_run_and_records_it(
        tmp_path: Any) -> None:
    def listener(rec: dict[str, Any], view: Any) -> None:
        if rec["type"] in ("node.completed", "node.visited"):
            raise RuntimeError("a bug in a listener")

    wf = Workflow("bug")
    wf.node("a", node({"a": 1})).edge(START, "a")
    store = f"sqlite:///{tmp_path}/runs.db"
    result = wf.run_sync(store=store, listener=listener)
    assert result.status == "FAILED" and result.error["type"] == "internal_error"
    assert "RuntimeError: a bug in a listener" in result.error["message"]
    assert "bug in interlock" in result.error["message"]
    assert asyncio.run(interlock.status(result.run_id, store=store)).status == "FAILED"


def test_goto_picks_a_declared_successor_with_an_update() -> None:
    async def evidence(state: dict[str, Any]) -> Any:
        return interlock.goto("reviewer", {"next_action": "REVIEWER_AGENT"})

    wf = Workflow("goto")
    wf.node("evidence", evidence).node("reviewer", node({"reviewed": True}))
    wf.node("planner", node({"planned": True}))
    wf.edge(START, "evidence").choose("evidence", ["reviewer", "planner"])
    result, records = run(wf)
    assert result.state == {"next_action": "REVIEWER_AGENT", "reviewed": True}
    assert "planner" not in started(records)


def test_goto_to_an_undeclared_node_fails() -> None:
    wf = Workflow("goto-bad")
    wf.node("e", lambda s: interlock.goto("nowhere")).node("r", node())
    wf.edge(START, "e").choose("e", ["r"])
    result, _ = run(wf)
    assert result.status == "FAILED" and result.error["type"] == "invalid_route"


# -- loops ------------------------------------------------------------------------


def test_loop_edge_with_max_is_taken_exactly_max_times() -> None:
    wf = Workflow("loop", state={"n": "add"})
    wf.node("work", node({"n": 1})).node("done", node())
    wf.edge(START, "work")
    wf.edge("work", "work", when="true", max=3)
    wf.edge("work", "done", otherwise=True)
    result, records = run(wf)
    assert result.status == "COMPLETED"
    assert result.state["n"] == 4  # the first visit plus three loop-backs
    loop_takes = [r for r in records if r["type"] == "edge.taken" and r["edge"] == 1]
    assert len(loop_takes) == 3
    assert started(records).count("done") == 1


def test_remediate_verify_loop_exit_is_not_ruled_out_by_an_earlier_iteration() -> None:
    # triage: route -> remediate <-> verify (at most 3) -> summary -> report, and
    # route -> report directly when resolved. Report has two ways in; only one is taken.
    async def verify(state: dict[str, Any]) -> dict[str, Any]:
        return {"fixed": state["attempts"] >= 2}

    wf = Workflow("triage", state={"attempts": "add"}, input=["resolved"])
    wf.node("route", node()).node("remediate", node({"attempts": 1})).node("verify", verify)
    wf.node("summary", node({"summary": True})).node("report", node({"report": True}))
    wf.edge(START, "route")
    wf.edge("route", "report", when="resolved")
    wf.edge("route", "remediate", otherwise=True)
    wf.edge("remediate", "verify")
    wf.edge("verify", "remediate", when="!fixed", max=3)
    wf.edge("verify", "summary", otherwise=True)
    wf.edge("summary", "report")
    result, records = run(wf, {"resolved": False})
    assert result.status == "COMPLETED", result.error
    assert started(records) == ["route", "remediate", "verify", "remediate", "verify",
                                "summary", "report"]
    _resolved, records = run(wf, {"resolved": True})
    assert started(records) == ["route", "report"]


def test_join_inside_a_loop_rearms_each_iteration() -> None:
    wf = Workflow("loop-join", state={"i": "add", "j": "add"})
    wf.node("top", node({"i": 1})).node("l", node()).node("r", node())
    wf.node("join", node({"j": 1}))
    wf.edge(START, "top").edge("top", ["l", "r"]).edge(["l", "r"], "join")
    wf.edge("join", "top", when="i < 3").edge("join", END, otherwise=True)
    result, records = run(wf)
    assert result.state == {"i": 3, "j": 3}
    assert started(records).count("join") == 3


def test_run_visits_is_readable_in_conditions() -> None:
    wf = Workflow("visits")
    wf.node("w", node())
    wf.edge(START, "w").edge("w", "w", when="run.visits.w < 4").edge("w", END, otherwise=True)
    _result, records = run(wf)
    assert started(records).count("w") == 4


def test_step_limit_stops_a_runaway_loop() -> None:
    wf = Workflow("runaway", limits={"steps": 10})
    wf.node("w", node())
    wf.edge(START, "w").edge("w", "w", when="true").edge("w", END, otherwise=True)
    result, _ = run(wf)
    assert result.status == "FAILED" and result.error["type"] == "step_limit"
    assert result.steps == 10


def test_a_loop_that_never_exits_stops_at_the_default_step_limit() -> None:
    from interlock._definition._model import DEFAULT_STEPS

    wf = Workflow("forever")  # no limits: declared
    wf.node("w", node())
    wf.edge(START, "w").edge("w", "w", when="true").edge("w", END, otherwise=True)
    result, records = run(wf)
    assert result.status == "FAILED" and result.error["type"] == "step_limit"
    assert result.steps == DEFAULT_STEPS
    assert "interlock's default" in result.error["message"]
    assert records[0]["limits"] == {"steps": DEFAULT_STEPS}  # the log says which applied
    # a declared limit (or a run's) is the one that applies, and is not called the default
    longer, _ = run(wf, limits={"steps": DEFAULT_STEPS + 5})
    assert longer.steps == DEFAULT_STEPS + 5 and "default" not in longer.error["message"]


# -- state ------------------------------------------------------------------------


def test_reducers() -> None:
    wf = Workflow("reducers", state={"log": "append", "items": "extend", "meta": "merge",
                                     "count": "add"})
    wf.node("a", node({"log": "a", "items": [1, 2], "meta": {"a": 1}, "count": 2}))
    wf.node("b", node({"log": "b", "items": [3], "meta": {"b": 2}, "count": 3}))
    wf.edge(START, "a").edge("a", "b")
    result, _ = run(wf)
    assert result.state == {"log": ["a", "b"], "items": [1, 2, 3], "meta": {"a": 1, "b": 2},
                            "count": 5}


def test_concurrent_appends_keep_every_branch() -> None:
    wf = Workflow("appends", state={"events": "append"})
    wf.node("a", node())
    for i in range(5):
        wf.node(f"b{i}", node({"events": i}))
    wf.node("j", node())
    wf.edge(START, "a").edge("a", [f"b{i}" for i in range(5)])
    wf.edge([f"b{i}" for i in range(5)], "j")
    result, _ = run(wf)
    assert sorted(result.state["events"]) == [0, 1, 2, 3, 4]


def test_reads_scopes_what_a_node_sees() -> None:
    seen: dict[str, Any] = {}

    def rag(state: dict[str, Any]) -> None:
        seen.update(state)

    wf = Workflow("scope", input=["error_event", "secret"])
    wf.node("rag", rag, reads=["error_event"])
    wf.edge(START, "rag")
    run(wf, {"error_event": {"code": 500}, "secret": "s3cr3t"})
    assert seen == {"error_event": {"code": 500}}


def test_writes_are_enforced() -> None:
    wf = Workflow("writes")
    wf.node("a", node({"allowed": 1, "sneaky": 2}), writes=["allowed"])
    wf.edge(START, "a")
    result, _ = run(wf)
    assert result.status == "FAILED" and "sneaky" in result.error["message"]
    assert "allowed" not in result.state


def test_concurrent_writes_without_reducer_fail_at_run_time() -> None:
    wf = Workflow("conflict")
    wf.node("a", node()).node("b", node({"x": 1})).node("c", node({"x": 2}))
    wf.edge(START, "a").edge("a", ["b", "c"])
    result, _ = run(wf)
    assert result.status == "FAILED" and result.error["type"] == "write_conflict"
    assert "'x'" in result.error["message"]
    assert "'b'" in result.error["message"] and "'c'" in result.error["message"]


@pytest.mark.parametrize("a_waits", [0.0, 0.2])
def test_a_conflict_between_branches_does_not_depend_on_which_was_faster(
        a_waits: float) -> None:
    # SPEC §1: two nodes that *can* run concurrently and both write a field without a
    # reducer is an error -- whether or not their runs happened to overlap this time
    async def a(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(a_waits)
        return {"x": "from a"}

    async def b1(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.1)
        return {"y": 1}

    wf = Workflow("conflict-by-graph")
    wf.node("s", node()).node("a", a).node("b1", b1).node("b2", node({"x": "from b2"}))
    wf.node("j", node({"done": True}))
    wf.edge(START, "s").edge("s", ["a", "b1"]).edge("b1", "b2").edge(["a", "b2"], "j")
    result, _ = run(wf)
    assert result.status == "FAILED" and result.error["type"] == "write_conflict"
    assert "'a'" in result.error["message"] and "'b2'" in result.error["message"]
    assert "done" not in result.state


def test_writers_of_a_field_one_after_the_other_need_no_reducer() -> None:
    # a before the fork, d after the join: never concurrent with each other or b, c
    wf = Workflow("sequential-writes")
    wf.node("a", node({"x": 1})).node("b", node({"y": 2})).node("c", node({"z": 3}))
    wf.node("d", node({"x": 4}))
    wf.edge(START, "a").edge("a", ["b", "c"]).edge(["b", "c"], "d")
    result, _ = run(wf)
    assert result.status == "COMPLETED" and result.state["x"] == 4


def test_concurrent_declared_writes_are_rejected_statically() -> None:
    wf = Workflow("conflict-static")
    wf.node("a", node()).node("b", node({"x": 1}), writes=["x"])
    wf.node("c", node({"x": 2}), writes=["x"])
    wf.edge(START, "a").edge("a", ["b", "c"])
    with pytest.raises(interlock.WorkflowError, match="write 'x'"):
        wf.compile()


def test_exclusive_branches_may_write_the_same_field() -> None:
    wf = Workflow("exclusive", input=["ok"])
    wf.node("a", node()).node("b", node({"x": 1}), writes=["x"])
    wf.node("c", node({"x": 2}), writes=["x"])
    wf.edge(START, "a").edge("a", "b", when="ok").edge("a", "c", otherwise=True)
    assert run(wf, {"ok": True})[0].state["x"] == 1
    assert run(wf, {"ok": False})[0].state["x"] == 2


def test_node_failure_fails_the_run_with_the_node_and_keeps_completed_work() -> None:
    def boom(state: dict[str, Any]) -> None:
        raise ValueError("disk on fire")

    wf = Workflow("boom")
    wf.node("a", node({"a": 1})).node("b", boom)
    wf.edge(START, "a").edge("a", "b")
    result, records = run(wf)
    assert result.status == "FAILED"
    assert result.error["node"] == "b" and "disk on fire" in result.error["message"]
    assert result.state == {"a": 1}
    assert records[-1]["type"] == "run.failed"


def test_a_node_returning_a_non_mapping_fails_clearly() -> None:
    wf = Workflow("bad-return")
    wf.node("a", lambda s: 42)
    wf.edge(START, "a")
    result, _ = run(wf)
    assert result.status == "FAILED" and "returned int" in result.error["message"]


def test_context_is_typed_and_stable() -> None:
    seen: list[Any] = []

    async def a(state: dict[str, Any], ctx: interlock.Context) -> None:
        seen.append((ctx.node, ctx.attempt, ctx.idempotency_key, dict(ctx.config)))
        ctx.record_tokens(7)

    wf = Workflow("ctx", config={"k": 1})
    wf.node("a", a).edge(START, "a")
    result, _ = run(wf, run_id="r1")
    assert seen == [("a", 1, "r1:a:1", {"k": 1})]
    assert result.tokens == 7


def test_once_runs_an_effect_once_per_visit_and_records_it() -> None:
    calls: list[int] = []

    async def send(n: int) -> str:
        calls.append(n)
        return f"sent-{n}"

    async def a(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        first = await ctx.once("email", send, 1)
        again = await ctx.once("email", send, 2)
        return {"first": first, "again": again}

    wf = Workflow("once")
    wf.node("a", a).edge(START, "a")
    result, records = run(wf)
    assert calls == [1]
    assert result.state == {"first": "sent-1", "again": "sent-1"}
    assert [r["type"] for r in records].count("effect.recorded") == 1


def test_input_declared_but_missing_is_refused() -> None:
    wf = Workflow("needs-input", input=["error_event"])
    wf.node("a", node()).edge(START, "a")
    with pytest.raises(interlock.UsageError, match="error_event"):
        run(wf, {})


def test_the_log_is_a_complete_story() -> None:
    wf = Workflow("story", input=["go"])
    wf.node("a", node({"a": 1})).node("b", node())
    wf.edge(START, "a").edge("a", "b", when="go").edge("a", END, otherwise=True)
    _, told = run(wf, {"go": False})
    records = [r for r in told if not r.get("implied")]  # (listeners are told those too)
    types = [r["type"] for r in records]
    # log format 3: the visit in one record, with its when edge's decision in it (the
    # otherwise edge implied by that decision)
    assert types == ["run.started", "edge.taken", "node.visited", "run.completed"]
    assert [r["seq"] for r in records] == list(range(1, 5))
    skipped = records[2]["when"]
    assert skipped["expr"] == "go" and skipped["value"] is False and skipped["reads"] == {
        "go": False} and "to" not in skipped
    # ... and read as format 1 writes it, the whole story
    expanded = Expander(wf.compile(), split=True).expand(records)
    assert [r["type"] for r in expanded] == [
        "run.started", "edge.taken", "node.started", "node.completed", "edge.skipped",
        "edge.taken", "run.completed"]
    assert expanded[5]["to"] == ["END"] and expanded[5]["implied"] is True
    assert expanded[4]["implied"] is True and expanded[4]["seq"] == 3


def test_values_json_changes_reach_the_next_node_as_a_resume_would_rebuild_them(
        tmp_path: Any) -> None:
    # SPEC §1: a resumed run rebuilds exactly the same state. orjson writes a datetime,
    # an enum, a UUID and a dataclass natively and NaN as null: the live state
    # must hold what the log holds, not the Python objects, or a run that pauses and
    # resumes would see other values than one that does not
    import dataclasses
    import datetime
    import enum
    import uuid

    class Color(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class P:
        a: int

    made = {"when": datetime.datetime(2024, 1, 2), "color": Color.RED,
            "id": uuid.UUID(int=1), "p": P(1), "score": float("nan"),
            "top": float("inf"), "nested": {"at": datetime.date(2024, 1, 2)}}
    seen: dict[str, Any] = {}
    wf = Workflow("json-values")
    wf.node("a", lambda s: made)
    wf.node("b", lambda s: seen.update(s))
    wf.edge(START, "a").edge("a", "b")
    store = f"sqlite:///{tmp_path}/runs.db"
    result = wf.run_sync({}, store=store)
    assert result.status == "COMPLETED"
    expected = {"when": "2024-01-02T00:00:00", "color": "red",
                "id": "00000000-0000-0000-0000-000000000001", "p": {"a": 1},
                "score": None, "top": None, "nested": {"at": "2024-01-02"}}
    assert seen == expected  # what the next node got
    assert result.state == expected
    rebuilt = asyncio.run(interlock.status(result.run_id, store=store))
    assert rebuilt.state == expected  # what the log rebuilds


def test_a_node_that_raises_cancelled_error_itself_fails_and_the_run_ends(
        tmp_path: Any) -> None:
    # nobody cancelled the run: a CancelledError out of the body (a client library
    # cancelling its own request) is the node's failure, not a run left RUNNING
    async def flaky(state: dict[str, Any]) -> dict[str, Any]:
        raise asyncio.CancelledError("the client gave up")

    wf = Workflow("cancelled-inside")
    wf.node("a", flaky).node("b", lambda s: {"b": 1})
    wf.edge(START, "a").edge("a", "b")
    store = f"sqlite:///{tmp_path}/runs.db"
    result = wf.run_sync({}, store=store)
    assert result.status == "FAILED"
    assert result.error["node"] == "a" and "CancelledError" in result.error["message"]
    assert "b" not in result.state
    stored = asyncio.run(interlock.status(result.run_id, store=store))
    assert stored.status == "FAILED"


def test_a_node_that_calls_sys_exit_fails_instead_of_ending_the_process() -> None:
    def quits(state: dict[str, Any]) -> None:
        raise SystemExit(4)

    wf = Workflow("exits")
    wf.node("a", quits).edge(START, "a")
    result, _ = run(wf)
    assert result.status == "FAILED" and "SystemExit" in result.error["message"]


def test_an_update_that_is_not_json_data_fails_the_node_cleanly() -> None:
    for bad in ({"n": 2**70}, {"o": object()}, {"nested": {"t": (1, object())}}):
        wf = Workflow("not-json")
        wf.node("bad", lambda s, bad=bad: bad).edge(START, "bad")
        result, records = run(wf)
        assert result.status == "FAILED" and "not JSON data" in result.error["message"]
        assert records[-1]["type"] == "run.failed"


def test_run_sync_inside_a_running_loop_says_to_await_run() -> None:
    wf = Workflow("in-loop")
    wf.node("a", lambda s: {"a": 1}).edge(START, "a")

    async def in_a_coroutine() -> None:
        with pytest.raises(interlock.UsageError, match=r"await workflow\.run"):
            wf.run_sync({}, store="memory://")
        with pytest.raises(interlock.UsageError, match=r"await workflow\.resume"):
            wf.resume_sync("r-none", store="memory://")

    asyncio.run(in_a_coroutine())


def test_ctx_once_in_a_sync_node_is_a_clear_failure_not_a_silent_no_op() -> None:
    calls: list[int] = []

    def sync_node(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        ctx.once("charge", lambda: calls.append(1))  # nothing could await this
        return {"done": True}

    wf = Workflow("sync-once")
    wf.node("a", sync_node).edge(START, "a")
    result, _ = run(wf)
    assert result.status == "FAILED" and "await ctx.once" in result.error["message"]
    assert calls == []
