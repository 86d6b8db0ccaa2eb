"""Agents and humans beyond yes/no (SPEC §7): a guarded tool call edited by a human
(``modify {"arguments": ...}``), a rejection's comment passed to the model, tools that
hand off with ``interlock.goto``, and tool errors returned to the model.

The OpenAI path is the real SDK talking HTTP to the local OpenAI-compatible test server
(tests/fake_openai.py); the scripted provider runs the rest offline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_openai import FakeOpenAI

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
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    fake = FakeOpenAI()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def store(tmp_path: Path) -> str:
    CALLS.clear()
    return f"sqlite:///{tmp_path}/runs.db"


def trace(run_id: str, store: str) -> list[dict[str, Any]]:
    return asyncio.run(interlock.trace(run_id, store=store))


def records(run_id: str, store: str, rtype: str) -> list[dict[str, Any]]:
    return [r for r in trace(run_id, store) if r["type"] == rtype]


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
