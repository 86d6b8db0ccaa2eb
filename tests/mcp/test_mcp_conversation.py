"""A conversation file served as an MCP tool ``{text, run_id?}``, driven by the MCP
SDK's own client: over stdio (``interlock mcp`` in a subprocess) and at ``/mcp`` of a
real ``interlock serve``. A conversation started and continued, its reply as structured
content and as text; a turn whose child run waits at a gate (decided elsewhere, or
through elicitation on both protocol generations); the refusals (an unknown run_id, a
run of another workflow, an ended conversation, a viewer's message), each recording
nothing."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_project import cli as _cli
from mcp_project import client, project, served, stdio_params
from test_server import TOKENS, Served

pytest.importorskip("mcp")

__all__ = ["project", "served"]  # the fixtures, used by name

import mcp_types as types
from mcp import Client

GATE = "assistant/run_triage/approval"


def _records(root: Path, run_id: str) -> list[dict[str, Any]]:
    traced = _cli(root, "trace", run_id, "--json")
    assert traced.returncode == 0, traced.stderr
    return list(json.loads(traced.stdout))


def _text(res: types.CallToolResult) -> str:
    block = res.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def test_the_conversation_tool_takes_text_and_run_id(project: Path) -> None:
    async def go() -> list[types.Tool]:
        async with Client(stdio_params(project)) as c:
            return (await c.list_tools()).tools

    tool = {t.name: t for t in anyio.run(go)}["talk"]
    assert tool.input_schema["required"] == ["text"]
    assert set(tool.input_schema["properties"]) == {"text", "run_id"}
    assert tool.description is not None
    assert tool.description.startswith("The on-call assistant.")


def test_a_conversation_started_continued_and_ended_over_stdio(project: Path) -> None:
    async def go() -> list[types.CallToolResult]:
        async with Client(stdio_params(project)) as c:
            first = await c.call_tool("talk", {"text": "hello"})
            run_id = first.structured_content["run_id"]  # type: ignore[index]
            answers = [first]
            # (the scripted model's second reply calls run_triage, whose gate waits)
            answers.append(await c.call_tool("talk", {"text": "triage db",
                                                      "run_id": run_id}))
            return answers

    first, gated = anyio.run(go)
    assert not first.is_error
    out = first.structured_content
    assert out is not None
    run_id = out["run_id"]
    assert out == {"run_id": run_id, "workflow": "talk", "status": "WAITING_INPUT",
                   "reply": "hi, how can I help?"}
    assert _text(first) == "hi, how can I help?"  # the reply as the result's text
    messages = [r for r in _records(project, run_id) if r["type"] == "chat.message"]
    assert [m["text"] for m in messages] == ["hello", "triage db"]
    assert messages[0]["by"].startswith("mcp:")

    # the turn reached the child's gate: answered at once, as a workflow's wait is
    waiting = gated.structured_content
    assert waiting is not None and not gated.is_error
    assert waiting["status"] == "WAITING_APPROVAL" and waiting["reply"] is None
    assert waiting["waiting"]["node"] == GATE
    assert waiting["decide"]["cli"].startswith(f"interlock resume {run_id}")
    decided = _cli(project, *shlex.split(waiting["decide"]["cli"])[1:], "--by", "alice")
    assert decided.returncode == 3, decided.stderr  # the conversation waits again

    async def more() -> list[types.CallToolResult]:
        async with Client(stdio_params(project)) as c:
            status = await c.call_tool("interlock_run_status", {"run_id": run_id})
            thanks = await c.call_tool("talk", {"text": "thanks", "run_id": run_id})
            end = await c.call_tool("talk", {"text": "/end", "run_id": run_id})
            return [status, thanks, end]

    status, thanks, end = anyio.run(more)
    assert status.structured_content is not None
    assert status.structured_content["waiting"]["show"]["last_reply"] == "triage done"
    assert thanks.structured_content == {"run_id": run_id, "workflow": "talk",
                                         "status": "WAITING_INPUT",
                                         "reply": "you are welcome"}
    assert end.structured_content is not None
    assert end.structured_content["status"] == "COMPLETED"
    assert end.structured_content["reply"] == "you are welcome"  # (the last one)
    assert _cli(project, "verify", run_id).returncode == 0


def test_refused_run_ids_record_nothing(project: Path) -> None:
    async def go() -> dict[str, types.CallToolResult]:
        async with Client(stdio_params(project)) as c:
            plain = await c.call_tool("plain", {"n": 1})
            talk = await c.call_tool("talk", {"text": "hello"})
            ended = talk.structured_content["run_id"]  # type: ignore[index]
            await c.call_tool("talk", {"text": "/end", "run_id": ended})
            return {
                "unknown": await c.call_tool("talk", {"text": "hi", "run_id": "nope-1"}),
                "other": await c.call_tool(
                    "talk", {"text": "hi",
                             "run_id": plain.structured_content["run_id"]}),  # type: ignore[index]
                "ended": await c.call_tool("talk", {"text": "hi", "run_id": ended}),
                "empty": await c.call_tool("talk", {"text": " "}),
                "ended_id": types.CallToolResult(content=[types.TextContent(
                    type="text", text=ended)]),
            }

    answers = anyio.run(go)
    for key in ("unknown", "other", "ended", "empty"):
        assert answers[key].is_error, key
    assert "there is no conversation 'nope-1' in this store" in _text(answers["unknown"])
    assert "call talk without run_id to start a new conversation" in _text(answers["unknown"])
    assert "is a run of 'plain', not a conversation of 'talk'" in _text(answers["other"])
    ended = _text(answers["ended_id"])
    assert f"the conversation {ended!r} has ended (COMPLETED)" in _text(answers["ended"])
    assert "text is missing or empty" in _text(answers["empty"])
    # nothing was recorded by the refusals: two runs, the ended one with its one message
    runs = json.loads(_cli(project, "runs", "--json").stdout)
    assert sorted(r["workflow"] for r in runs) == ["plain", "talk"]
    assert [r["text"] for r in _records(project, ended) if r["type"] == "chat.message"] == [
        "hello", "/end"]


def _approve(asked: list[str]) -> Any:
    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "approve"})
    return elicit


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_turns_gate_is_answered_through_elicitation(project: Path, mode: str) -> None:
    """legacy: elicitation/create mid-call; auto (2026-07-28): input_required, and the
    call again with the answer (which sends no second message)."""
    asked: list[str] = []

    async def go() -> types.CallToolResult:
        async with Client(stdio_params(project), mode=mode,  # type: ignore[arg-type]
                          elicitation_callback=_approve(asked)) as c:
            first = await c.call_tool("talk", {"text": "hello"})
            run_id = first.structured_content["run_id"]  # type: ignore[index]
            return await c.call_tool("talk", {"text": "triage db", "run_id": run_id})

    res = anyio.run(go)
    assert len(asked) == 1 and repr(GATE) in asked[0]
    out = res.structured_content
    assert out is not None and not res.is_error
    assert out["status"] == "WAITING_INPUT" and out["reply"] == "triage done"
    assert _text(res) == "triage done"
    records = _records(project, out["run_id"])
    assert [r["text"] for r in records if r["type"] == "chat.message"] == ["hello",
                                                                          "triage db"]
    called = [r for r in records if r["type"] == "tool.called"]
    assert called[0]["result"]["approval"]["decision"] == "approved"


def test_a_conversation_at_mcp_on_a_server(served: Served) -> None:
    """An operator talks; a viewer's message is refused and records nothing; an admin's
    client answers the turn's gate through elicitation."""
    asked: list[str] = []

    async def go() -> tuple[types.CallToolResult, types.CallToolResult,
                            types.CallToolResult]:
        async with client(served, "olga") as c:
            first = await c.call_tool("talk", {"text": "hello"})
        run_id = first.structured_content["run_id"]  # type: ignore[index]
        async with client(served, "vic") as c:
            refused = await c.call_tool("talk", {"text": "triage db", "run_id": run_id})
        async with client(served, "ada", elicitation_callback=_approve(asked)) as c:
            gated = await c.call_tool("talk", {"text": "triage db", "run_id": run_id})
        return first, refused, gated

    first, refused, gated = anyio.run(go)
    assert first.structured_content is not None
    run_id = first.structured_content["run_id"]
    assert first.structured_content["reply"] == "hi, how can I help?"
    assert refused.is_error
    assert "vic (roles: viewer) may not talk in conversations" in _text(refused)
    assert gated.structured_content == {"run_id": run_id, "workflow": "talk",
                                        "status": "WAITING_INPUT", "reply": "triage done"}
    assert len(asked) == 1
    with served.client(TOKENS["ada"][0]) as http:
        log = http.get(f"/api/runs/{run_id}/records").json()
    messages = [r.get("data", r) for r in log if r["type"] == "chat.message"]
    assert [(m["text"], m["by"]) for m in messages] == [("hello", "olga"),
                                                        ("triage db", "ada")]


