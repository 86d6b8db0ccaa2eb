"""A turn's own limits fail the turn, not the conversation (docs/semantics.md
"Conversations"): ``max_turns`` exhausted in a turn is that turn's error -- recorded as its
``chat.reply {error}``, shown by ``send`` (exit 1) and ``interlock chat`` -- and the
conversation waits for the next message, whose turn has the whole context; the
conversation's own ``limits`` still end the run."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import CliProject, records
from fake_openai import FakeOpenAI
from test_chat import TOOLS, chat_file


def _project(make_project: Any, llm: FakeOpenAI) -> tuple[CliProject, str]:
    p: CliProject = make_project(TOOLS)
    text = chat_file("gpt-test", tools="['{mod}:service_status']").replace(
        "      tools:", "      max_turns: 2\n      tools:")
    return p, p.workflow(text)


def test_max_turns_fails_the_turn_and_the_next_message_gets_a_turn_with_the_context(
        make_project: Any, llm: FakeOpenAI, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.url)
    p, wf = _project(make_project, llm)
    # turn 1: the model asks for tools twice, over max_turns=2: the turn fails
    llm.reply(tool_calls=[("service_status", {"service": "db"})])
    llm.reply(tool_calls=[("service_status", {"service": "api"})])
    # turn 2: a reply
    llm.reply("db is degraded, as the status said")
    assert p.cli("run", wf, "--run-id", "m").exit_code == 3
    failed, data = p.cli_json("send", "m", "how is db?")
    assert failed.exit_code == 1, failed.output
    assert data["status"] == "WAITING_INPUT"  # the conversation goes on
    assert "max_turns=2" in data["waiting"]["show"]["turn_error"]
    plain = p.cli("status", "m")
    assert plain.exit_code == 3
    again = p.cli("send", "m", "and now?")
    assert again.exit_code == 3, again.output
    assert again.stdout.strip() == "db is degraded, as the status said"
    replies = records("m", p.store, "chat.reply")
    assert replies[0].get("reply") is None and "max_turns=2" in replies[0]["turn_error"]
    assert replies[1]["reply"] == "db is degraded, as the status said"
    assert "turn_error" not in replies[1]
    # the second turn's model saw the first message, the answered tool round, and not
    # the unanswered call the turn stopped at
    sent = llm.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[1]["content"] == "how is db?" and sent[-1]["content"] == "and now?"
    assert '"degraded"' in sent[3]["content"]
    assert p.executions() == ["service_status"]  # the failed turn's tool ran once
    assert len(llm.requests) == 3  # nothing asked again on the replays
    assert p.cli("send", "m", "/end").exit_code == 0
    assert p.cli("verify", "m").exit_code == 0


def test_interlock_chat_shows_a_failed_turn_and_goes_on(
        make_project: Any, llm: FakeOpenAI, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from interlock.cli import cli

    monkeypatch.setenv("OPENAI_BASE_URL", llm.url)
    p, wf = _project(make_project, llm)
    llm.reply(tool_calls=[("service_status", {"service": "db"})])
    llm.reply(tool_calls=[("service_status", {"service": "db"})])
    llm.reply("second answer")
    out = CliRunner().invoke(cli, ["chat", wf, "--store", p.store],
                             input="first\nsecond\n/end\n", catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert out.stdout == "second answer\n"
    assert "the turn failed:" in out.stderr and "max_turns=2" in out.stderr


def test_the_conversations_limits_still_end_it(make_project: Any, llm: FakeOpenAI,
                                               monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.url)
    p, wf = _project(make_project, llm)
    from pathlib import Path

    text = Path(wf if Path(wf).is_absolute() else p.root / wf).read_text()
    limited = text.replace("chat: assistant\n", "chat: assistant\nlimits: {tokens: 20}\n")
    wf2 = p.workflow(limited.replace("workflow: assistant-chat", "workflow: limited"),
                     "limited.yaml")
    llm.reply("one", usage=(15, 10))
    assert p.cli("run", wf2, "--run-id", "l").exit_code == 3
    over = p.cli("send", "l", "hello")
    assert over.exit_code == 1
    _, status = p.cli_json("status", "l")
    assert status["status"] == "FAILED"


def test_a_failed_turn_is_an_error_for_the_mcp_tool_and_the_conversation_goes_on(
        make_project: Any, llm: FakeOpenAI, monkeypatch: Any) -> None:
    pytest.importorskip("mcp_types")
    from interlock.mcp._conversation import turn_answer

    monkeypatch.setenv("OPENAI_BASE_URL", llm.url)
    p, wf = _project(make_project, llm)
    llm.reply(tool_calls=[("service_status", {"service": "db"})])
    llm.reply(tool_calls=[("service_status", {"service": "db"})])
    assert p.cli("run", wf, "--run-id", "t").exit_code == 3
    _, run = p.cli_json("send", "t", "how is db?")
    out, text, failed = turn_answer(run, "assistant")
    assert out["status"] == "WAITING_INPUT" and out["reply"] is None and failed
    assert "max_turns=2" in str(out["turn_error"]) and text.startswith("the turn failed: ")
