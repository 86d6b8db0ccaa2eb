"""Agent nodes (SPEC §6), through `Workflow.run` with a SQLite store.

The OpenAI path is the real SDK talking HTTP to a local OpenAI-compatible server that
each test starts on 127.0.0.1 (canned chat completions with usage and tool calls, a 429
when asked): no patched client, no network, no key beyond a dummy one. The scripted
provider runs whole workflows offline.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner
from conftest import records, trace
from fake_openai import FakeOpenAI
from pydantic import BaseModel

import interlock
from interlock import END, START, Workflow, WorkflowError
from interlock.cli import cli
from interlock.testing import ScriptedProvider

RISK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"level": {"enum": ["LOW", "MEDIUM", "HIGH"]}, "reason": {"type": "string"}},
    "required": ["level", "reason"],
}

TOOL_CALLS: list[tuple[str, Any]] = []


def lookup_control(control_id: str, year: int) -> dict[str, Any]:
    """Look up an internal control by id for a fiscal year."""
    TOOL_CALLS.append(("lookup_control", (control_id, year)))
    return {"control": control_id, "year": year, "tested": year >= 2024}


async def delete_ledger(entry: str) -> str:
    """Delete a ledger entry (destructive)."""
    TOOL_CALLS.append(("delete_ledger", entry))
    return f"deleted {entry}"


@pytest.fixture
def store(tmp_path: Path) -> str:
    TOOL_CALLS.clear()
    return f"sqlite:///{tmp_path}/runs.db"


async def escalate(state: dict[str, Any]) -> dict[str, Any]:
    return {"escalated": state["risk"]["level"]}


async def archive(state: dict[str, Any]) -> dict[str, Any]:
    return {"archived": True}


def audit(llm: FakeOpenAI, **agent: Any) -> Workflow:
    """risk (agent over plan) -> escalate when HIGH, else archive."""
    options = {"tokens": agent.pop("limits_tokens", None)}
    wf = Workflow("audit", input=["plan"],
                  limits={k: v for k, v in options.items() if v is not None})
    agent.setdefault("output", RISK_SCHEMA)
    wf.agent("risk", model="gpt-test", base_url=llm.url, reads=["plan"],
             system="You assess the audit risk of an engagement.",
             prompt="Plan: {{ plan }}", **agent)
    wf.node("escalate", escalate).node("archive", archive)
    wf.edge(START, "risk")
    wf.edge("risk", "escalate", when='risk.level == "HIGH"')
    wf.edge("risk", "archive", otherwise=True)
    return wf


# -- structured output, routing, tokens ---------------------------------------------------


@pytest.mark.parametrize("level, routed", [("HIGH", "escalated"), ("LOW", "archived")])
def test_structured_output_goes_into_state_and_a_condition_routes_on_it(
        llm: FakeOpenAI, store: str, level: str, routed: str) -> None:
    llm.reply({"level": level, "reason": "no segregation of duties"}, usage=(120, 30))
    wf = audit(llm, limits_tokens=1000)
    result = wf.run_sync({"plan": "close the books"}, store=store)

    assert result.status == "COMPLETED", result.error
    assert result.state["risk"] == {"level": level, "reason": "no segregation of duties"}
    assert routed in result.state and len(result.state) == 3
    [taken] = [r for r in records(result.run_id, store, "edge.taken") if r["from"] == "risk"]
    assert taken["expr"] in ('risk.level == "HIGH"', "otherwise")

    # the real SDK sent a real Chat Completions request
    [req] = llm.requests
    body = req["body"]
    assert req["auth"] == "Bearer sk-test" and body["model"] == "gpt-test"
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][0]["content"].startswith("You assess the audit risk")
    assert body["messages"][1] == {"role": "user", "content": "Plan: close the books"}
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == RISK_SCHEMA


def test_tokens_are_charged_to_the_budget_and_shown_per_node_in_the_trace(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply({"level": "HIGH", "reason": "r"}, usage=(120, 30))
    result = audit(llm, limits_tokens=1000).run_sync({"plan": "p"}, store=store)
    assert result.tokens == 150
    recs = trace(result.run_id, store)
    [done] = [r for r in recs if r["type"] == "node.completed" and r["node"] == "risk"]
    assert done["tokens"] == 150
    [reply] = [r for r in recs if r["type"] == "agent.reply"]
    assert reply["usage"] == {"prompt_tokens": 120, "completion_tokens": 30,
                              "total_tokens": 150}
    assert json.loads(reply["reply"]) == {"level": "HIGH", "reason": "r"}
    [request] = [r for r in recs if r["type"] == "agent.request"]
    assert request["node"] == "risk" and request["prompt"] == "Plan: p"


def test_the_call_that_crosses_the_budget_counts_and_is_not_paid_twice(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply({"level": "HIGH", "reason": "r"}, usage=(120, 30))
    wf = audit(llm, limits_tokens=100)
    failed = wf.run_sync({"plan": "p"}, store=store)
    assert failed.status == "FAILED" and failed.error["type"] == "budget_exceeded"
    assert failed.tokens == 150 and "risk" not in failed.state
    # more budget: the reply is replayed from the log, not bought again
    done = wf.resume_sync(failed.run_id, store=store, limits={"tokens": 1000})
    assert done.status == "COMPLETED" and done.state["escalated"] == "HIGH"
    assert len(llm.requests) == 1 and done.tokens == 150


# -- tools ----------------------------------------------------------------------------------


def test_a_tool_call_runs_the_typed_function_and_answers_the_model(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply(tool_calls=[("lookup_control", {"control_id": "C-7", "year": "2024"})],
              usage=(50, 10))
    llm.reply({"level": "LOW", "reason": "control C-7 is tested"}, usage=(80, 20))
    result = audit(llm, tools=[lookup_control]).run_sync({"plan": "p"}, store=store)

    assert result.status == "COMPLETED", result.error
    assert TOOL_CALLS == [("lookup_control", ("C-7", 2024))]  # "2024" arrived as an int
    assert result.state["risk"]["level"] == "LOW" and result.tokens == 160
    first, second = (r["body"] for r in llm.requests)
    [tool] = first["tools"]
    assert tool["function"]["name"] == "lookup_control"
    assert tool["function"]["description"].startswith("Look up an internal control")
    assert tool["function"]["parameters"]["properties"]["year"]["type"] == "integer"
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "lookup_control"
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["tool_call_id"] == "call_0"
    assert json.loads(second["messages"][-1]["content"]) == {
        "control": "C-7", "year": 2024, "tested": True}
    [called] = records(result.run_id, store, "tool.called")
    assert called["tool"] == "lookup_control" and called["arguments"]["control_id"] == "C-7"
    assert called["result"]["tested"] is True


def broken_tool(entry: str) -> str:
    """A tool whose backend is down."""
    raise ConnectionResetError(f"ledger service reset the connection ({entry})")


def test_a_tool_that_raises_fails_the_node_and_the_log_names_the_call(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply(tool_calls=[("broken_tool", {"entry": "E-9"})], usage=(50, 10))
    result = audit(llm, tools=[broken_tool], tool_errors="raise").run_sync({"plan": "p"},
                                                                         store=store)
    assert result.status == "FAILED" and "ConnectionResetError" in result.error["message"]
    [called] = records(result.run_id, store, "tool.called")
    assert called["tool"] == "broken_tool" and called["arguments"] == {"entry": "E-9"}
    assert called["error"] == {"type": "ConnectionResetError",
                               "message": "ledger service reset the connection (E-9)"}
    assert result.tokens == 60  # the model call that asked for it was paid for


def test_invalid_tool_arguments_go_back_to_the_model(llm: FakeOpenAI, store: str) -> None:
    llm.reply(tool_calls=[("lookup_control", {"control_id": "C-7", "year": "last"})])
    llm.reply({"level": "LOW", "reason": "r"})
    result = audit(llm, tools=[lookup_control]).run_sync({"plan": "p"}, store=store)
    assert result.status == "COMPLETED" and TOOL_CALLS == []
    answer = llm.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and "year" in json.loads(answer["content"])["error"]


def test_a_rejected_guarded_tool_never_runs_and_the_agent_carries_on(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply(tool_calls=[("delete_ledger", {"entry": "E-1"})], usage=(40, 10))
    wf = audit(llm, tools=[(delete_ledger, {"confirm": True})])
    first = wf.run_sync({"plan": "p"}, store=store)

    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["node"] == "risk"
    assert first.waiting["show"] == {"tool": "delete_ledger", "arguments": {"entry": "E-1"}}
    assert len(llm.requests) == 1 and TOOL_CALLS == []

    llm.reply({"level": "MEDIUM", "reason": "nothing deleted"}, usage=(60, 10))
    done = asyncio.run(interlock.resume(first.run_id, interlock.reject(by="x"), store=store,
                                        workflow=wf))
    assert done.status == "COMPLETED", done.error  # a rejected tool does not end the run
    assert TOOL_CALLS == []  # never executed
    assert done.state["risk"]["level"] == "MEDIUM" and "archived" in done.state
    assert len(llm.requests) == 2  # the first model call was replayed, not repeated
    answer = llm.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_0"
    assert "rejected" in answer["content"] and "not executed" in answer["content"]
    assert done.tokens == 120
    [rejected] = records(first.run_id, store, "tool.rejected")
    assert rejected["tool"] == "delete_ledger" and rejected["arguments"] == {"entry": "E-1"}
    [decided] = records(first.run_id, store, "approval.decided")
    assert decided["by"] == "x" and decided["decision"] == "rejected"
    assert records(first.run_id, store, "tool.called") == []
    assert asyncio.run(interlock.verify(first.run_id, store=store)).ok


def test_an_approved_guarded_tool_runs_once(llm: FakeOpenAI, store: str) -> None:
    llm.reply(tool_calls=[("delete_ledger", {"entry": "E-1"})])
    wf = audit(llm, tools=[(delete_ledger, {"confirm": True})])
    first = wf.run_sync({"plan": "p"}, store=store)
    llm.reply({"level": "LOW", "reason": "r"})
    done = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert done.status == "COMPLETED"
    assert TOOL_CALLS == [("delete_ledger", "E-1")]
    assert llm.requests[1]["body"]["messages"][-1]["content"] == "deleted E-1"


# -- redaction is complete: nothing named in redact reaches the log -------------------------

SECRETS = ("PROMPT-SECRET-42", "REPLY-SECRET-1", "REPLY-SECRET-2", "RESULT-SECRET-77")


def vault_lookup(key: str) -> str:
    """Read a secret from the vault."""
    TOOL_CALLS.append(("vault_lookup", key))
    return f"RESULT-SECRET-77 for {key}"


def stored_text(run_id: str, store: str) -> str:
    """Every record of the run, through `interlock.trace` and as the raw ``records.data``."""
    with sqlite3.connect(store.removeprefix("sqlite:///")) as db:
        raw = [d for (d,) in db.execute("SELECT data FROM records WHERE run_id = ?",
                                        (run_id,))]
    assert raw
    return json.dumps(trace(run_id, store)) + "\n".join(raw)


def secret_workflow(llm: FakeOpenAI, redact: list[str]) -> Workflow:
    wf = Workflow("secret", input=["plan"])
    wf.agent("risk", model="gpt-test", base_url=llm.url, reads=["plan"],
             prompt="Codeword PROMPT-SECRET-42. Plan: {{ plan }}", output=RISK_SCHEMA,
             tools=[vault_lookup, (delete_ledger, {"confirm": True})], redact=redact)
    return wf.edge(START, "risk")


def test_redacted_fields_appear_nowhere_in_the_log_and_a_confirmation_calls_the_model_again(
        llm: FakeOpenAI, store: str) -> None:
    asks = [("vault_lookup", {"key": "k1"}), ("delete_ledger", {"entry": "E-1"})]
    llm.reply("thinking about REPLY-SECRET-1", tool_calls=asks)
    wf = secret_workflow(llm, ["prompt", "reply", "result"])
    first = wf.run_sync({"plan": "p"}, store=store)
    assert first.status == "WAITING_APPROVAL", first.error
    assert first.waiting["show"] == {"tool": "delete_ledger", "arguments": {"entry": "E-1"}}

    # the reply was not journaled, so the re-run after the decision calls the model again
    # (and pays again); the approval holds because it asks for the very same call
    llm.reply("thinking about REPLY-SECRET-1", tool_calls=asks)
    llm.reply("not JSON: REPLY-SECRET-2")  # the repair round gets the details, the log not
    llm.reply({"level": "LOW", "reason": "checked"})
    done = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert done.status == "COMPLETED", done.error
    assert done.state["risk"] == {"level": "LOW", "reason": "checked"}
    assert len(llm.requests) == 4 and done.tokens == 4 * 15
    # the unjournaled tool result means the tool ran again on the re-run (documented)
    assert TOOL_CALLS == [("vault_lookup", "k1"), ("vault_lookup", "k1"),
                          ("delete_ledger", "E-1")]
    to_model = json.dumps([r["body"]["messages"] for r in llm.requests])
    assert all(secret in to_model for secret in SECRETS)  # the model got everything

    text = stored_text(first.run_id, store)
    assert [s for s in SECRETS if s in text] == []
    recs = trace(first.run_id, store)
    stubs = [r for r in recs if r["type"] == "effect.recorded" and r["key"].startswith("llm-")]
    assert len(stubs) == 4
    assert all(r["result"] == {"redacted": ["reply"], "model": "gpt-test",
                               "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                         "total_tokens": 15}} for r in stubs)
    assert not [r for r in recs if r["type"] == "effect.recorded"
                and r["key"].startswith("tool-")]  # results are not journaled
    assert [r["repair"] for r in recs if r.get("repair")] == [
        "details withheld (redact: reply)"]
    assert asyncio.run(interlock.verify(first.run_id, store=store)).ok

    # the same run without redact journals (and logs) all of it
    TOOL_CALLS.clear()
    llm.reply("thinking about REPLY-SECRET-1", tool_calls=asks[:1])
    llm.reply({"level": "LOW", "reason": "checked"})
    shown = secret_workflow(llm, []).run_sync({"plan": "p"}, store=store)
    assert shown.status == "COMPLETED", shown.error
    text = stored_text(shown.run_id, store)
    assert all(s in text for s in ("PROMPT-SECRET-42", "REPLY-SECRET-1", "RESULT-SECRET-77"))


def test_with_the_reply_redacted_a_decision_binds_to_the_exact_call(store: str) -> None:
    wf = Workflow("bound")
    wf.agent("risk", prompt="go", output=RISK_SCHEMA, redact=["reply"],
             tools=[(delete_ledger, {"confirm": True})], provider=ScriptedProvider([
                 {"tool_calls": [{"name": "delete_ledger", "arguments": {"entry": "E-1"}}]},
                 # the re-run after the rejection calls the model again: it asks otherwise
                 {"tool_calls": [{"name": "delete_ledger", "arguments": {"entry": "E-2"}}]},
             ]))
    wf.edge(START, "risk")
    first = wf.run_sync(store=store)
    assert first.waiting["show"]["arguments"] == {"entry": "E-1"}
    again = wf.resume_sync(first.run_id, interlock.reject(by="x"), store=store)
    # the rejection of E-1 does not answer a call to delete E-2: a human is asked again
    assert again.status == "WAITING_APPROVAL"
    assert again.waiting["show"]["arguments"] == {"entry": "E-2"} and TOOL_CALLS == []


def test_a_reply_that_never_validates_fails_without_quoting_a_redacted_reply(
        store: str) -> None:
    wf = Workflow("bad")
    wf.agent("risk", prompt="go", output=RISK_SCHEMA, redact=["reply"],
             provider=ScriptedProvider(["REPLY-SECRET-1", {"content": {"level": "REPLY-SECRET-2",
                                                                       "reason": "r"}}]))
    wf.edge(START, "risk")
    result = wf.run_sync(store=store)
    assert result.status == "FAILED" and result.error["type"] != "cancelled"
    assert "even after a repair round" in result.error["message"]
    text = stored_text(result.run_id, store)
    assert "REPLY-SECRET" not in text and "REPLY-SECRET" not in json.dumps(result.error)


# -- provider errors --------------------------------------------------------------------


@pytest.mark.parametrize("status, name", [(429, "RateLimitError"),
                                          (503, "ProviderServerError")])
def test_provider_errors_go_through_the_retry_policy(
        llm: FakeOpenAI, store: str, status: int, name: str) -> None:
    llm.fail(status, "slow down").reply({"level": "HIGH", "reason": "r"}, usage=(10, 5))
    wf = audit(llm, retry={"attempts": 2, "errors": [name]})
    result = wf.run_sync({"plan": "p"}, store=store)
    assert result.status == "COMPLETED", result.error
    assert len(llm.requests) == 2 and result.state["escalated"] == "HIGH"
    [retrying] = records(result.run_id, store, "node.retrying")
    assert name in retrying["error"]["message"] and str(status) in retrying["error"]["message"]
    assert result.tokens == 15


def test_a_429_without_a_retry_fails_the_node_cleanly(llm: FakeOpenAI, store: str) -> None:
    llm.fail(429, "slow down")
    wf = Workflow("audit", input=["plan"], config={"llm_url": "http://127.0.0.1:9/v1"})
    wf.agent("risk", model="gpt-test", base_url="{{ config.llm_url }}", prompt="{{ plan }}",
             output=RISK_SCHEMA).edge(START, "risk")
    result = wf.run_sync({"plan": "p"}, store=store, config={"llm_url": llm.url})
    assert result.status == "FAILED" and result.error["node"] == "risk"
    assert "RateLimitError" in result.error["message"] and "429" in result.error["message"]
    assert "risk" not in result.state


def test_an_unreachable_provider_is_named_in_the_error(llm: FakeOpenAI, store: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    wf = Workflow("audit", input=["plan"])
    wf.agent("risk", model="gpt-test", base_url=url, prompt="{{ plan }}",
             output=RISK_SCHEMA).edge(START, "risk")
    result = wf.run_sync({"plan": "p"}, store=store)
    assert result.status == "FAILED"
    message = result.error["message"]
    assert f"cannot reach the provider at {url}" in message
    assert message.count("'risk'") == 1  # "node 'risk' raised ...", not twice


def test_a_missing_api_key_is_a_clear_error(llm: FakeOpenAI, store: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    result = audit(llm, api_key_env="AUDIT_LLM_KEY").run_sync({"plan": "p"}, store=store)
    assert result.status == "FAILED" and "$AUDIT_LLM_KEY" in result.error["message"]
    assert llm.requests == []


# -- schema validation and repair -------------------------------------------------------


def test_an_invalid_reply_gets_one_repair_round(llm: FakeOpenAI, store: str) -> None:
    llm.reply({"level": "EXTREME", "reason": "r"}).reply({"level": "HIGH", "reason": "r"})
    result = audit(llm).run_sync({"plan": "p"}, store=store)
    assert result.status == "COMPLETED"
    assert result.state["risk"] == {"level": "HIGH", "reason": "r"}
    repair = llm.requests[1]["body"]["messages"]
    assert repair[-2]["role"] == "assistant" and "EXTREME" in repair[-2]["content"]
    assert repair[-1]["role"] == "user" and "'EXTREME' is not one of" in repair[-1]["content"]
    assert result.tokens == 30
    requests = records(result.run_id, store, "agent.request")
    assert "is not one of" in requests[1]["repair"]


def test_a_reply_invalid_after_the_repair_fails_the_node_and_leaves_state_alone(
        llm: FakeOpenAI, store: str) -> None:
    llm.reply({"level": "EXTREME", "reason": "r"}).reply("I think it is high")
    wf = audit(llm)
    failed = wf.run_sync({"plan": "p"}, store=store)
    assert failed.status == "FAILED" and failed.error["node"] == "risk"
    assert "AgentOutputError" in failed.error["message"]
    assert "not a JSON document" in failed.error["message"]
    assert "risk" not in failed.state and len(llm.requests) == 2
    # resuming the failed run starts a fresh conversation, not a replay of the bad one
    llm.reply({"level": "LOW", "reason": "r"})
    done = wf.resume_sync(failed.run_id, store=store)
    assert done.status == "COMPLETED" and done.state["risk"]["level"] == "LOW"
    assert len(llm.requests) == 3
    assert llm.requests[2]["body"]["messages"][-1] == {"role": "user", "content": "Plan: p"}


# -- the scripted provider, choose, redact, pydantic outputs -------------------------------


class Risk(BaseModel):
    level: Literal["LOW", "HIGH"]
    reason: str


def scripted_workflow() -> Workflow:
    wf = Workflow("offline", input=["plan"])
    wf.agent("risk", reads=["plan"], prompt="Plan: {{ plan }}", output=Risk,
             tools=[lookup_control], provider=ScriptedProvider([
                 {"tool_calls": [{"name": "lookup_control",
                                  "arguments": {"control_id": "C-9", "year": 2023}}],
                  "usage": {"prompt_tokens": 30, "completion_tokens": 5}},
                 {"content": {"level": "HIGH", "reason": "C-9 untested"},
                  "usage": {"total_tokens": 40}},
             ]))
    wf.agent("summary", reads=["risk"], prompt="Summarise: {{ risk.reason }}",
             provider=ScriptedProvider(["Escalate: control C-9 was not tested."]))
    wf.node("archive", archive)
    wf.edge(START, "risk")
    wf.switch("risk", "risk.level", {"HIGH": "summary"}, default="archive")
    return wf


def test_the_scripted_provider_makes_a_whole_workflow_deterministic(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    wf = scripted_workflow()
    one = wf.run_sync({"plan": "p"}, store=store)
    two = wf.run_sync({"plan": "p"}, store=store)
    assert one.status == two.status == "COMPLETED"
    assert one.state == two.state == {
        "plan": "p", "risk": {"level": "HIGH", "reason": "C-9 untested"},
        "summary": "Escalate: control C-9 was not tested."}
    assert one.tokens == two.tokens == 75
    assert TOOL_CALLS == [("lookup_control", ("C-9", 2023))] * 2
    kinds = [[r["type"] for r in trace(run.run_id, store)] for run in (one, two)]
    assert kinds[0] == kinds[1]


def test_choose_routes_on_a_field_of_the_output(store: str) -> None:
    wf = Workflow("triage")
    schema = {"type": "object", "properties": {"next": {"type": "string"}}}
    wf.agent("triage", prompt="Where next?", output=schema, choose="next",
             provider=ScriptedProvider([{"content": {"next": "nowhere"}},
                                        {"content": {"next": "review"}}]))
    wf.node("review", archive)
    wf.edge(START, "triage").choose("triage", ["review", END])
    result = wf.run_sync(store=store)
    # "nowhere" is not a declared target: the schema limits the field to them, so the
    # reply is repaired like any other invalid one
    assert result.status == "COMPLETED", result.error
    assert result.state == {"triage": {"next": "review"}, "archived": True}
    [edge] = [r for r in records(result.run_id, store, "edge.taken") if r["from"] == "triage"]
    assert edge["expr"] == "goto" and edge["to"] == ["review"]


def test_redact_keeps_the_prompt_out_of_the_log(store: str) -> None:
    def build(redact: list[str]) -> Workflow:
        wf = Workflow("secret", input=["plan"])
        wf.agent("risk", reads=["plan"], prompt="Codeword SWORDFISH. Plan: {{ plan }}",
                 output=RISK_SCHEMA, redact=redact,
                 provider=ScriptedProvider([{"content": {"level": "LOW", "reason": "r"}}]))
        return wf.edge(START, "risk")

    shown = build([]).run_sync({"plan": "p"}, store=store)
    assert "SWORDFISH" in json.dumps(trace(shown.run_id, store))
    hidden = build(["prompt"]).run_sync({"plan": "p"}, store=store)
    assert hidden.status == "COMPLETED"
    assert "SWORDFISH" not in json.dumps(trace(hidden.run_id, store))
    [request] = records(hidden.run_id, store, "agent.request")
    assert "prompt" not in request and request["turn"] == 0
    masked = build(["plan"]).run_sync({"plan": "TOP-SECRET-PLAN"}, store=store)
    [request] = records(masked.run_id, store, "agent.request")
    assert request["prompt"] == "Codeword SWORDFISH. Plan: [redacted]"


def test_a_scripted_agent_without_replies_left_fails_clearly(store: str) -> None:
    wf = Workflow("short")
    wf.agent("risk", prompt="go", output=RISK_SCHEMA, provider=ScriptedProvider([
        {"content": {"level": "nope"}}]))
    wf.edge(START, "risk")
    result = wf.run_sync(store=store)
    assert result.status == "FAILED" and "no reply left" in result.error["message"]


def test_max_turns_bounds_the_tool_calls_and_a_retry_starts_afresh(store: str) -> None:
    call = {"tool_calls": [{"name": "lookup_control",
                            "arguments": {"control_id": "C-1", "year": 2020}}]}
    wf = Workflow("loop")
    wf.agent("risk", prompt="go", output=RISK_SCHEMA, tools=[lookup_control], max_turns=2,
             retry={"attempts": 2, "errors": ["AgentTurnsError"]},
             provider=ScriptedProvider([call, call, {"content": {"level": "LOW",
                                                                 "reason": "r"}}]))
    wf.edge(START, "risk")
    result = wf.run_sync(store=store)
    # attempt 1: a tool round, then tools again on its last turn (not run) -> fails;
    # attempt 2 is a new conversation and gets the final answer
    assert result.status == "COMPLETED", result.error
    assert len(TOOL_CALLS) == 1 and result.state["risk"]["level"] == "LOW"
    [retrying] = records(result.run_id, store, "node.retrying")
    assert "AgentTurnsError" in retrying["error"]["message"]
    assert "max_turns=2" in retrying["error"]["message"]


def test_an_agent_node_cannot_run_in_a_separate_process() -> None:
    wf = Workflow("iso")
    wf.agent("risk", prompt="go", provider=ScriptedProvider(["ok"]), isolation="process")
    wf.edge(START, "risk")
    with pytest.raises(WorkflowError, match="'isolation: process' is for call nodes"):
        wf.compile()


def test_ctx_log_appends_a_node_record_but_never_an_engine_one(store: str) -> None:
    async def note(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        await ctx.log("audit.note", {"text": "checked"})
        await ctx.log("node.completed", {"update": {"forged": True}})
        return {"unreachable": True}

    wf = Workflow("log").node("note", note).edge(START, "note")
    result = wf.run_sync(store=store)
    assert result.status == "FAILED" and "not a record type a node may write" in \
        result.error["message"]
    [rec] = records(result.run_id, store, "audit.note")
    assert rec["text"] == "checked" and rec["node"] == "note" and rec["visit"] == 1
    assert records(result.run_id, store, "node.completed") == []


def test_importing_interlock_does_not_import_the_agent_dependencies() -> None:
    code = ("import sys, interlock; interlock.Workflow; "
            "assert not {'openai', 'jinja2', 'jsonschema'} & set(sys.modules), sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the file ---------------------------------------------------------------------------

TOOLS = '''
def lookup_control(control_id: str, year: int) -> dict:
    """Look up a control."""
    return {"control": control_id, "tested": year >= 2024}

def untyped(x):
    return x
'''


@pytest.fixture
def wdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    mod = f"agent_tools_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(TOOLS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return tmp_path, mod


GOOD = """
workflow: audit
input: [plan]
nodes:
  risk:
    reads: [plan]
    agent:
      provider: scripted
      prompt: "Plan: {{{{ plan }}}}"
      output:
        type: object
        properties: {{level: {{enum: [LOW, HIGH]}}, reason: {{type: string}}}}
        required: [level, reason]
      tools: [{mod}:lookup_control]
      replies:
        - tool_calls: [{{name: lookup_control, arguments: {{control_id: C-1, year: 2025}}}}]
          usage: {{prompt_tokens: 20, completion_tokens: 5}}
        - content: {{level: HIGH, reason: tested but late}}
          usage: {{total_tokens: 30}}
  approval: {{approval: {{show: [risk]}}}}
