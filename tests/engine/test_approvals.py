"""Human gates (SPEC §3): approve, reject, modify-and-re-enter, confirm, deadlines, approvers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import START, Workflow

CALLS: list[str] = []


def tracked(name: str, update: dict[str, Any] | None = None):
    async def fn(state: dict[str, Any]) -> dict[str, Any] | None:
        CALLS.append(name)
        return update

    fn.__name__ = name
    return fn


async def risk(state: dict[str, Any]) -> dict[str, Any]:
    CALLS.append("risk")
    # the corrected input a human patched in wins over the agent's own guess
    return {"risk": {"level": state.get("corrected_level") or "HIGH"}}


def audit(**approval: Any) -> Workflow:
    """planner -> risk -> (HIGH -> approval) -> evidence; reject -> handler when x."""
    wf = Workflow("audit", input=["x"], state={"corrected_level": "replace"})
    wf.node("planner", tracked("planner", {"plan": "p"}), writes=["plan"])
    wf.node("risk", risk, writes=["risk"])
    wf.approval("approval", show=["risk"], on_modify=["risk", "planner"], **approval)
    wf.node("evidence", tracked("evidence", {"evidence": "e"}), writes=["evidence"])
    wf.node("handler", tracked("handler", {"handled": True}), writes=["handled"])
    wf.edge(START, "planner").edge("planner", "risk")
    wf.switch("risk", "risk.level", {"HIGH": "approval"}, default="evidence")
    wf.edge("approval", "evidence", when='approval.decision == "approved"')
    wf.edge("approval", "handler", when='approval.decision == "rejected" && x == 1')
    return wf


@pytest.fixture
def store(tmp_path: Path) -> str:
    CALLS.clear()
    return f"sqlite:///{tmp_path}/runs.db"


def test_high_risk_pauses_and_the_pause_is_persisted(store: str) -> None:
    wf = audit()
    first = wf.run_sync({"x": 0}, store=store)
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting == {**first.waiting, "node": "approval",
                             "show": {"risk": {"level": "HIGH"}},
                             "decisions": ["approve", "reject", "modify"]}
    assert CALLS == ["planner", "risk"]
    # a new process (here: a fresh status read from the store) sees the same wait
    seen = asyncio.run(interlock.status(first.run_id, store=store))
    assert seen.status == "WAITING_APPROVAL" and seen.waiting["node"] == "approval"


def test_approve_continues_and_records_the_decider(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    done = wf.resume_sync(run_id, interlock.approve(by="alice", comment="ok"), store=store)
    assert done.status == "COMPLETED"
    assert CALLS == ["planner", "risk", "evidence"]
    gate = done.state["approval"]
    assert gate["decision"] == "approved" and gate["by"] == "alice" and gate["comment"] == "ok"
    decided = [r for r in asyncio.run(interlock.trace(run_id, store=store))
               if r["type"] == "approval.decided"]
    assert decided[0]["by"] == "alice" and decided[0]["decision"] == "approved"


def test_reject_without_a_handling_edge_ends_rejected(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    done = wf.resume_sync(run_id, interlock.reject(by="bob", comment="too risky"), store=store)
    assert done.status == "REJECTED"
    assert "evidence" not in CALLS and "handler" not in CALLS
    assert "too risky" in done.error["message"]


def test_reject_routes_to_a_declared_handler(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 1}, store=store).run_id
    done = wf.resume_sync(run_id, interlock.reject(by="bob"), store=store)
    assert done.status == "COMPLETED"
    assert CALLS == ["planner", "risk", "handler"]


def test_modify_reenters_at_risk_and_not_at_planner(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    done = wf.resume_sync(run_id, interlock.modify({"corrected_level": "LOW"}, by="alice"),
                          store=store)
    assert done.status == "COMPLETED"
    assert CALLS == ["planner", "risk", "risk", "evidence"]
    assert done.state["risk"] == {"level": "LOW"}
    assert done.state["approval"]["patch"] == {"corrected_level": "LOW"}


def test_modify_that_reaches_the_gate_again_pauses_again(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    again = wf.resume_sync(run_id, interlock.modify({"corrected_level": "HIGH"}, at="planner",
                                                    by="alice"), store=store)
    assert again.status == "WAITING_APPROVAL"
    assert CALLS == ["planner", "risk", "planner", "risk"]


def test_reentry_outside_on_modify_is_refused(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    with pytest.raises(interlock.UsageError, match="re-entry at 'evidence' is refused"):
        wf.resume_sync(run_id, interlock.modify({"corrected_level": "LOW"}, at="evidence"),
                       store=store)
    with pytest.raises(interlock.UsageError, match="does not know"):
        wf.resume_sync(run_id, interlock.modify({"nonsense": 1}), store=store)
    # nothing was written: the run still waits for a valid decision
    assert asyncio.run(interlock.status(run_id, store=store)).status == "WAITING_APPROVAL"


def test_second_decision_is_refused(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    wf.resume_sync(run_id, interlock.approve(by="alice"), store=store)
    with pytest.raises(interlock.UsageError, match="not waiting"):
        wf.resume_sync(run_id, interlock.reject(by="bob"), store=store)


def test_unauthorized_approver_is_refused(store: str) -> None:
    wf = audit(approvers=["alice"])
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    with pytest.raises(interlock.UsageError, match="'mallory' may not decide"):
        wf.resume_sync(run_id, interlock.approve(by="mallory"), store=store)
    with pytest.raises(interlock.UsageError, match="anonymous"):
        wf.resume_sync(run_id, interlock.approve(), store=store)
    assert wf.resume_sync(run_id, interlock.approve(by="alice"), store=store).ok


def test_deadline_fires_and_is_logged_as_the_engine(store: str) -> None:
    wf = audit(timeout="0.2s")
    first = wf.run_sync({"x": 0}, store=store)
    assert first.waiting["deadline"] is not None
    time.sleep(max(0.0, first.waiting["deadline"] - time.time()) + 0.05)
    done = wf.resume_sync(first.run_id, store=store)
    assert done.status == "REJECTED"
    decided = next(r for r in asyncio.run(interlock.trace(first.run_id, store=store))
               if r["type"] == "approval.decided")
    assert decided["by"] == "interlock (deadline)" and decided["timed_out"] is True
    # a human who comes too late is refused
    with pytest.raises(interlock.UsageError):
        wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)


@pytest.mark.parametrize(("on_timeout", "outcome", "status"), [
    ("reject", "rejects it", "REJECTED"),
    ("handler", "re-enters the run at 'handler'", "COMPLETED"),
])
def test_a_decision_after_the_deadline_is_refused_and_the_timeout_still_applies(
        store: str, on_timeout: str, outcome: str, status: str) -> None:
    wf = audit(timeout="0.1s", on_timeout=on_timeout)
    first = wf.run_sync({"x": 0}, store=store)
    records = asyncio.run(interlock.trace(first.run_id, store=store))
    time.sleep(max(0.0, first.waiting["deadline"] - time.time()) + 0.05)
    # the human comes after the deadline, before anything applied the timeout
    for late in (interlock.approve(by="alice"), interlock.reject(by="alice")):
        with pytest.raises(interlock.UsageError, match="passed its deadline") as err:
            wf.resume_sync(first.run_id, late, store=store)
        assert outcome in str(err.value) and "without a decision" in str(err.value)
    assert asyncio.run(interlock.trace(first.run_id, store=store)) == records  # nothing written
    assert asyncio.run(interlock.status(first.run_id, store=store)).status == "WAITING_APPROVAL"
    done = wf.resume_sync(first.run_id, store=store)
    assert done.status == status


def test_a_fork_at_a_gate_whose_deadline_passed_waits_with_a_fresh_deadline(store: str) -> None:
    wf = audit(timeout="30s")
    first = wf.run_sync({"x": 0}, store=store)
    records = asyncio.run(interlock.trace(first.run_id, store=store))
    requested = next(r for r in records if r["type"] == "approval.requested")
    # the parent's deadline as if long passed: fork at the request, a day later
    later = requested["deadline"] + 86_400
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "time", lambda: later)
        forked = asyncio.run(interlock.fork(first.run_id, requested["seq"], store=store,
                                            workflow=wf))
    assert forked.status == "WAITING_APPROVAL"
    assert forked.waiting["deadline"] == pytest.approx(later + 30)  # its own 30 s, from then
    fork_record = next(r for r in asyncio.run(interlock.trace(forked.run_id, store=store))
                       if r["type"] == "run.forked")
    assert fork_record["deadlines"] == [{"node": "approval", "visit": 1,
                                         "deadline": forked.waiting["deadline"]}]
    done = wf.resume_sync(forked.run_id, interlock.approve(by="alice"), store=store)
    assert done.status == "COMPLETED" and done.state["approval"]["decision"] == "approved"
    assert asyncio.run(interlock.verify(forked.run_id, store=store)).ok


def test_deadline_can_route_to_a_node(store: str) -> None:
    wf = audit(timeout="0.1s", on_timeout="handler")
    first = wf.run_sync({"x": 0}, store=store)
    time.sleep(max(0.0, first.waiting["deadline"] - time.time()) + 0.05)
    done = wf.resume_sync(first.run_id, store=store)
    assert done.status == "COMPLETED" and CALLS[-1] == "handler"
    assert done.state["approval"]["decision"] == "timed_out"


def test_waiting_without_a_decision_is_refused(store: str) -> None:
    wf = audit()
    run_id = wf.run_sync({"x": 0}, store=store).run_id
    with pytest.raises(interlock.UsageError, match="waiting for a decision"):
        wf.resume_sync(run_id, store=store)


def guarded() -> Workflow:
    wf = Workflow("guarded")
    wf.node("plan", tracked("plan", {"plan": "rm -rf /tmp/x"}), writes=["plan"])
    wf.node("delete", tracked("delete", {"deleted": True}), confirm=True, reads=["plan"],
            writes=["deleted"])
    wf.edge(START, "plan").edge("plan", "delete")
    return wf


def test_guarded_node_waits_and_rejection_never_runs_its_body(store: str) -> None:
    wf = guarded()
    first = wf.run_sync(store=store)
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["node"] == "delete" and first.waiting["show"] == {"plan": "rm -rf /tmp/x"}
    assert CALLS == ["plan"]
    with pytest.raises(interlock.UsageError, match="a confirmation is approved or rejected"):
        wf.resume_sync(first.run_id, interlock.modify({"plan": "ls"}), store=store)
    done = wf.resume_sync(first.run_id, interlock.reject(by="alice"), store=store)
    assert done.status == "REJECTED"
    assert CALLS == ["plan"]  # the body never ran
    assert "deleted" not in done.state


def test_guarded_node_runs_its_body_once_confirmed(store: str) -> None:
    wf = guarded()
    first = wf.run_sync(store=store)
    done = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert done.status == "COMPLETED" and done.state["deleted"] is True
    assert CALLS == ["plan", "delete"]
    assert asyncio.run(interlock.verify(first.run_id, store=store)).ok


def test_verify_passes_after_every_kind_of_decision(store: str) -> None:
    wf = audit()
    ids = []
    for decision in (interlock.approve(by="a"), interlock.reject(by="b"),
                     interlock.modify({"corrected_level": "LOW"}, by="c")):
        run_id = wf.run_sync({"x": 0}, store=store).run_id
        wf.resume_sync(run_id, decision, store=store)
        ids.append(run_id)
    for run_id in ids:
        assert asyncio.run(interlock.verify(run_id, store=store)).ok


def tool_node_workflow(calls: list[Any]) -> Workflow:
    async def think(prompt: str) -> dict[str, Any]:
        calls.append("llm")
        return {"tool": "restart", "args": {"service": "db"}}

    async def agent(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        plan = await ctx.once("llm-1", think, "what now?")  # replayed, not repeated
        if ctx.confirm("tool-1", {"tool": plan["tool"], "args": plan["args"]}) == "approved":
            calls.append("restart")
            return {"result": "restarted"}
        return {"result": "the human said no"}

    wf = Workflow("tools")
    wf.node("agent", agent).edge(START, "agent")
    return wf


def test_a_confirmation_does_not_use_up_a_retry(store: str) -> None:
    """After two confirmed tool calls the body runs as attempt 3; a first failure after
    that still gets the retry its `retry: {attempts: 2}` promises."""
    calls: list[str] = []

    async def agent(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        for key in ("tool-1", "tool-2"):
            assert ctx.confirm(key, {"tool": key}) == "approved"
        calls.append(f"attempt {ctx.attempt}")
        if len(calls) == 1:
            raise ConnectionError("the model's server hung up")
        return {"result": "ok"}

    wf = Workflow("confirm-retry")
    wf.node("agent", agent, retry={"attempts": 2, "backoff": "1ms"}).edge(START, "agent")
    run = wf.run_sync(store=store)
    for _ in range(2):
        assert run.status == "WAITING_APPROVAL"
        run = wf.resume_sync(run.run_id, interlock.approve(by="alice"), store=store)
    assert run.status == "COMPLETED", run.error
    assert calls == ["attempt 3", "attempt 4"]


@pytest.mark.parametrize("decision, result, did", [
    (interlock.approve(by="alice"), "restarted", ["llm", "restart"]),
    (interlock.reject(by="bob"), "the human said no", ["llm"]),
])
def test_confirm_inside_a_node_pauses_and_resumes_the_visit(
        store: str, decision: interlock.Decision, result: str, did: list[str]) -> None:
    calls: list[Any] = []
    wf = tool_node_workflow(calls)
    first = wf.run_sync(store=store)
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["node"] == "agent" and first.waiting["kind"] == "tool"
    assert first.waiting["show"] == {"tool": "restart", "args": {"service": "db"}}
    assert calls == ["llm"]
    done = wf.resume_sync(first.run_id, decision, store=store)
    assert done.status == "COMPLETED"  # a rejected tool call does not end the run
    assert done.state["result"] == result
    assert calls == did
    assert asyncio.run(interlock.verify(first.run_id, store=store)).ok


def test_a_rejected_approval_gate_with_no_edges_of_its_own_ends_the_run_rejected() -> None:
    # a terminal gate (no outgoing edge) is as rejected as one whose edges follow none
    wf = Workflow("terminal-gate").node("a", lambda s: {"a": 1})
    wf.approval("gate", show=["a"])
    wf.edge(START, "a").edge("a", "gate")
    first = wf.run_sync(store="memory://")
    assert first.status == "WAITING_APPROVAL"

    async def decide(decision: interlock.Decision) -> interlock.RunResult:
        async with interlock.open_store("memory://") as store:
            waiting = await wf.run(store=store)
            return await wf.resume(waiting.run_id, decision, store=store)

    rejected = asyncio.run(decide(interlock.reject(by="bob", comment="not now")))
    assert rejected.status == "REJECTED"
    assert rejected.error is not None
    assert rejected.error["message"] == "approval 'gate' was rejected by bob: not now"
    approved = asyncio.run(decide(interlock.approve(by="alice")))
    assert approved.status == "COMPLETED"


def test_a_modify_after_an_agent_may_patch_its_output_key_not_its_name(store: str) -> None:
    """What an agent node writes is its output_key (`NodeSpec.written`): a reviewer
    corrects that field; a field named after the agent is unknown to the workflow."""
    from interlock.testing import ScriptedProvider

    wf = Workflow("drafting", input=["topic"])
    wf.agent("writer", reads=["topic"], prompt="Write about {{ topic }}", output_key="draft",
             provider=ScriptedProvider(["a first draft"]))
    wf.approval("review", show=["draft"], on_modify=["publish"])
    wf.node("publish", tracked("publish"))
    wf.edge(START, "writer").edge("writer", "review").edge("review", "publish")
    first = wf.run_sync({"topic": "t"}, store=store)
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["show"] == {"draft": "a first draft"}
    with pytest.raises(interlock.UsageError, match="does not know: writer"):
        wf.resume_sync(first.run_id, interlock.modify({"writer": "x"}), store=store)
    done = wf.resume_sync(first.run_id, interlock.modify({"draft": "a corrected draft"}),
                          store=store)
    assert done.status == "COMPLETED" and done.state["draft"] == "a corrected draft"
    assert CALLS == ["publish"]
