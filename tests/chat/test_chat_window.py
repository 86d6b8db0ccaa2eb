"""A conversation's turn reads only the window it sends (docs/semantics.md
"Conversations"): each turn journals a mark (its model calls, its messages, the reply),
and the next run of the visit replays only the turns whose messages are in the last
``history`` -- so a turn's cost does not grow with the conversation. What the model is
sent must be exactly what replaying the whole conversation sends: with snapshots taken
every few records, and after a SIGKILL in the middle of a late turn."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import CliProject, records
from fake_openai import FakeOpenAI
from test_chat import TOOLS, chat_file, killed_in_its_tool_call

from interlock._engine import _snapshot
from interlock.agents._chat import ChatAgent

MESSAGES = [f"message {i}" for i in range(8)]


def _script(fake: FakeOpenAI) -> FakeOpenAI:
    """The model's replies, in order: tool rounds in turns 1, 4 and 6."""
    for i in range(8):
        if i == 1:
            fake.reply(tool_calls=[("service_status", {"service": "db"})])
        if i == 4:
            fake.reply(tool_calls=[("service_status", {"service": "api"}),
                                   ("service_status", {"service": "web"})])
        if i == 6:
            fake.reply(tool_calls=[("restart_service", {"service": "db"})])
        fake.reply(f"answer {i}")
    return fake


def _sent(fake: FakeOpenAI) -> list[list[dict[str, Any]]]:
    return [r["body"]["messages"] for r in fake.requests]


def _project(make_project: Any) -> tuple[CliProject, str]:
    p: CliProject = make_project(TOOLS)
    wf = p.workflow(chat_file("gpt-test", history=3,
                              tools="['{mod}:service_status', '{mod}:restart_service']"))
    return p, wf


def _converse(p: CliProject, wf: str, run_id: str, fake: FakeOpenAI,
              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    assert p.cli("run", wf, "--run-id", run_id).exit_code == 3
    for text in MESSAGES:
        sent = p.cli("send", run_id, text)
        assert sent.exit_code == 3, sent.output


def test_the_window_from_the_marks_is_the_whole_replays_with_snapshots(
        make_project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    p, wf = _project(make_project)
    whole, marks = _script(FakeOpenAI()), _script(FakeOpenAI())
    try:
        # the whole conversation replayed each turn (as before the marks), no snapshots
        with monkeypatch.context() as m:
            m.setattr(ChatAgent, "_resume_point", lambda self, ctx: (0, 0, None))
            _converse(p, wf, "whole", whole, monkeypatch)
        # from the marks, with a snapshot every 4 records
        starts: list[int] = []
        point = ChatAgent._resume_point

        def spy(self: ChatAgent, ctx: Any) -> tuple[int, int, str | None]:
            found = point(self, ctx)
            starts.append(found[0])
            return found

        monkeypatch.setattr(ChatAgent, "_resume_point", spy)
        monkeypatch.setattr(_snapshot, "EVERY", 4)
        monkeypatch.setattr(_snapshot, "BYTES_PER_RECORD", 10**9)
        _converse(p, wf, "marks", marks, monkeypatch)
        assert _sent(marks) == _sent(whole)
        assert len(_sent(whole)) == 11
        # history: 3 -- the last three messages are turn 6's tool answer (its call fell
        # out of the window, so it is left out), its reply and message 7
        assert [(m["role"], m["content"]) for m in _sent(marks)[-1]] == [
            ("system", "You are the on-call assistant."), ("assistant", "answer 6"),
            ("user", "message 7")]
        assert max(starts) >= 5  # the late turns did not replay the early ones
        assert records("marks", p.store, "snapshot.taken")
        assert [r["reply"] for r in records("marks", p.store, "chat.reply")] == [
            f"answer {i}" for i in range(8)]
        assert p.cli("verify", "marks").exit_code == 0
    finally:
        whole.close()
        marks.close()


def test_after_a_sigkill_in_a_late_turn_the_context_is_the_same(
        make_project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    p, wf = _project(make_project)
    plain, crashed = _script(FakeOpenAI()), _script(FakeOpenAI())
    try:
        _converse(p, wf, "plain", plain, monkeypatch)
        monkeypatch.setenv("OPENAI_BASE_URL", crashed.url)
        assert p.cli("run", wf, "--run-id", "k").exit_code == 3
        for text in MESSAGES[:6]:
            assert p.cli("send", "k", text).exit_code == 3
        killed_in_its_tool_call(  # (plain's tool call, then k's)
            p, "k", MESSAGES[6], lambda: p.executions().count("restart_service:start") >= 2)
        resumed = p.cli("resume", "k")
        assert resumed.exit_code == 3, resumed.output
        assert p.cli("send", "k", MESSAGES[7]).exit_code == 3
        assert _sent(crashed) == _sent(plain)  # the model asked nothing twice, saw the same
        assert [r["reply"] for r in records("k", p.store, "chat.reply")] == [
            f"answer {i}" for i in range(8)]
        assert p.executions().count("restart_service:done") == 2  # plain's, then k's once
    finally:
        plain.close()
        crashed.close()