TEAM_TALK = '''
workflow: team-talk
chat: assistant
input: [team]
nodes:
  assistant:
    agent:
      provider: scripted
      system: "You help the team {{ team }}."
      replies: [hello team, bye]
'''


def test_a_new_conversation_takes_the_files_input(project: Path) -> None:
    (project / "flows" / "team.yaml").write_text(TEAM_TALK)

    async def go() -> tuple[types.Tool, types.CallToolResult, types.CallToolResult,
                            types.CallToolResult]:
        async with Client(stdio_params(project)) as c:
            tool = {t.name: t for t in (await c.list_tools()).tools}["team-talk"]
            missing = await c.call_tool("team-talk", {"text": "hi"})
            first = await c.call_tool("team-talk", {"text": "hi", "input": {"team": "db"}})
            again = await c.call_tool("team-talk", {
                "text": "more", "input": {"team": "web"},
                "run_id": first.structured_content["run_id"]})  # type: ignore[index]
            return tool, missing, first, again

    tool, missing, first, again = anyio.run(go)
    assert set(tool.input_schema["properties"]) == {"text", "run_id", "input"}
    assert missing.is_error and "lacks 'team'" in _text(missing)
    assert first.structured_content is not None
    assert first.structured_content["reply"] == "hello team"
    run_id = first.structured_content["run_id"]
    shown = json.loads(_cli(project, "status", run_id, "--json").stdout)
    assert shown["state"]["team"] == "db"
    assert again.is_error and "input is for a new conversation" in _text(again)
    assert [r["text"] for r in _records(project, run_id) if r["type"] == "chat.message"] == [
        "hi"]


