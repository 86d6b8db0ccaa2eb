"""``interlock chat --server`` as a person uses it: a real ``interlock serve``
on loopback, the CLI in its own process reading lines from a pipe, the reply printed as
the server's ``chat.token`` events arrive, a child run's gate shown and decided inline,
and the rest of the turn after a decision streamed to the run's event stream."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _harness import write_auth
from _workflows import openai_chat, run_triage, toolchat
from fake_openai import FakeOpenAI
from test_chat_server import chat_project, started  # the same conversations
from test_server import TOKENS, Served, events, pythonpath, wait_status

TOOLCHAT = toolchat("the triage of db is approved and done", run_triage("api"),
                    "the triage of api was refused")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    monkeypatch.delenv("INTERLOCK_SERVER", raising=False)
    monkeypatch.delenv("INTERLOCK_TOKEN", raising=False)
    return chat_project(tmp_path, TOOLCHAT)


class Chat:
    """``interlock chat FILE --server URL`` in its own process, its stdin a pipe."""

    def __init__(self, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "interlock", "chat", *args], cwd=root,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": pythonpath(root), "NO_COLOR": "1"})
        self.out = b""
        self.err: list[str] = []
        self.errors = threading.Condition()
        self.reader = threading.Thread(target=self._errors, daemon=True)
        self.reader.start()

    def _errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.errors:
                self.err.append(line.decode())
                self.errors.notify_all()

    def stderr_has(self, text: str, timeout: float = 60) -> str:
        """Wait until a line of stderr holds ``text`` (the process's own pace)."""
        with self.errors:
            assert self.errors.wait_for(lambda: any(text in x for x in self.err), timeout), \
                f"no {text!r} on stderr: {''.join(self.err)}"
        return next(x for x in self.err if text in x)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read_until(self, text: str, timeout: float = 60) -> str:
        """stdout as it comes, byte by byte, until it holds ``text`` (no newline needed:
        a streamed reply's first word is printed before its line ends)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while text.encode() not in self.out:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            assert ready, f"no {text!r} on stdout in {timeout} s: {self.out!r}"
            byte = os.read(self.proc.stdout.fileno(), 1)
            assert byte, f"stdout ended before {text!r}: {self.out!r}; {''.join(self.err)}"
            self.out += byte
        return self.out.decode()

    def finish(self, timeout: float = 60) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.out += self.proc.stdout.read()
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)
        self.reader.join(60)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def test_chat_through_a_server_prints_the_reply_as_its_tokens_arrive(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the model's server sends the first word, then holds the rest until the test has
    # seen that word on the CLI's stdout: the CLI can only print it from a chat.token
    # event (the reply's record is not written before the rest is sent)
    fake = FakeOpenAI(lambda body: "db-7 is down since noon")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    server = Served(project)
    gate = threading.Event()
    fake.stream_gate = gate
    chat = Chat(project, "flows/chat.yaml", "--server", server.url)
    try:
        session = chat.stderr_has("conversation ").split("conversation ", 1)[1].split()[0]
        chat.send("what is down?")
        assert chat.read_until("db-7 ").endswith("db-7 ")
        assert "since" not in chat.out.decode()  # the rest is still held by the model
        gate.set()
        chat.read_until("since noon\n")
        chat.send("/end")
        assert chat.finish() == 0, "".join(chat.err)
        assert fake.gate_waited is True
        assert chat.out.decode() == "db-7 is down since noon\n"  # streamed, printed once
        assert fake.requests[0]["body"]["stream"] is True
        with server.client() as c:
            assert c.get(f"/api/runs/{session}").json()["status"] == "COMPLETED"
    finally:
        gate.set()
        chat.close()
        server.stop()
        fake.close()


def test_chat_through_a_server_decides_a_child_runs_gate_inline(project: Path) -> None:
    server = Served(project)
    chat = Chat(project, "flows/toolchat.yaml", "--server", server.url, "--by", "alice")
    try:
        session = chat.stderr_has("conversation ").split("conversation ", 1)[1].split()[0]
        chat.send("triage db")
        chat.stderr_has("> child run ")
        shown = chat.stderr_has("waiting for a decision at assistant/run_triage/approval")
        assert '"checked": "db"' in shown
        chat.send("is it done?")  # not a decision: the gate still waits
        chat.stderr_has("a gate waits: /approve")
        chat.send("/approve looks right")
        chat.read_until("the triage of db is approved and done\n")
        chat.send("triage api")
        chat.stderr_has("waiting for a decision at assistant/run_triage/approval: "
                        '{"checked": "api"}')
        chat.send("/reject not now")
        chat.read_until("the triage of api was refused\n")
        chat.send("/end")
        assert chat.finish() == 0, "".join(chat.err)
        assert chat.out.decode() == ("the triage of db is approved and done\n"
                                     "the triage of api was refused\n")
        with server.client() as c:
            records = c.get(f"/api/runs/{session}/records").json()
        called = [r for r in records if r["type"] == "tool.called"]
        assert [r["result"]["approval"]["decision"] for r in called if "result" in r] == [
            "approved"]
        assert called[0]["result"]["approval"]["by"] == "alice"
        assert called[0]["result"]["approval"]["comment"] == "looks right"
        assert "rejected" in json.dumps(called[1])
    finally:
        chat.close()
        server.stop()


def test_the_rest_of_a_turn_after_a_decision_streams_on_the_event_stream(
        project: Path) -> None:
    server = Served(project)
    try:
        with server.client() as c:
            started(c, "d1")
            assert c.post("/api/runs/d1/messages", json={"text": "triage db"}
                          ).status_code == 202
            wait_status(c, "d1", "WAITING_APPROVAL")
            last = c.get("/api/runs/d1/records").json()[-1]["seq"]
            seen: list[dict[str, Any]] = []
            subscribed = threading.Event()

            def subscribe() -> None:
                with server.client() as s:
                    for ev in events(s, "d1", params={"after": last - 1}):
                        subscribed.set()
                        seen.append(ev)
                        if ev["event"] == "run.waiting" and int(ev["id"]) > last:
                            return

            reader = threading.Thread(target=subscribe)
            reader.start()
            assert subscribed.wait(60)
            d = c.post("/api/runs/d1/decisions", json={
                "decision": "approve", "node": "assistant/run_triage/approval"})
            assert d.status_code == 200, d.text
            reader.join(60)
            assert not reader.is_alive()
            kinds = [e["event"] for e in seen]
            tokens = [e["data"]["text"] for e in seen if e["event"] == "chat.token"]
            assert "".join(tokens) == "the triage of db is approved and done"
            assert kinds.index("approval.decided") < kinds.index("chat.token") \
                < kinds.index("chat.reply")
    finally:
        server.stop()


def test_chat_through_a_server_with_a_token(project: Path) -> None:
    write_auth(project, TOKENS)
    server = Served(project, "--auth", "auth.yaml")
    try:
        refused = Chat(project, "flows/toolchat.yaml", "--server", server.url)
        assert refused.finish() == 2
        refused.close()
        assert "requires a token" in "".join(refused.err)
        chat = Chat(project, "flows/toolchat.yaml", "--server", server.url,
                    "--token", "tok-ada")
        session = chat.stderr_has("conversation ").split("conversation ", 1)[1].split()[0]
        chat.send("triage db")
        chat.stderr_has("waiting for a decision at assistant/run_triage/approval")
        chat.send("/approve")
        chat.read_until("approved and done\n")
        assert chat.finish() == 3  # standard input ended: the conversation waits
        chat.close()
        with server.client("tok-ada") as c:
            records = c.get(f"/api/runs/{session}/records").json()
        message = next(r for r in records if r["type"] == "chat.message")
        assert message["by"] == "ada"
        decided = [r for r in records if r["type"] == "approval.decided"
                   and r.get("kind") != "message"]
        assert decided and decided[0]["by"] == "ada"
    finally:
        server.stop()


def test_local_chat_streams_the_rest_of_a_turn_after_an_inline_approval(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the model asks for the workflow tool, whose child run reaches a gate; after
    # /approve the model's final reply is held after its first word until the test has
    # seen that word: the local `interlock chat` streams the turn a decision resumed
    fake = FakeOpenAI(lambda body: "triage of db finished cleanly")
    fake.reply(tool_calls=[("run_triage", {"service": "db"})])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    (project / "flows" / "ochat.yaml").write_text(openai_chat(
        "ochat", "tools: [{workflow: triage.yaml, name: run_triage, description: Sweep one}]"))
    gate = threading.Event()
    chat = Chat(project, "flows/ochat.yaml", "--store", f"sqlite:///{project / 'runs.db'}")
    try:
        chat.stderr_has("conversation ")
        chat.send("triage db")
        chat.stderr_has("waiting for a decision at assistant/run_triage/approval")
        fake.stream_gate = gate
        chat.send("/approve")
        chat.read_until("triage ")
        assert "finished" not in chat.out.decode()
        gate.set()
        chat.read_until("cleanly\n")
        chat.send("/end")
        assert chat.finish() == 0, "".join(chat.err)
        assert fake.gate_waited is True
        assert chat.out.decode() == "triage of db finished cleanly\n"
    finally:
        gate.set()
        chat.close()
        fake.close()


def test_chat_through_a_server_continues_a_session_at_its_gate(project: Path) -> None:
    server = Served(project)
    try:
        with server.client() as c:
            started(c, "s1")
            assert c.post("/api/runs/s1/messages", json={"text": "triage db"}
                          ).status_code == 202
            wait_status(c, "s1", "WAITING_APPROVAL")
        chat = Chat(project, "flows/toolchat.yaml", "--server", server.url, "--session", "s1")
        try:
            # the gate it waits at is shown again; the earlier records are not
            chat.stderr_has("waiting for a decision at assistant/run_triage/approval")
            chat.send("/approve")
            chat.read_until("the triage of db is approved and done\n")
            assert chat.finish() == 3, "".join(chat.err)  # stdin ended: it waits
            assert chat.out.decode() == "the triage of db is approved and done\n"
            assert not any("> child run" in line for line in chat.err)
        finally:
            chat.close()
    finally:
        server.stop()


def test_a_gate_decided_elsewhere_shows_the_reply_without_a_keystroke(project: Path) -> None:
    server = Served(project)
    chat = Chat(project, "flows/toolchat.yaml", "--server", server.url)
    try:
        session = chat.stderr_has("conversation ").split("conversation ", 1)[1].split()[0]
        chat.send("triage db")
        chat.stderr_has("waiting for a decision at assistant/run_triage/approval")
        with server.client() as c:  # decided from the API (the dashboard's way)
            d = c.post(f"/api/runs/{session}/decisions", json={
                "decision": "approve", "by": "bob", "node": "assistant/run_triage/approval"})
            assert d.status_code == 200, d.text
        chat.read_until("the triage of db is approved and done\n")  # no line was typed
        chat.send("/end")
        assert chat.finish() == 0, "".join(chat.err)
    finally:
        chat.close()
        server.stop()
