"""A local ``interlock chat`` sees what other processes do to its conversation: a gate
decided with ``interlock resume`` by a colleague (the decision, the turn that follows and
its reply shown while the person has typed nothing; their next message then answered,
not dropped with "a gate waits"), a message sent with ``interlock send``, and the closing
hint saying what the conversation waits for now. Real processes on a SQLite store."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import records
from test_chat import TOOLS
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

from interlock.cli import cli

ROOT = Path(__file__).resolve().parents[2]

CHAT = """
workflow: elsewhere-chat
chat: assistant
nodes:
  assistant:
    agent:
      provider: scripted
      replies:
        - {tool_calls: [{name: restart_service, arguments: {service: db}}]}
        - restarted it
        - kafka is fine
        - all green
      tools: [{call: {mod}:restart_service, confirm: true}]
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}


class Chat:
    """``interlock chat`` in a process of its own: lines written to its standard input,
    its output lines read by threads (`expect` waits for one, the deadline a failure)."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "interlock", "chat", *args], cwd=tmp_path,
            env=_env(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.seen: list[tuple[str, str]] = []
        for name in ("out", "err"):
            threading.Thread(target=self._read, args=(name,), daemon=True).start()

    def _read(self, name: str) -> None:
        stream = self.proc.stdout if name == "out" else self.proc.stderr
        assert stream is not None
        for line in stream:
            self.lines.put((name, line.rstrip("\n")))
        self.lines.put((name, None))  # (the stream ended)

    def type(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def expect(self, stream: str, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(s == stream and text in line for s, line in self.seen):
            left = deadline - time.monotonic()
            assert left > 0, f"never printed on std{stream}: {text!r}; got {self.seen}"
            try:
                name, line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is not None:
                self.seen.append((name, line))

    def end(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(60)
        ended = 0
        while ended < 2:  # what is left to read, until both streams end
            name, line = self.lines.get(timeout=30)
            if line is None:
                ended += 1
            else:
                self.seen.append((name, line))
        return code

    def err(self) -> str:
        return "\n".join(line for s, line in self.seen if s == "err")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])  # (data_version; LISTEN)
def test_a_gate_decided_elsewhere_and_a_message_sent_elsewhere_are_shown(
        kind: str, make_project: Any, tmp_path: Path, request: Any) -> None:
    p = make_project(TOOLS)
    store = p.store if kind == "sqlite" else request.getfixturevalue("pg_schema_url")
    wf = p.workflow(CHAT)
    assert CliRunner().invoke(cli, ["run", wf, "--run-id", "e1", "--store", store]
                              ).exit_code == 3
    chat = Chat(tmp_path, wf, "--session", "e1", "--store", store, "--by", "sam")
    try:
        chat.type("restart db")
        chat.expect("err", "waiting for a decision at assistant")
        # a colleague decides the gate from another terminal
        decided = _cli(tmp_path, "resume", "e1", "--gate", "assistant", "--approve",
                       "--by", "bob", "--store", store)
        assert decided.returncode == 3, decided.stderr
        # shown while sam has typed nothing (on the old code: never)
        chat.expect("err", "approved 'assistant' by bob")
        chat.expect("out", "restarted it")
        chat.type("why is kafka lagging?")  # (the old code: "a gate waits", dropped)
        chat.expect("out", "kafka is fine")
        sent = _cli(tmp_path, "send", "e1", "and now?", "--by", "bob", "--store", store)
        assert sent.returncode == 3, sent.stderr
        chat.expect("err", "bob (elsewhere): and now?")
        chat.expect("out", "all green")
        assert chat.end() == 3
    finally:
        chat.kill()
    err = chat.err()
    assert not any(line.startswith("a gate waits") for line in err.splitlines()), err
    # the closing hint says what it waits for now (the old code: "waits for a decision")
    assert "the conversation waits for the next message: interlock chat" in err, err
    assert [(r["text"], r["by"]) for r in records("e1", store, "chat.message")] == [
        ("restart db", "sam"), ("why is kafka lagging?", "sam"), ("and now?", "bob")]
    assert p.executions() == ["restart_service:start", "restart_service:done"]


def test_a_session_of_a_turn_killed_in_a_guarded_call_shows_its_unknown_outcome_once(
        make_project: Any, tmp_path: Path) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(CHAT)
    assert p.cli("run", wf, "--run-id", "e2").exit_code == 3
    assert p.cli("send", "e2", "restart db").exit_code == 3  # the guarded call's gate
    (tmp_path / "block").write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "interlock", "resume", "e2", "--gate",
                             "assistant", "--approve", "--store", p.store], cwd=tmp_path,
                            env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while p.executions() != ["restart_service:start"]:
            assert proc.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(30)
    (tmp_path / "block").unlink()
    chat = Chat(tmp_path, wf, "--session", "e2", "--store", p.store)
    try:
        assert chat.end() == 3
    finally:
        chat.kill()
    err = chat.err()
    assert "was interrupted during a turn: continuing that turn first" in err, err
    # (the old code printed the gate's block twice: from the continuation, then again)
    assert err.count("waiting for a decision at assistant") == 1, err
    assert err.count("OUTCOME UNKNOWN") == 1, err


SERVED_TOOLS = '''
def service_status(service: str) -> dict:
    """The status of a service."""
    return {"service": service, "status": "degraded"}
'''

SERVED_CHAT = """
workflow: served-chat
chat: assistant
nodes:
  assistant:
    agent:
      provider: scripted
      replies:
        - {tool_calls: [{name: service_status, arguments: {service: db}}]}
        - db is degraded
      tools: [servedtools_r41:service_status]
