"""A conversation's messages are counted from 1 wherever a person reads the number:
``status`` ("waiting for message 3"), the progress lines ("turn 2"), the chat, and
``trace`` -- whose lines say "message 1 by sam: ..." and "reply to message 1: ..." though
the records' ``message`` field (and a request's ``show.turn``) count from 0, as stored."""

from __future__ import annotations

import re
from typing import Any

from conftest import records


def test_trace_and_status_count_a_conversations_messages_alike(make_project: Any) -> None:
    p = make_project("")
    wf = p.workflow("""
        workflow: counted-chat
        chat: a
        nodes:
          a:
            agent:
              provider: scripted
              replies: [one, two]
        """)
    assert p.cli("run", wf, "--run-id", "m1").exit_code == 3
    assert p.cli("send", "m1", "hello", "--by", "sam").exit_code == 3
    assert p.cli("send", "m1", "again").exit_code == 3
    assert [r["message"] for r in records("m1", p.store, "chat.message")] == [0, 1]  # stored
    status = p.cli("status", "m1")
    assert "waiting for message 3 of the conversation" in status.output, status.output
    trace = p.cli("trace", "m1")
    assert trace.exit_code == 0, trace.output
    lines = [re.sub(r"^\s*\d+\s+\+\S+ \S+\s+", "", line).split(None, 2)
             for line in trace.stdout.splitlines()]
    said = [(kind, detail) for kind, _, detail in (x for x in lines if len(x) == 3)
            if kind in ("chat.message", "chat.reply", "run.waiting")]
    # (the old code: '{"message": 0, "text": "hello"}', and "for a decision at 'a'")
    assert said == [
        ("run.waiting", "for message 1 of the conversation"),
        ("chat.message", 'message 1 by sam: "hello"'),
        ("chat.reply", 'reply to message 1: "one"'),
        ("run.waiting", "for message 2 of the conversation"),
        ("chat.message", 'message 2: "again"'),
        ("chat.reply", 'reply to message 2: "two"'),
        ("run.waiting", "for message 3 of the conversation")], trace.stdout
    assert "asks for message 3 of the conversation" in trace.stdout