def test_two_messages_at_once_one_is_refused_for_people(project: Path) -> None:
    """Two clients (two ``interlock mcp`` processes on one store) send the next message
    of one conversation at once: one turn runs, the other message is refused with what
    to do, and only one is recorded."""
    async def start() -> str:
        async with Client(stdio_params(project)) as c:
            first = await c.call_tool("talk", {"text": "hello"})
            return str(first.structured_content["run_id"])  # type: ignore[index]

    run_id = anyio.run(start)

    async def both() -> list[types.CallToolResult]:
        answers: list[types.CallToolResult] = []

        async def send(text: str) -> None:
            async with Client(stdio_params(project)) as c:
                answers.append(await c.call_tool("talk", {"text": text, "run_id": run_id}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "one")
            tg.start_soon(send, "two")
        return answers

    answers = anyio.run(both)
    refused = [a for a in answers if a.is_error]
    assert len(refused) == 1, [_text(a) for a in answers]
    why = _text(refused[0])
    assert why.startswith(f"the message to run {run_id!r} is refused and nothing was "
                          "recorded") or why.startswith(
        f"the message to conversation {run_id!r} is refused and nothing was recorded"), why
    assert "store refused" not in why
    texts = [r["text"] for r in _records(project, run_id) if r["type"] == "chat.message"]
    assert texts[0] == "hello" and len(texts) == 2


SHORT_TALK = '''
workflow: short-talk
chat: assistant
nodes:
  assistant:
    agent:
      provider: scripted
      system: You check services.
      max_turns: 1
      tools: ["ttools:service_status"]
      replies:
        - {tool_calls: [{name: service_status, arguments: {service: db}}]}
        - db is fine
'''

TTOOLS = '''
def service_status(service: str) -> str:
    """The status of a service."""
    return f"{service} is fine"
'''


def test_a_turn_over_its_own_limit_is_an_error_and_the_conversation_goes_on(
        project: Path) -> None:
    (project / "flows" / "short.yaml").write_text(SHORT_TALK)
    (project / "ttools.py").write_text(TTOOLS)

    async def go() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with Client(stdio_params(project)) as c:
            failed = await c.call_tool("short-talk", {"text": "how is db?"})
            run_id = failed.structured_content["run_id"]  # type: ignore[index]
            return failed, await c.call_tool("short-talk", {"text": "and now?",
                                                            "run_id": run_id})

    failed, then = anyio.run(go)
    assert failed.is_error
    out = failed.structured_content
    assert out is not None and out["status"] == "WAITING_INPUT" and out["reply"] is None
    assert "max_turns=1" in out["turn_error"]
    assert _text(failed).startswith("the turn failed:")
    assert not then.is_error and then.structured_content is not None
    assert then.structured_content["status"] == "WAITING_INPUT"
    assert then.structured_content["reply"] == "db is fine"