"""


def test_chat_through_a_server_needs_no_local_copy_of_the_tools_modules(
        tmp_path: Path, monkeypatch: Any) -> None:
    from test_server import Served

    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "chat.yaml").write_text(SERVED_CHAT)
    (tmp_path / "servedtools_r41.py").write_text(SERVED_TOOLS)  # the server's only
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    (laptop / "chat.yaml").write_text(SERVED_CHAT)
    server = Served(tmp_path)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "interlock", "chat", "chat.yaml", "--server", server.url],
            cwd=laptop, env={**os.environ, "PYTHONPATH": str(ROOT)}, input="status?\n",
            capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    # (the old code: exit 2, "call target 'servedtools_r41:service_status' does not
    # import", nothing sent)
    assert out.returncode == 3, out.stderr
    assert "does not import" not in out.stderr
    assert "warning" not in out.stderr, out.stderr  # the file is the server's definition
    assert "service_status" in out.stderr and "degraded" in out.stderr
    assert out.stdout.splitlines() == ["db is degraded"]


def test_of_two_messages_sent_at_once_the_loser_is_told_its_message_was_not_sent(
        make_project: Any, monkeypatch: Any) -> None:
    import interlock
    from interlock._ops import _messages

    p = make_project(TOOLS)
    wf = p.workflow(CHAT.replace("{tool_calls: [{name: restart_service, arguments: "
                                 "{service: db}}]}", "first reply"))
    assert p.cli("run", wf, "--run-id", "e3").exit_code == 3
    real = _messages.drive

    async def late(*args: Any, **kwargs: Any) -> Any:
        """The other sender's message taken between this one's read and its commit."""
        monkeypatch.setattr(_messages, "drive", real)
        await interlock.send("e3", "the other one", by="bob", store=p.store)
        return await real(*args, **kwargs)

    monkeypatch.setattr(_messages, "drive", late)
    out = p.cli("send", "e3", "mine", "--by", "sam")
    assert out.exit_code == 2, out.output
    # (the old code: "... this resume is refused": the sender sent no resume)
    assert "another message to run 'e3' was taken first" in out.stderr, out.stderr
    assert "yours was not sent and nothing was recorded: send it again" in out.stderr
    assert "resume" not in out.stderr
    assert [r["text"] for r in records("e3", p.store, "chat.message")] == ["the other one"]


BLOCKING_TOOLS = '''
import pathlib, time

def lookup(q: str) -> str:
    """Look something up."""
    with open("calls.log", "a") as f:
        f.write(f"lookup {q}\\n")
    while pathlib.Path("block").exists():   # the test kills the server here
        time.sleep(0.05)
    return f"found {q}"
'''

BLOCKING_CHAT = """
workflow: lost-chat
chat: a
nodes:
  a:
    agent:
      provider: scripted
      tools: [losttools_r41:lookup]
      replies:
        - {tool_calls: [{name: lookup, arguments: {q: one}}]}
        - looked it up
"""


def test_chat_through_a_server_that_dies_says_how_to_go_on_and_shows_the_reply_later(
        tmp_path: Path, monkeypatch: Any) -> None:
    from test_server import Served, events

    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "lost.yaml").write_text(BLOCKING_CHAT)
    (tmp_path / "losttools_r41.py").write_text(BLOCKING_TOOLS)
    (tmp_path / "block").write_text("")
    server = Served(tmp_path)
    chat = Chat(tmp_path, "flows/lost.yaml", "--server", server.url)
    try:
        chat.type("look it up")
        deadline = time.monotonic() + 60
        while not (tmp_path / "calls.log").exists():
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.05)
        server.proc.kill()  # the server dies mid-turn
        server.stop()
        # (the old code: "the event stream of run R broke: peer closed connection ...")
        chat.expect("err", "the connection to the server was lost while following "
                           "conversation")
        assert chat.end() == 2
    finally:
        chat.kill()
    err = chat.err()
    session = err.split("conversation ", 1)[1].split()[0]
    assert f"once the server is back, continue with `interlock chat flows/lost.yaml " \
           f"--session {session} --server {server.url}`" in err, err
    (tmp_path / "block").unlink()
    server = Served(tmp_path)  # takes the turn over and finishes it
    try:
        with server.client() as c:
            if c.get(f"/api/runs/{session}").json()["status"] != "WAITING_INPUT":
                for _ in events(c, session, params={"after": 1}, until="chat.reply"):
                    pass
        again = subprocess.run(
            [sys.executable, "-m", "interlock", "chat", "flows/lost.yaml", "--session",
             session, "--server", server.url], cwd=tmp_path, env=_env(tmp_path),
            input="", capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert again.returncode == 3, again.stderr
    # the reply the restarted server gave while no one followed (the old code: none)
    assert "the turn of message 1 was interrupted and continued by another process" in \
        again.stderr, again.stderr
    assert again.stdout.splitlines() == ["looked it up"]


PLAIN = """
workflow: plain-chat
chat: a
nodes:
  a:
    agent:
      provider: scripted
      replies: [{replies}]