edges:
  - {{from: START, to: risk}}
  - {{from: risk, switch: risk.level, cases: {{HIGH: approval}}, default: END}}
"""


def test_a_file_agent_runs_offline_from_the_command_line(wdir: tuple[Path, str]) -> None:
    path, mod = wdir
    (path / "wf.yaml").write_text(GOOD.format(mod=mod))
    run = CliRunner().invoke(cli, ["run", "wf.yaml", "--input", '{"plan": "p"}', "--json",
                                   "--store", f"sqlite:///{path}/runs.db"])
    assert run.exit_code == 3, run.output  # waiting at the approval gate the route chose
    out = json.loads(run.stdout)
    assert out["state"]["risk"] == {"level": "HIGH", "reason": "tested but late"}
    assert out["tokens"] == 55 and out["waiting"]["node"] == "approval"


BAD = """
workflow: bad
input: [plan]
nodes:
  risk:
    reads: [plan]
    agent:
      provider: openai
      modle: gpt-4o-mini
      prompt: "Plan: {{{{ plan }}}}"
  tools_node:
    reads: [plan]
    agent:
      model: gpt-4o-mini
      prompt: "{{{{ plan }}}} and {{{{ secret }}}}"
      output: {{type: objekt}}
      tools: [{mod}:untyped, {mod}:missing]
      max_turns: 0
  chooser:
    agent:
      provider: scripted
      replies: []
      prompt: "{{% if %}}"
      output: {{type: object, properties: {{next: {{enum: [tools_node, elsewhere]}}}}}}
      choose: next
