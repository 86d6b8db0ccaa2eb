"""Human input beyond yes/no (SPEC §7): an approval's ``input:`` schema and ``--data``.

Real runs through the command line (a SQLite store in ``tmp_path``) and the Python
API: a refused decision exits 2 (raises UsageError), names the gate, the schema error
and how to fix it, and records nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import CliProject

import interlock
from interlock import END, START, Workflow
from interlock.cli import cli

NODES = """
def plan(state):
    return {"plan": "pay the vendor"}

def pay(state):
    return {"paid": state["approval"]["data"]["amount"]}

def review(state):
    return {"reviewed": state["approval"]["data"]["reason"]}
"""

GATED = """
workflow: payment
nodes:
  plan: {mod}:plan
  approval:
    approval:
      show: [plan]
      input:
        type: object
        properties:
          amount: {type: number, minimum: 0}
          reason: {type: string}
        required: [amount]
  pay: {mod}:pay
  review: {mod}:review
edges:
  - {from: START, to: plan}
  - {from: plan, to: approval}
  - {from: approval, to: review,
     when: 'approval.decision == "approved" && approval.data.amount > 1000'}
  - {from: approval, to: pay,
     when: 'approval.decision == "approved" && approval.data.amount <= 1000'}
  - {from: approval, to: END, when: 'approval.decision == "rejected"'}
"""


@pytest.fixture
def project(make_project: Callable[..., CliProject]) -> CliProject:
    return make_project(NODES)


def waiting_run(project: CliProject, run_id: str = "r1") -> CliProject:
    started = project.start(GATED, run_id)
    assert started.exit_code == 3, started.output
    return project


def test_the_waiting_gate_shows_its_input_schema(project: CliProject) -> None:
    waiting_run(project)
    result, out = project.cli_json("status", "r1")
    assert result.exit_code == 3
    assert out["waiting"]["input"]["required"] == ["amount"]
    shown = project.cli("status", "r1")
    assert "--approve --data JSON" in shown.output and "input (--data must satisfy)" in \
        shown.output


@pytest.mark.parametrize("args, expect", [
    (["--approve", "--data", '{"amount": "lots"}'], "at $.amount: 'lots' is not of type"),
    (["--approve", "--data", '{"amount": -5}'], "-5 is less than the minimum of 0"),
    (["--approve", "--data", '{"reason": "r"}'], "'amount' is a required property"),
    (["--approve"], "asks for input with its approval"),
    (["--reject", "--data", "[1, 2]"], "is not of type 'object'"),
    (["--approve", "--data", "{nope"], "--data is not valid JSON"),
    (["--modify", '{"plan": "x"}', "--data", "{}"], "--data goes with --approve or --reject"),
])
def test_data_that_does_not_satisfy_the_schema_is_refused_and_nothing_is_recorded(
        project: CliProject, args: list[str], expect: str) -> None:
    waiting_run(project)
    before = project.seqs("r1")
    refused = project.cli("resume", "r1", *args, "--by", "alice")
    assert refused.exit_code == 2, refused.output
    assert expect in refused.output
    if "--data is not valid" not in expect and "goes with" not in expect:
        assert "'approval'" in refused.output  # the gate is named
        assert "--data JSON" in refused.output  # and how to fix it
    assert project.seqs("r1") == before  # nothing recorded
    _, out = project.cli_json("status", "r1")
    assert out["status"] == "WAITING_APPROVAL"


@pytest.mark.parametrize("amount, routed", [(50, "paid"), (5000, "reviewed")])
def test_valid_data_is_the_gates_record_and_conditions_route_on_it(
        project: CliProject, amount: int, routed: str) -> None:
    waiting_run(project)
    data = {"amount": amount, "reason": "invoice 7"}
    result, out = project.cli_json("resume", "r1", "--approve", "--data", json.dumps(data),
                                   "--by", "alice", "--comment", "ok")
    assert result.exit_code == 0, result.output
    gate = out["state"]["approval"]
    assert gate["decision"] == "approved" and gate["data"] == data and gate["by"] == "alice"
    assert routed in out["state"] and ({"paid", "reviewed"} - {routed}).isdisjoint(out["state"])
    [decided] = [r for r in project.records("r1") if r["type"] == "approval.decided"]
    assert decided["data"] == data
    edges = [r for r in project.records("r1") if r["type"] == "edge.taken"
             and r["from"] == "approval"]
    assert edges[0]["reads"]["approval.data.amount"] == amount
    assert project.cli("verify", "r1").exit_code == 0
    assert f'data {{"amount": {amount}' in project.cli("trace", "r1").output


def test_a_rejection_may_come_without_data_and_its_record_says_so(project: CliProject) -> None:
    waiting_run(project)
    result, out = project.cli_json("resume", "r1", "--reject", "--by", "bob")
    assert result.exit_code == 0, result.output  # the rejected edge ends the run
    assert out["state"]["approval"]["decision"] == "rejected"
    assert out["state"]["approval"]["data"] is None


def test_data_for_a_gate_without_an_input_schema_is_refused(project: CliProject) -> None:
    text = """
