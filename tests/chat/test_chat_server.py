"""Conversations through a real ``interlock serve`` on loopback (SPEC §11): messages over
HTTP, the reply streamed to an event-stream subscriber token by token from a local
OpenAI-compatible server that streams, a child gate decided through the API by its path,
``interlock send --server``."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from _harness import write_auth, write_folder
from _workflows import OPENAI_CHAT, RECORD_NODES, toolchat, triage
from click.testing import CliRunner
from fake_openai import FakeOpenAI
from test_server import Served, events, wait_status

from interlock.cli import cli

CHAT = OPENAI_CHAT
TRIAGE = triage("chatnodes:record")
TOOLCHAT = toolchat("triage approved")
NODES = RECORD_NODES


def chat_project(root: Path, toolchat: str = TOOLCHAT) -> Path:
    """``root`` as a served folder: the conversations ``chat`` and ``toolchat`` (the
    latter's child ``triage``) in ``flows/``, their node module ``chatnodes``."""
    return write_folder(root, {"chatnodes": NODES},
                        {"chat": CHAT, "triage": TRIAGE, "toolchat": toolchat})


def started(c: Any, run_id: str) -> None:
    """``run_id`` of ``toolchat`` started through the API, waiting for its first message."""
    assert c.post("/api/workflows/toolchat/runs",
                  json={"input": {}, "run_id": run_id}).status_code == 201
    wait_status(c, run_id, "WAITING_INPUT")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    return chat_project(tmp_path)


def _answer(body: dict[str, Any]) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    if len(users) >= 3:
        return f"Earlier you said: {users[0]}"
    return f"Noted message number {len(users)} for you"


def test_three_turns_over_http_with_the_reply_streamed_token_by_token(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeOpenAI(_answer)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    server = Served(project)
    try:
        with server.client() as c:
            r = c.post("/api/workflows/chat/runs", json={"input": {}, "run_id": "c1"})
            assert r.status_code == 201, r.text
            # (the run starts in the server: follow it to its first wait for a message)
            run = wait_status(c, "c1", "WAITING_INPUT")
            assert run["waiting"]["kind"] == "message"
            # a subscriber follows the run from here; the model's server streams its
            # first word, then waits until the subscriber has seen it
            after = len(c.get("/api/runs/c1/records").json())
            gate = threading.Event()
            fake.stream_gate = gate
            seen: list[dict[str, Any]] = []

            def subscribe() -> None:
                with server.client() as s:
                    for ev in events(s, "c1", params={"after": after}, until="run.waiting"):
                        seen.append(ev)
                        if ev["event"] == "chat.token":
                            gate.set()

            reader = threading.Thread(target=subscribe)
            reader.start()
            sent = c.post("/api/runs/c1/messages", json={"text": "db-7 is down", "by": "al"})
            assert sent.status_code == 202, sent.text
            reader.join(60)
            assert not reader.is_alive()
            assert fake.gate_waited is True  # the first word reached the subscriber live
            kinds = [e["event"] for e in seen]
            tokens = [e["data"]["text"] for e in seen if e["event"] == "chat.token"]
            assert len(tokens) == 6
            assert "".join(tokens) == "Noted message number 1 for you"
            assert kinds.index("chat.token") < kinds.index("chat.reply")
            assert all("id" not in e for e in seen if e["event"] == "chat.token")
            assert fake.requests[-1]["body"]["stream"] is True
            fake.stream_gate = None
            for text in ("and the api?", "what broke first?"):
                assert c.post("/api/runs/c1/messages", json={"text": text}).status_code == 202
                for _ in events(c, "c1", params={"after": len(
                        c.get("/api/runs/c1/records").json()) - 1}, until="run.waiting"):
                    pass
            run = c.get("/api/runs/c1").json()
            assert run["status"] == "WAITING_INPUT"
            assert run["waiting"]["show"]["last_reply"] == "Earlier you said: db-7 is down"
            last = [m["content"] for m in fake.requests[-1]["body"]["messages"]]
            assert last[1:] == ["db-7 is down", "Noted message number 1 for you",
                                "and the api?", "Noted message number 2 for you",
                                "what broke first?"]
            # a gate-less conversation is not in the approvals inbox
            assert c.get("/api/approvals").json() == []
            ended = c.post("/api/runs/c1/messages", json={"text": "/end"})
            assert ended.status_code == 202
            list(events(c, "c1", params={"after": 0}, until="run.completed"))
            before = c.get("/api/runs/c1/records").json()
            refused = c.post("/api/runs/c1/messages", json={"text": "still there?"})
            assert refused.status_code == 409
            assert "nothing was recorded" in refused.json()["detail"]
            assert c.get("/api/runs/c1/records").json() == before
    finally:
        server.stop()
        fake.close()


def test_a_workflow_tool_gate_decided_through_the_api_and_send_through_the_server(
        project: Path) -> None:
    server = Served(project)
    try:
        with server.client() as c:
            assert c.post("/api/workflows/toolchat/runs",
                          json={"input": {}, "run_id": "t1"}).status_code == 201
            runner = CliRunner()
            out = runner.invoke(cli, ["send", "t1", "triage db", "--server", server.url,
                                      "--json"], catch_exceptions=False)
            assert out.exit_code == 3, out.output
            run = c.get("/api/runs/t1").json()
            assert run["status"] == "WAITING_APPROVAL"
            assert run["waiting"]["node"] == "assistant/run_triage/approval"
            refused = c.post("/api/runs/t1/messages", json={"text": "hello?"})
            assert refused.status_code == 409
            d = c.post("/api/runs/t1/decisions", json={
                "decision": "approve", "by": "alice",
                "node": "assistant/run_triage/approval"})
            assert d.status_code == 200, d.text
            list(events(c, "t1", params={"after": 0}, until="run.waiting"))
            records = c.get("/api/runs/t1/records").json()
            waits = [r for r in records if r["type"] == "run.waiting"]
            while waits[-1]["waiting"]["kind"] != "message":
                list(events(c, "t1", params={"after": records[-1]["seq"]},
                            until="run.waiting"))
                records = c.get("/api/runs/t1/records").json()
                waits = [r for r in records if r["type"] == "run.waiting"]
            run = c.get("/api/runs/t1").json()
            assert run["status"] == "WAITING_INPUT"
            assert run["waiting"]["show"]["last_reply"] == "triage approved"
            called = [r for r in records if r["type"] == "tool.called"]
            assert called[0]["result"]["approval"]["decision"] == "approved"
            assert called[0]["result"]["approval"]["by"] == "alice"
    finally:
        server.stop()


def test_under_auth_a_message_is_the_operators_and_by_is_the_tokens_name(
        project: Path) -> None:
    from test_server import TOKENS

    write_auth(project, TOKENS)
    (project / "flows" / "plain.yaml").write_text(textwrap.dedent("""
        workflow: plain
        chat: assistant
        nodes:
          assistant: {agent: {provider: scripted, replies: [hello olga]}}
        """))
    server = Served(project, "--auth", "auth.yaml")
    try:
        with server.client("tok-olga") as olga, server.client("tok-vic") as vic, \
                server.client("tok-alice") as alice:
            assert olga.post("/api/workflows/plain/runs",
                             json={"input": {}, "run_id": "p1"}).status_code == 201
            wait_status(olga, "p1", "WAITING_INPUT")
            count = len(olga.get("/api/runs/p1/records").json())
            for who in (vic, alice):  # a viewer, an approver: not an operator's to send
                refused = who.post("/api/runs/p1/messages", json={"text": "hi"})
                assert refused.status_code == 403, refused.text
            assert len(olga.get("/api/runs/p1/records").json()) == count
            sent = olga.post("/api/runs/p1/messages", json={"text": "hi", "by": "mallory"})
            assert sent.status_code == 202
            list(events(olga, "p1", params={"after": count}, until="run.waiting"))
            message = next(r for r in olga.get("/api/runs/p1/records").json()
                           if r["type"] == "chat.message")
            assert message["by"] == "olga"
    finally:
        server.stop()


def test_interlock_chat_through_a_server(project: Path) -> None:
    (project / "flows" / "plain.yaml").write_text(textwrap.dedent("""
        workflow: plain
        chat: assistant
        nodes:
          assistant: {agent: {provider: scripted, replies: [hi there, bye now]}}
        """))
    server = Served(project)
    try:
        out = CliRunner().invoke(cli, ["chat", str(project / "flows" / "plain.yaml"),
                                       "--server", server.url],
                                 input="hello\nthanks\n/end\n", catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert out.stdout.splitlines() == ["hi there", "bye now"]
        session = out.stderr.split("conversation ", 1)[1].split()[0]
        with server.client() as c:
            assert c.get(f"/api/runs/{session}").json()["status"] == "COMPLETED"
    finally:
        server.stop()


def test_hints_after_a_server_command_carry_server(project: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A follow-up command printed after ``--server`` reaches the same server (a user
    copying it without ``--server`` would look in a local store): the decide-with hint of
    ``send --server`` (pasted, it decides the gate through the server), and the truncated
    state's ``status --json``."""
    import shlex

    monkeypatch.delenv("INTERLOCK_SERVER", raising=False)
    monkeypatch.delenv("INTERLOCK_TOKEN", raising=False)
    (project / "bignodes.py").write_text("def big(state):\n    return {'text': 'z' * 2000}\n")
    (project / "flows" / "big.yaml").write_text(textwrap.dedent("""
        workflow: big
        nodes:
          make: {call: "bignodes:big"}
        edges:
          - {from: START, to: make}
          - {from: make, to: END}
        """))
    server = Served(project)
    try:
        with server.client() as c:
            started(c, "h1")
            assert c.post("/api/workflows/big/runs",
                          json={"input": {}, "run_id": "b1"}).status_code == 201
            wait_status(c, "b1", "COMPLETED")
        runner = CliRunner()
        sent = runner.invoke(cli, ["send", "h1", "triage db", "--server", server.url],
                             catch_exceptions=False)
        assert sent.exit_code == 3, sent.output
        hint = (f"decide with: interlock resume h1 --gate assistant/run_triage/approval "
                f"--approve --server {server.url} (or --reject)")
        assert hint in sent.stderr.splitlines()
        command = hint.removeprefix("decide with: ").removesuffix(" (or --reject)")
        refused = runner.invoke(cli, ["send", "h1", "hello?", "--server", server.url],
                                catch_exceptions=False)
        assert refused.exit_code == 2
        assert f"Decide with: {command} (or --reject)" in refused.output
        decided = runner.invoke(cli, shlex.split(command)[1:], catch_exceptions=False)
        assert decided.exit_code == 3, decided.output  # through the server: it waits again
        assert f"interlock send h1 TEXT --server {server.url}" in decided.output
        status = runner.invoke(cli, ["status", "b1", "--server", server.url],
                               catch_exceptions=False)
        line = next(x for x in status.stdout.splitlines() if x.startswith("state: "))
        shown = f"interlock status b1 --json --server {server.url}"
        assert line.endswith(f"(`{shown}` prints all of it)"), line
        whole = runner.invoke(cli, shlex.split(shown)[1:], catch_exceptions=False)
        assert json.loads(whole.stdout)["state"] == {"text": "z" * 2000}
        # `interlock chat --server` whose input ends at a gate: how to decide it, there
        with server.client() as c:
            started(c, "h2")
        talk = runner.invoke(cli, ["chat", "flows/toolchat.yaml", "--session", "h2",
                                   "--server", server.url], input="triage db\n",
                             catch_exceptions=False)
        assert talk.exit_code == 3, talk.output
        assert (f"decide with: interlock resume h2 --gate assistant/run_triage/approval "
                f"--approve --server {server.url} (or --reject); or continue here: "
                f"interlock chat flows/toolchat.yaml --session h2 --server {server.url}") \
            in talk.stderr.splitlines()[-1]
    finally:
        server.stop()