edges:
  - {{from: START, to: risk}}
  - {{from: risk, to: tools_node}}
  - {{from: tools_node, to: chooser}}
"""


def test_agent_block_errors_name_their_lines(wdir: tuple[Path, str]) -> None:
    path, mod = wdir
    file = path / "bad.yaml"
    file.write_text(textwrap.dedent(BAD.format(mod=mod)).lstrip())
    with pytest.raises(WorkflowError) as info:
        interlock.load(file)
    found = [str(d) for d in info.value.diagnostics]
    expect = {
        8: "agent.modle: unknown key 'modle'",
        17: "agent.max_turns: Input should be greater than or equal to 1",
        22: "prompt is not a valid Jinja2 template",
        24: "no edge {from: chooser, choose: [...]}",
    }
    for line, text in expect.items():
        assert any(d.startswith(f"{file}:{line}:") and text in d for d in found), (line, found)
    # the blocks that failed to parse are checked further once they parse
    file.write_text(file.read_text().replace("max_turns: 0", "max_turns: 2")
                    .replace("modle: gpt-4o-mini", "temperature: 0.5"))
    with pytest.raises(WorkflowError) as info:
        interlock.load(file)
    found = [str(d) for d in info.value.diagnostics]
    expect = {
        6: "provider 'openai' needs 'model'",
        14: "prompt uses secret, which the node's reads: [plan] does not list",
        15: "output is not a valid JSON Schema",
        16: "parameter 'x' has no type annotation",
    }
    for line, text in expect.items():
        assert any(d.startswith(f"{file}:{line}:") and text in d for d in found), (line, found)
    assert any("does not import" in d and f"{mod}:missing" in d for d in found)
    validate = CliRunner().invoke(cli, ["validate", str(file)])
    assert validate.exit_code == 2 and f"{file}:14:" in validate.output


def test_choose_targets_are_checked_against_the_output_enum(wdir: tuple[Path, str]) -> None:
    path, _ = wdir
    file = path / "choose.yaml"
    file.write_text(textwrap.dedent("""
        workflow: c
        nodes:
          chooser:
            agent:
              provider: scripted
              replies: [{content: {next: done}}]
              prompt: Where next?
              output: {type: object, properties: {next: {enum: [done, elsewhere]}}}
              choose: next
          done: {agent: {provider: scripted, replies: [ok], prompt: hi}}
        edges:
          - {from: START, to: chooser}
          - {from: chooser, choose: [done]}
    """).lstrip())
    [d] = load_errors(file)
    assert d.startswith(f"{file}:9:") and "'elsewhere'" in d


def load_errors(file: Path) -> list[str]:
    """The error diagnostics loading ``file`` raises."""
    with pytest.raises(WorkflowError) as info:
        interlock.load(file)
    return [str(d) for d in info.value.diagnostics if d.severity == "error"]


def test_a_scripted_reply_of_the_wrong_shape_says_what_a_reply_is(
        wdir: tuple[Path, str]) -> None:
    path, _ = wdir
    file = path / "replies.yaml"
    file.write_text(textwrap.dedent("""
        workflow: r
        nodes:
          a:
            agent:
              provider: scripted
              replies: [{cause: disk full}]
              prompt: hi
        edges:
          - {from: START, to: a}
    """).lstrip())
    [d] = load_errors(file)
    assert "unknown key 'cause'; a scripted reply is {content: ..." in d


def test_a_template_in_model_is_an_error_not_a_literal_model_name(
        wdir: tuple[Path, str]) -> None:
    path, _ = wdir
    file = path / "model.yaml"
    file.write_text(textwrap.dedent("""
        workflow: m
        config: {model: gpt-4o}
        nodes:
          a:
            agent:
              model: "{{ config.model }}"
              prompt: hi
        edges:
          - {from: START, to: a}
    """).lstrip())
    [d] = load_errors(file)
    assert d.startswith(f"{file}:6:") and "model is a template" in d


def test_a_server_refusing_response_format_is_asked_again_without_it(
        llm: FakeOpenAI, store: str) -> None:
    llm.fail(400, "response_format json_schema is not supported by this server")
    llm.reply({"level": "LOW", "reason": "fine"})
    result = audit(llm).run_sync({"plan": "p"}, store=store)
    assert result.status == "COMPLETED", result.error
    assert result.state["risk"] == {"level": "LOW", "reason": "fine"}
    first, second = (r["body"] for r in llm.requests)
    assert "response_format" in first and "response_format" not in second


def test_other_bad_requests_are_not_retried_without_the_format(
        llm: FakeOpenAI, store: str) -> None:
    llm.fail(400, "model gpt-test does not exist")
    result = audit(llm).run_sync({"plan": "p"}, store=store)
    assert result.status == "FAILED" and "does not exist" in result.error["message"]
    assert len(llm.requests) == 1