workflow: plain
nodes:
  plan: {mod}:plan
  approval: {approval: {show: [plan]}}
edges:
  - {from: START, to: plan}
  - {from: plan, to: approval}
"""
    assert project.start(text, "r2").exit_code == 3
    before = project.seqs("r2")
    refused = project.cli("resume", "r2", "--approve", "--data", '{"amount": 1}')
    assert refused.exit_code == 2
    assert "gate 'approval' takes no --data" in refused.output
    assert "declare approval.input" in refused.output
    assert project.seqs("r2") == before


def test_validate_checks_that_input_is_a_json_schema(project: CliProject) -> None:
    bad = GATED.replace("amount: {type: number, minimum: 0}", "amount: {type: numbr}")
    result = CliRunner().invoke(cli, ["validate", project.workflow(bad)])
    assert result.exit_code == 2
    [line] = [x for x in result.output.splitlines() if "approval.input" in x]
    assert line.startswith("wf.yaml:8:") and "is not a valid JSON Schema" in line
    assert "'numbr' is not valid" in line


# -- the Python API ---------------------------------------------------------------------------


async def plan(state: dict[str, Any]) -> dict[str, Any]:
    return {"plan": "p"}


def gated() -> Workflow:
    wf = Workflow("payment")
    wf.node("plan", plan)
    wf.approval("approval", show=["plan"], input={
        "type": "object", "properties": {"amount": {"type": "integer"}},
        "required": ["amount"]})
    wf.edge(START, "plan").edge("plan", "approval")
    return wf


def test_approve_with_data_in_python(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    wf = gated()
    first = wf.run_sync(store=store)
    assert first.waiting["input"]["required"] == ["amount"]
    seqs = len(asyncio.run(interlock.trace(first.run_id, store=store)))
    with pytest.raises(interlock.UsageError, match=r"gate 'approval'.*at \$\.amount: 1\.5 is "
                       r"not of type 'integer'.*approve\(data=\.\.\.\)"):
        wf.resume_sync(first.run_id, interlock.approve(data={"amount": 1.5}), store=store)
    assert len(asyncio.run(interlock.trace(first.run_id, store=store))) == seqs
    done = wf.resume_sync(first.run_id, interlock.approve(by="a", data={"amount": 3}),
                          store=store)
    assert done.status == "COMPLETED"
    assert done.state["approval"]["data"] == {"amount": 3}


# -- a node reached only through on_modify ------------------------------------------------------


async def draft(state: dict[str, Any]) -> dict[str, Any]:
    return {"text": state.get("hint", "first draft")}


async def fix(state: dict[str, Any]) -> dict[str, Any]:
    return {"text": f"fixed: {state['hint']}"}


def test_a_node_reached_only_through_on_modify_is_reachable(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    wf = Workflow("review", state={"hint": "replace"})
    wf.node("draft", draft).node("fix", fix)
    wf.approval("review", show=["text"], on_modify=["fix"])
    wf.edge(START, "draft").edge("draft", "review")
    wf.edge("fix", "review")  # the fixer goes back to the reviewer
    wf.edge("review", END, when='review.decision == "approved"')
    wf.compile()  # no "unreachable" error
    first = wf.run_sync(store=store)
    assert first.status == "WAITING_APPROVAL"
    again = wf.resume_sync(first.run_id, interlock.modify({"hint": "shorter"}), store=store)
    assert again.status == "WAITING_APPROVAL" and again.state["text"] == "fixed: shorter"
    done = wf.resume_sync(first.run_id, interlock.approve(), store=store)
    assert done.status == "COMPLETED" and done.state["review"]["decision"] == "approved"


def test_a_patch_naming_a_new_field_says_how_to_declare_it(project: CliProject) -> None:
    text = GATED.replace("      show: [plan]\n", "      show: [plan]\n      on_modify: [plan]\n")
    assert project.start(text, "r1").exit_code == 3
    before = project.seqs("r1")
    refused = project.cli("resume", "r1", "--modify", '{"budget": 10}')
    assert refused.exit_code == 2
    out = " ".join(refused.output.split())  # the message, unwrapped
    assert "does not know: budget" in out and "known fields:" in out
    assert "declare it in the workflow file" in out
    assert "state: {budget: {}}" in out
    assert "a run keeps the definition it started with" in out
    assert project.seqs("r1") == before


# -- a node's own confirmation with an edit ---------------------------------------------------

mailed: list[Any] = []


async def send(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
    email = {"to": "team@example.com", "body": "draft"}
    schema = {"type": "object", "properties": {"body": {"type": "string"}},
              "required": ["body"], "additionalProperties": False}
    answer = ctx.confirm("send", {"email": email}, edit=schema)
    decision = ctx.decision("send") or {}
    if answer == "modified":
        email = {**email, **decision["patch"]}
    elif answer != "approved":
        return {"sent": None, "why": decision.get("comment")}
    mailed.append(email)
    return {"sent": email}


@pytest.mark.parametrize("decision, sent, why", [
    (interlock.approve(), {"to": "team@example.com", "body": "draft"}, None),
    (interlock.modify({"body": "final"}), {"to": "team@example.com", "body": "final"}, None),
    (interlock.reject(comment="not today"), None, "not today"),
])
def test_a_nodes_own_confirmation_may_offer_an_edit(tmp_path: Path, decision: Any,
                                                     sent: Any, why: Any) -> None:
    mailed.clear()
    store = f"sqlite:///{tmp_path}/runs.db"
    wf = Workflow("mail").node("send", send).edge(START, "send")
    first = wf.run_sync(store=store)
    assert first.waiting["decisions"] == ["approve", "reject", "modify"]
    assert first.waiting["input"]["required"] == ["body"]
    with pytest.raises(interlock.UsageError, match=r"schema of 'send'.s confirmation 'send': "
                       r"at \$\.body: 3 is not of type 'string'"):
        wf.resume_sync(first.run_id, interlock.modify({"body": 3}), store=store)
    done = wf.resume_sync(first.run_id, decision, store=store)
    assert done.status == "COMPLETED", done.error
    assert done.state["sent"] == sent and done.state.get("why") == why
    assert mailed == ([sent] if sent else [])


def test_validate_checks_conditions_that_read_a_gates_data(project: CliProject) -> None:
    typo = GATED.replace("approval.data.amount <= 1000", "approval.data.amuont <= 1000")
    warned = CliRunner().invoke(cli, ["validate", project.workflow(typo)])
    assert warned.exit_code == 0, warned.output
    assert "warning: edge approval -> pay: when reads approval.data.amuont, but the input " \
        "schema of gate 'approval' has no property 'amuont' (its properties: amount, " \
        "reason)" in " ".join(warned.output.split())
    undeclared = GATED.replace("""      input:
        type: object
        properties:
          amount: {type: number, minimum: 0}
          reason: {type: string}
        required: [amount]
""", "")
    refused = CliRunner().invoke(cli, ["validate", project.workflow(undeclared, "no.yaml")])
    assert refused.exit_code == 2
    out = " ".join(refused.output.split())
    assert "reads approval.data.amount, but gate 'approval' declares no approval.input" in out