"""


def test_chat_session_of_a_migrated_conversation_says_the_file_is_not_the_one_in_use(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    v1 = p.workflow(PLAIN.replace("{replies}", "one, two"), "v1.yaml")
    v2 = p.workflow(PLAIN.replace("{replies}", "uno, dos"), "v2.yaml")
    assert p.cli("run", v1, "--run-id", "e4").exit_code == 3
    same = CliRunner().invoke(cli, ["chat", v1, "--session", "e4", "--store", p.store],
                              input="", catch_exceptions=False)
    assert same.exit_code == 3 and "warning" not in same.stderr, same.stderr
    moved = p.cli("migrate", "e4", "--to", v2, "--by", "ops")
    assert moved.exit_code == 0, moved.output
    out = CliRunner().invoke(cli, ["chat", v1, "--session", "e4", "--store", p.store],
                             input="hi\n", catch_exceptions=False)
    assert out.exit_code == 3, out.output
    # (the old code: nothing said, though v2's definition answered)
    assert "warning: v1.yaml differs from the definition run e4 keeps (it was migrated " \
           "onto another definition)" in out.stderr, out.stderr
    assert "the run's definition is used" in out.stderr
    assert out.stdout.splitlines() == ["uno"]
    ok = CliRunner().invoke(cli, ["chat", v2, "--session", "e4", "--store", p.store],
                            input="", catch_exceptions=False)
    assert ok.exit_code == 3 and "warning" not in ok.stderr, ok.stderr


def test_a_turn_whose_executor_dies_while_the_chat_idles_is_continued_by_the_chat(
        make_project: Any, tmp_path: Path) -> None:
    p = make_project(BLOCKING_TOOLS)
    wf = p.workflow(BLOCKING_CHAT.replace("losttools_r41", "{mod}"))
    assert p.cli("run", wf, "--run-id", "e5").exit_code == 3
    chat = Chat(tmp_path, wf, "--session", "e5", "--store", p.store)
    try:
        chat.expect("err", "conversation e5 (")
        (tmp_path / "block").write_text("")
        sender = subprocess.Popen([sys.executable, "-m", "interlock", "send", "e5",
                                   "look it up", "--store", p.store], cwd=tmp_path,
                                  env=_env(tmp_path), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            chat.expect("err", "someone (elsewhere): look it up")
            deadline = time.monotonic() + 60
            while not (tmp_path / "calls.log").exists():
                assert time.monotonic() < deadline, "the tool never started"
                time.sleep(0.05)
            sender.kill()  # the process executing the turn dies mid-call
        finally:
            sender.kill()
            sender.wait(30)
        (tmp_path / "block").unlink()
        chat.expect("err", "was interrupted during a turn: continuing that turn first")
        chat.expect("out", "looked it up")
        assert chat.end() == 3
    finally:
        chat.kill()
    assert [r["reply"] for r in records("e5", p.store, "chat.reply")] == ["looked it up"]


def test_chat_through_a_server_shows_a_message_sent_elsewhere_with_its_sender(
        tmp_path: Path, monkeypatch: Any) -> None:
    from test_server import Served

    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "plain.yaml").write_text(PLAIN.replace("{replies}", "one, two"))
    server = Served(tmp_path)
    chat = Chat(tmp_path, "flows/plain.yaml", "--server", server.url, "--by", "sam")
    try:
        chat.type("hi")
        chat.expect("out", "one")
        session = chat.err().split("conversation ", 1)[1].split()[0]
        sent = _cli(tmp_path, "send", session, "from bob", "--by", "bob", "--server",
                    server.url)
        assert sent.returncode == 3, sent.stderr
        chat.expect("err", "bob (elsewhere): from bob")
        chat.expect("out", "two")
        assert chat.end() == 3
    finally:
        chat.kill()
        server.stop()
    assert "(elsewhere): hi" not in chat.err()  # its own message is not said again
