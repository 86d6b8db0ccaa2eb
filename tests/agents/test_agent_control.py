"""Agents and humans beyond yes/no (SPEC §7): a guarded tool call edited by a human
(``modify {"arguments": ...}``), a rejection's comment passed to the model, tools that
hand off with ``interlock.goto``, and tool errors returned to the model.

The OpenAI path is the real SDK talking HTTP to the local OpenAI-compatible test server
(tests/fake_openai.py); the scripted provider runs the rest offline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner
from conftest import CliProject, records, trace
from fake_openai import FakeOpenAI
from pydantic import BaseModel

import interlock
from interlock import END, START, Workflow
from interlock.cli import cli
from interlock.testing import ScriptedProvider

CALLS: list[tuple[str, Any]] = []

ANSWER = {"type": "object", "properties": {"summary": {"type": "string"}},
          "required": ["summary"]}


async def delete_ledger(entry: str, force: bool = False) -> str:
    """Delete a ledger entry (destructive)."""
    CALLS.append(("delete_ledger", entry))
    return f"deleted {entry}"


@pytest.fixture
def store(tmp_path: Path) -> str:
    CALLS.clear()
    return f"sqlite:///{tmp_path}/runs.db"


def clerk(llm: FakeOpenAI, **agent: Any) -> Workflow:
    wf = Workflow("ledger", input=["task"])
    agent.setdefault("tools", [(delete_ledger, {"confirm": True})])
    wf.agent("clerk", model="gpt-test", base_url=llm.url, reads=["task"],
             prompt="Task: {{ task }}", output=ANSWER, **agent)
    return wf.edge(START, "clerk")


def waiting(llm: FakeOpenAI, store: str, **agent: Any) -> tuple[Workflow, str]:
    llm.reply(tool_calls=[("delete_ledger", {"entry": "E-1"})])
    wf = clerk(llm, **agent)
    first = wf.run_sync({"task": "clean up"}, store=store)
    assert first.status == "WAITING_APPROVAL", first.error
    return wf, first.run_id


# -- editing a guarded tool call --------------------------------------------------------------


def test_a_guarded_call_approved_with_edited_arguments(llm: FakeOpenAI, store: str) -> None:
    wf, run_id = waiting(llm, store)
    assert records(run_id, store, "approval.requested")[0]["decisions"] == [
        "approve", "reject", "modify"]
    status = asyncio.run(interlock.status(run_id, store=store))
    assert status.waiting["input"]["properties"]["arguments"]["required"] == ["entry"]

    llm.reply({"summary": "deleted E-2"})
    done = wf.resume_sync(run_id, interlock.modify({"arguments": {"entry": "E-2"}}, by="ann",
                                                   comment="wrong entry"), store=store)
    assert done.status == "COMPLETED", done.error
    assert CALLS == [("delete_ledger", "E-2")]  # the tool saw the edited arguments
    assert done.state["clerk"] == {"summary": "deleted E-2"}
    # the log shows both: what the model asked for and what ran, and who edited it
    [called] = records(run_id, store, "tool.called")
    assert called["arguments"] == {"entry": "E-2"}
    assert called["model_arguments"] == {"entry": "E-1"} and called["edited_by"] == "ann"
    [decided] = records(run_id, store, "approval.decided")
    assert decided["decision"] == "modified" and decided["patch"] == {
        "arguments": {"entry": "E-2"}}
    # the model's conversation shows the call that ran, answered by its result
    messages = llm.requests[1]["body"]["messages"]
    asked = messages[-2]["tool_calls"][0]["function"]
    assert json.loads(asked["arguments"]) == {"entry": "E-2"}
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_0", "content": "deleted E-2"}
    assert len(llm.requests) == 2  # the first model call was replayed, not repeated
    assert asyncio.run(interlock.verify(run_id, store=store)).ok


@pytest.mark.parametrize("patch, at, expect", [
    ({"arguments": {"entry": 5}}, None, "at $.arguments.entry: 5 is not of type 'string'"),
    ({"arguments": {"entry": "E-2", "when": "now"}}, None, "'when' was unexpected"),
    ({"arguments": {}}, None, "'entry' is a required property"),
    ({"args": {"entry": "E-2"}}, None, "'arguments' is a required property"),
    ({"arguments": {"entry": "E-2"}}, "clerk", "drop --at"),
])
def test_a_bad_edit_is_refused_and_nothing_is_recorded(
        llm: FakeOpenAI, store: str, patch: dict[str, Any], at: str | None, expect: str) -> None:
    wf, run_id = waiting(llm, store)
    before = len(trace(run_id, store))
    with pytest.raises(interlock.UsageError) as info:
        wf.resume_sync(run_id, interlock.modify(patch, at, by="ann"), store=store)
    assert expect in str(info.value)
    if at is None:
        assert "the call to 'delete_ledger'" in str(info.value)
        assert '"entry":{"type":"string"}' in str(info.value)  # the parameters, to fix it
    assert len(trace(run_id, store)) == before and CALLS == []
    assert asyncio.run(interlock.status(run_id, store=store)).status == "WAITING_APPROVAL"


def test_the_command_line_edits_a_call_and_refuses_a_bad_edit_with_exit_2(
        llm: FakeOpenAI, store: str) -> None:
    _, run_id = waiting(llm, store)
    runner = CliRunner()
    shown = runner.invoke(cli, ["status", run_id, "--store", store])
    assert "--modify '{\"arguments\": {...}}'" in shown.output
    before = len(trace(run_id, store))
    bad = runner.invoke(cli, ["resume", run_id, "--modify", '{"arguments": {"entry": 7}}',
                              "--store", store])
    assert bad.exit_code == 2 and "7 is not of type 'string'" in bad.output
    assert len(trace(run_id, store)) == before
    llm.reply({"summary": "ok"})
    # the stored definition names this module's functions: the CLI imports them
    good = runner.invoke(cli, ["resume", run_id, "--modify",
                               '{"arguments": {"entry": "E-3", "force": true}}', "--by", "ann",
                               "--store", store, "--json"])
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["state"]["clerk"] == {"summary": "ok"}
    assert CALLS == [("delete_ledger", "E-3")]


def test_redacted_arguments_cannot_be_edited(llm: FakeOpenAI, store: str) -> None:
    wf, run_id = waiting(llm, store, redact=["arguments"])
    status = asyncio.run(interlock.status(run_id, store=store))
    assert status.waiting["decisions"] == ["approve", "reject"]
    assert "input" not in status.waiting
    with pytest.raises(interlock.UsageError, match="unless the agent redacts them"):
        wf.resume_sync(run_id, interlock.modify({"arguments": {"entry": "E-2"}}), store=store)


# -- a rejection's comment reaches the model --------------------------------------------------


def test_a_rejections_comment_reaches_the_model_in_its_next_request(
        llm: FakeOpenAI, store: str) -> None:
    wf, run_id = waiting(llm, store)
    llm.reply({"summary": "kept E-1, as the reviewer asked"})
    done = wf.resume_sync(run_id, interlock.reject(by="ann", comment="E-1 is still open; "
                                                   "archive it instead"), store=store)
    assert done.status == "COMPLETED", done.error
    assert CALLS == []
    answer = llm.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_0"
    assert "rejected" in answer["content"] and "not executed" in answer["content"]
    assert "E-1 is still open; archive it instead" in answer["content"]
    [rejected] = records(run_id, store, "tool.rejected")
    assert rejected["comment"] == "E-1 is still open; archive it instead"


def test_feedback_then_a_corrected_call_the_review_tool_calls_flow(
        llm: FakeOpenAI, store: str) -> None:
    """LangGraph's "send feedback" branch: the model gets the comment, asks again with a
    corrected call, which is reviewed in turn and approved."""
    wf, run_id = waiting(llm, store)
    llm.reply(tool_calls=[("delete_ledger", {"entry": "E-1/2024"})])
    again = wf.resume_sync(run_id, interlock.reject(comment="name the year too: E-1/YYYY"),
                           store=store)
    assert again.status == "WAITING_APPROVAL" and CALLS == []
    assert again.waiting["show"]["arguments"] == {"entry": "E-1/2024"}
    feedback = llm.requests[1]["body"]["messages"][-1]
    assert "name the year too: E-1/YYYY" in feedback["content"]
    llm.reply({"summary": "deleted E-1/2024"})
    done = wf.resume_sync(run_id, interlock.approve(), store=store)
    assert done.status == "COMPLETED" and CALLS == [("delete_ledger", "E-1/2024")]
    assert len(llm.requests) == 3  # each model call made once, across the three resumes


def test_data_is_refused_on_a_guarded_tool_call(llm: FakeOpenAI, store: str) -> None:
    wf, run_id = waiting(llm, store)
    with pytest.raises(interlock.UsageError, match="takes no --data"):
        wf.resume_sync(run_id, interlock.approve(data={"x": 1}), store=store)


def test_a_rejection_without_a_comment_gives_the_plain_refusal(store: str) -> None:
    wf = Workflow("s")
    wf.agent("clerk", prompt="go", tools=[(delete_ledger, {"confirm": True})],
             provider=ScriptedProvider([
                 {"tool_calls": [{"name": "delete_ledger", "arguments": {"entry": "E-1"}}]},
                 "done"]))
    wf.edge(START, "clerk").edge("clerk", END)
    first = wf.run_sync(store=store)
    done = wf.resume_sync(first.run_id, interlock.reject(), store=store)
    assert done.status == "COMPLETED" and done.state["clerk"] == "done" and CALLS == []
    [rejected] = records(first.run_id, store, "tool.rejected")
    assert "comment" not in rejected


# -- tool errors go back to the model ---------------------------------------------------------


def divide(a: float, b: float) -> float:
    """Divide a by b."""
    CALLS.append(("divide", (a, b)))
    return a / b


def test_a_tool_error_goes_back_to_the_model_which_then_answers(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply(tool_calls=[("divide", {"a": 1, "b": 0})])
    llm.reply(tool_calls=[("divide", {"a": 1, "b": 4})])
    llm.reply({"summary": "1/0 is undefined; 1/4 = 0.25"})
    wf = clerk(llm, tools=[divide])
    done = wf.run_sync({"task": "divide"}, store=store)
    assert done.status == "COMPLETED", done.error  # the default: tool_errors: return
    assert done.state["clerk"] == {"summary": "1/0 is undefined; 1/4 = 0.25"}
    answer = llm.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_0"
    assert json.loads(answer["content"]) == {
        "error": "ZeroDivisionError: float division by zero"}
    assert llm.requests[2]["body"]["messages"][-1]["content"] == "0.25"
    failed, ok = records(done.run_id, store, "tool.called")
    assert failed["error"] == {"type": "ZeroDivisionError",
                               "message": "float division by zero"}
    assert failed["returned"] is True and failed["arguments"] == {"a": 1, "b": 0}
    assert ok["result"] == 0.25 and ok["error"] is None


def test_tool_errors_raise_fails_the_node_with_the_tools_exception(store: str) -> None:
    wf = Workflow("calc")
    wf.agent("calc", prompt="go", tools=[divide], tool_errors="raise",
             retry={"attempts": 2, "errors": ["ArithmeticError"]},
             provider=ScriptedProvider([{"tool_calls": [{"name": "divide",
                                                         "arguments": {"a": 1, "b": 0}}]}]))
    wf.edge(START, "calc")
    failed = wf.run_sync(store=store)
    assert failed.status == "FAILED" and failed.error["node"] == "calc"
    assert "ZeroDivisionError" in failed.error["message"]
    # the tool's own exception, so retry.errors can name it (along its MRO): retried once,
    # replaying the journaled model call, then failed
    assert len(records(failed.run_id, store, "node.retrying")) == 1
    [called, again] = records(failed.run_id, store, "tool.called")
    assert "returned" not in called and called["error"]["type"] == "ZeroDivisionError"
    assert again["error"] == called["error"]


def test_tool_errors_takes_return_or_raise() -> None:
    wf = Workflow("calc")
    wf.agent("calc", prompt="go", tools=[divide], tool_errors="ignore",
             provider=ScriptedProvider(["x"]))
    wf.edge(START, "calc")
    with pytest.raises(interlock.WorkflowError, match=r"tool_errors: Input should be "
                       r"'return' or 'raise'"):
        wf.compile()


# -- a tool hands off with goto ---------------------------------------------------------------


def transfer_to_math(reason: str) -> interlock.Goto:
    """Hand the conversation to the math expert."""
    CALLS.append(("transfer_to_math", reason))
    return interlock.goto("math_agent", {"handoff": reason})


def transfer_nowhere() -> interlock.Goto:
    """Hand off to a node the supervisor may not choose."""
    return interlock.goto("payroll")


def lookup(topic: str) -> str:
    """Look something up."""
    CALLS.append(("lookup", topic))
    return f"facts about {topic}"


async def math_agent(state: dict[str, Any]) -> dict[str, Any]:
    return {"answer": f"math on {state['handoff']}"}


async def research(state: dict[str, Any]) -> dict[str, Any]:
    return {"answer": "researched"}


def supervisor(replies: list[Any], tools: list[Any] | None = None) -> Workflow:
    wf = Workflow("supervisor", input=["question"])
    wf.agent("supervisor", reads=["question"], prompt="{{ question }}",
             tools=tools or [lookup, transfer_to_math, transfer_nowhere],
             provider=ScriptedProvider(replies))
    wf.node("math_agent", math_agent).node("research", research).node("payroll", research)
    wf.edge(START, "supervisor").choose("supervisor", ["math_agent", "research", END])
    wf.edge("research", "payroll")  # a node, but not one the supervisor may hand off to
    return wf


def test_a_tool_that_returns_goto_ends_the_turn_and_routes(store: str) -> None:
    wf = supervisor([
        {"tool_calls": [{"name": "lookup", "arguments": {"topic": "primes"}}]},
        {"tool_calls": [{"name": "transfer_to_math", "arguments": {"reason": "2+2"}},
                        {"name": "lookup", "arguments": {"topic": "never"}}]},
    ])
    done = wf.run_sync({"question": "what is 2+2?"}, store=store)
    assert done.status == "COMPLETED", done.error
    # the handoff's update is the node's; the call after it in the same reply never ran
    assert done.state == {"question": "what is 2+2?", "handoff": "2+2",
                          "answer": "math on 2+2"}
    assert CALLS == [("lookup", "primes"), ("transfer_to_math", "2+2")]
    [edge] = [r for r in records(done.run_id, store, "edge.taken") if r["from"] == "supervisor"]
    assert edge["expr"] == "goto" and edge["to"] == ["math_agent"]
    handoff = records(done.run_id, store, "tool.called")[-1]
    assert handoff["tool"] == "transfer_to_math"
    assert handoff["result"] == {"goto": "math_agent", "update": {"handoff": "2+2"}}
    assert len(records(done.run_id, store, "agent.request")) == 2  # no further model call


def test_without_a_handoff_the_choose_edge_has_no_route(store: str) -> None:
    failed = supervisor(["I cannot decide"]).run_sync({"question": "q"}, store=store)
    assert failed.status == "FAILED" and failed.error["type"] == "no_route"


def test_a_goto_to_an_undeclared_target_fails_the_node(store: str) -> None:
    wf = supervisor([{"tool_calls": [{"name": "transfer_nowhere", "arguments": {}}]}])
    failed = wf.run_sync({"question": "q"}, store=store)
    assert failed.status == "FAILED" and failed.error["type"] == "invalid_route"
    assert failed.error["node"] == "supervisor"
    assert "tool 'transfer_nowhere' returned goto('payroll')" in failed.error["message"]
    assert "math_agent, research, END" in failed.error["message"]
    assert "payroll" not in {r["node"] for r in records(failed.run_id, store, "node.started")}


def test_a_handoff_is_replayed_not_repeated_after_a_guarded_tool(store: str) -> None:
    wf = supervisor([
        {"tool_calls": [{"name": "delete_ledger", "arguments": {"entry": "E-1"}}]},
        {"tool_calls": [{"name": "transfer_to_math", "arguments": {"reason": "sum"}}]},
    ], tools=[(delete_ledger, {"confirm": True}), transfer_to_math])
    first = wf.run_sync({"question": "q"}, store=store)
    assert first.status == "WAITING_APPROVAL"
    done = wf.resume_sync(first.run_id, interlock.approve(), store=store)
    assert done.status == "COMPLETED", done.error
    assert done.state["answer"] == "math on sum"
    assert CALLS == [("delete_ledger", "E-1"), ("transfer_to_math", "sum")]
    assert asyncio.run(interlock.verify(first.run_id, store=store)).ok


HANDOFF = """
workflow: handoff
nodes:
  supervisor:
    agent:
      provider: scripted
      prompt: route me
      tools: [{mod}:transfer]
      replies: [{tool_calls: [{name: transfer, arguments: {}}]}]
  worker: {mod}:work
edges:
  - {from: START, to: supervisor}
  - {from: supervisor, choose: [worker, END]}
"""

HANDOFF_NODES = """
import interlock

def transfer() -> interlock.Goto:
    \"\"\"Hand off to the worker.\"\"\"
    return interlock.goto("worker")

def work(state):
    return {"done": True}
"""


def test_validate_accepts_an_agent_routed_by_its_tools_goto(
        make_project: Callable[..., CliProject]) -> None:
    project = make_project(HANDOFF_NODES)
    ok = CliRunner().invoke(cli, ["validate", project.workflow(HANDOFF)])
    assert ok.exit_code == 0, ok.output
    result, out = project.cli_json("run", "wf.yaml")
    assert result.exit_code == 0 and out["state"] == {"done": True}
    no_tools = HANDOFF.replace("      tools: [{mod}:transfer]\n", "")
    bad = CliRunner().invoke(cli, ["validate", project.workflow(no_tools, "bad.yaml")])
    assert bad.exit_code == 2
    assert "bad.yaml:5:" in bad.output and "needs something to choose" in bad.output


# -- papercuts --------------------------------------------------------------------------------


def test_too_few_scripted_replies_for_a_repair_round_name_the_schema_error(store: str) -> None:
    wf = Workflow("short")
    wf.agent("risk", prompt="go", output=ANSWER, provider=ScriptedProvider([
        {"content": {"summary": 7}}]))
    wf.edge(START, "risk")
    failed = wf.run_sync(store=store)
    assert failed.status == "FAILED"
    message = failed.error["message"]
    assert "AgentOutputError" in message
    assert "at $.summary: 7 is not of type 'string'" in message  # the real cause
    assert "no reply left" in message  # and why there was no repair


@pytest.mark.parametrize("reply, stored", [
    ({"summary": "s", "n": 2}, {"summary": "s", "n": 2}),  # a JSON object: its data
    ('```json\n{"a": [1, 2]}\n```', {"a": [1, 2]}),  # fenced
    ("[1, 2, 3]", "[1, 2, 3]"),  # only an object is data (the errors branch's decision)
    ("42", "42"),  # scalars stay the text the model wrote
    ("{not json", "{not json"),
    ("Plain words.", "Plain words."),
])
def test_a_reply_without_an_output_schema(store: str, reply: Any, stored: Any) -> None:
    wf = Workflow("free")
    wf.agent("note", prompt="go", provider=ScriptedProvider([{"content": reply}]))
    wf.edge(START, "note")
    done = wf.run_sync(store=store)
    assert done.status == "COMPLETED", done.error
    assert done.state["note"] == stored


def test_conditions_read_the_fields_of_a_json_reply_without_a_schema(store: str) -> None:
    wf = Workflow("free")
    wf.agent("note", prompt="go", provider=ScriptedProvider(['{"next": "research"}']))
    wf.node("research", research)
    wf.edge(START, "note").edge("note", "research", when='note.next == "research"')
    wf.edge("note", END, otherwise=True)
    done = wf.run_sync(store=store)
    assert done.status == "COMPLETED", done.error
    assert done.state == {"note": {"next": "research"}, "answer": "researched"}


class Transfer(BaseModel):
    to: str
    amount: int


def wire(transfer: Transfer, currency: Literal["EUR", "USD"] = "EUR") -> str:
    """Wire money (destructive)."""
    CALLS.append(("wire", (transfer.to, transfer.amount, currency)))
    return f"sent {transfer.amount} {currency} to {transfer.to}"


def test_an_edit_is_checked_against_nested_parameter_types(store: str) -> None:
    wf = Workflow("bank")
    wf.agent("teller", prompt="pay", tools=[(wire, {"confirm": True})],
             provider=ScriptedProvider([
                 {"tool_calls": [{"name": "wire", "arguments": {
                     "transfer": {"to": "acme", "amount": 900}}}]}, "paid"]))
    wf.edge(START, "teller")
    first = wf.run_sync(store=store)
    with pytest.raises(interlock.UsageError, match=r"at \$\.arguments\.transfer\.amount: 'lots'"
                       r" is not of type 'integer'"):
        wf.resume_sync(first.run_id, interlock.modify(
            {"arguments": {"transfer": {"to": "acme", "amount": "lots"}}}), store=store)
    with pytest.raises(interlock.UsageError, match=r"'GBP' is not one of \['EUR', 'USD'\]"):
        wf.resume_sync(first.run_id, interlock.modify(
            {"arguments": {"transfer": {"to": "acme", "amount": 90}, "currency": "GBP"}}),
            store=store)
    done = wf.resume_sync(first.run_id, interlock.modify(
        {"arguments": {"transfer": {"to": "acme", "amount": 90}, "currency": "USD"}}),
        store=store)
    assert done.status == "COMPLETED" and CALLS == [("wire", ("acme", 90, "USD"))]
