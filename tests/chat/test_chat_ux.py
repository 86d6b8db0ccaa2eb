"""What a person meets in ``interlock chat`` and ``send`` (the new-user review's findings):
a session whose turn was interrupted, slash commands that are not commands, a session of
another workflow, a message to a run that is not a conversation -- locally and through a
real ``interlock serve``."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

from _harness import interlock_process, wait_for
from _workflows import kchat, tool_call
from click.testing import CliRunner
from conftest import records
from test_server import Served, wait_status

from interlock.cli import cli

TOOLS = '''
import pathlib, time

def lookup(q: str) -> str:
    """Look something up."""
    with open("calls.log", "a") as f:
        f.write(f"lookup {q}\\n")
    while pathlib.Path("block").exists():   # the test kills the process here
        time.sleep(0.05)
    return f"found {q}"
'''

CHAT = kchat("[{mod}:lookup]", tool_call("lookup", q="one"), "looked it up", "second answer",
             "third answer")

GATES = """
workflow: gates
nodes:
  legal: {approval: {show: []}}
edges:
  - {from: START, to: legal}
  - {from: legal, to: END}
"""


def _chat(p: Any, wf: str, text: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["chat", wf, "--store", p.store, *args], input=text,
                              catch_exceptions=False)


def test_chat_session_continues_a_turn_whose_process_was_killed_then_takes_the_message(
        make_project: Any, tmp_path: Path) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(CHAT)
    assert p.cli("run", wf, "--run-id", "k6").exit_code == 3
    (tmp_path / "block").write_text("")
    proc = interlock_process(tmp_path, "chat", wf, "--session", "k6", "--store", p.store,
                             stdin=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"look it up\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        wait_for(lambda: (tmp_path / "calls.log").exists(), "its tool call", every=0.05,
                 alive=proc)
        proc.send_signal(signal.SIGKILL)
        # at once, as a person would: the killed process is not reaped yet (a zombie
        # until its parent waits), and holds the run's lease
        stat = Path(f"/proc/{proc.pid}/stat")
        while stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the process did not die"
            time.sleep(0.01)
        (tmp_path / "block").unlink()
        # (on the old code: exit 1, nothing printed, "hello" dropped)
        out = _chat(p, wf, "hello\n", "--session", "k6")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        if proc.stdin is not None:
            proc.stdin.close()
    assert out.exit_code == 3, out.output
    assert "was interrupted during a turn: continuing that turn first" in out.stderr
    assert out.stdout.splitlines() == ["looked it up", "second answer"]
    assert [r["text"] for r in records("k6", p.store, "chat.message")] == [
        "look it up", "hello"]
    assert [r["reply"] for r in records("k6", p.store, "chat.reply")] == [
        "looked it up", "second answer"]
    assert p.cli("verify", "k6").exit_code == 0


def test_chat_session_is_refused_while_a_live_process_executes_its_turn(
        make_project: Any, tmp_path: Path) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(CHAT)
    assert p.cli("run", wf, "--run-id", "k7").exit_code == 3
    (tmp_path / "block").write_text("")
    proc = interlock_process(tmp_path, "send", "k7", "look it up", "--store", p.store)
    try:
        wait_for(lambda: (tmp_path / "calls.log").exists(), "its tool call", every=0.05,
                 alive=proc)
        out = _chat(p, wf, "hello\n", "--session", "k7")
        assert out.exit_code == 2, out.output
        assert "is in a turn another process is executing" in out.stderr
        assert "nothing was sent" in out.stderr
        (tmp_path / "block").unlink()
        assert proc.wait(60) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r["text"] for r in records("k7", p.store, "chat.message")] == ["look it up"]


def test_chat_slash_words_that_are_not_commands_are_neither_sent_nor_recorded(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(PLAIN)
    assert p.cli("run", wf, "--run-id", "c1").exit_code == 3
    out = _chat(p, wf, "/aprove\n/approve\n/reject no\n/frobnicate\n//etc is full\n/end\n",
                "--session", "c1")
    assert out.exit_code == 0, out.output
    assert "unknown command /aprove (did you mean /approve?)" in out.stderr
    assert "no gate waits: /approve" in out.stderr
    assert "no gate waits: /reject" in out.stderr
    assert "unknown command /frobnicate: nothing was sent" in out.stderr
    assert "type //frobnicate" in out.stderr
    assert out.stdout.splitlines()[0] == "hi there"
    # only the literal "/etc is full" and /end reached the conversation
    assert [r["text"] for r in records("c1", p.store, "chat.message")] == [
        "/etc is full", "/end"]


def test_chat_session_of_another_workflow_is_refused(make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(CHAT)
    other = p.workflow(CHAT.replace("workflow: kchat", "workflow: other"), "other.yaml")
    assert p.cli("run", wf, "--run-id", "c2").exit_code == 3
    out = _chat(p, other, "hello\n", "--session", "c2")
    assert out.exit_code == 2, out.output
    assert "run c2 is a run of workflow 'kchat', not of 'other'" in out.stderr
    assert records("c2", p.store, "chat.message") == []


def test_send_to_a_run_that_is_not_a_conversation_says_it_takes_decisions(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    assert p.start(GATES, "g1").exit_code == 3
    out = p.cli("send", "g1", "hi")
    assert out.exit_code == 2, out.output
    assert ("run g1 is not a conversation (workflow gates has no `chat:`): it takes "
            "decisions, not messages") in out.stderr
    assert "decide it first" not in out.stderr
    assert "decide with: interlock resume g1 --gate legal --approve" in out.stderr
    assert records("g1", p.store, "chat.message") == []


PLAIN = """
workflow: plain
chat: assistant
nodes:
  assistant: {agent: {provider: scripted, replies: [hi there, bye now, more]}}
"""


def test_chat_through_a_server_slash_words_a_foreign_session_and_an_edited_file(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "plain.yaml").write_text(textwrap.dedent(PLAIN))
    (tmp_path / "flows" / "gates.yaml").write_text(textwrap.dedent(GATES))
    edited = tmp_path / "edited.yaml"
    edited.write_text(textwrap.dedent(PLAIN).replace("hi there", "hello there"))
    server = Served(tmp_path)
    try:
        out = CliRunner().invoke(cli, ["chat", str(tmp_path / "flows" / "plain.yaml"),
                                       "--server", server.url],
                                 input="/aprove\n//x marks\n/approve\n", catch_exceptions=False)
        assert out.exit_code == 3, out.output
        assert "unknown command /aprove (did you mean /approve?)" in out.stderr
        assert "no gate waits: /approve" in out.stderr
        assert "warning" not in out.stderr  # the file is the server's definition
        session = out.stderr.split("conversation ", 1)[1].split()[0]
        with server.client() as c:
            wait_status(c, session, "WAITING_INPUT")
        texts = [r["text"] for r in _records(server, session) if r["type"] == "chat.message"]
        assert texts == ["/x marks"]
        # an edited local file is not what the server runs: said, and which is used
        again = CliRunner().invoke(cli, ["chat", str(edited), "--server", server.url,
                                         "--session", session], input="more\n",
                                   catch_exceptions=False)
        assert again.exit_code == 3, again.output
        assert f"warning: {edited} differs from the definition run {session} keeps on " \
               "the server" in again.stderr
        assert "the server's definition is used" in again.stderr
        # a session of another workflow is refused
        with server.client() as c:
            assert c.post("/api/workflows/gates/runs",
                          json={"input": {}, "run_id": "g1"}).status_code == 201
            wait_status(c, "g1", "WAITING_APPROVAL")
            refused = c.post("/api/runs/g1/messages", json={"text": "hi"})
            assert refused.status_code == 409
            assert "run g1 is not a conversation (workflow gates has no `chat:`)" in \
                refused.json()["detail"]
        foreign = CliRunner().invoke(cli, ["chat", str(tmp_path / "flows" / "plain.yaml"),
                                           "--server", server.url, "--session", "g1"],
                                     input="hello\n", catch_exceptions=False)
        assert foreign.exit_code == 2, foreign.output
        assert "run g1 is a run of workflow 'gates', not of 'plain'" in foreign.stderr
    finally:
        server.stop()


def _records(server: Served, run_id: str) -> list[dict[str, Any]]:
    with server.client() as c:
        found: list[dict[str, Any]] = c.get(f"/api/runs/{run_id}/records").json()
    return found


def test_send_end_prints_no_reply(make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(PLAIN)
    assert p.cli("run", wf, "--run-id", "e1").exit_code == 3
    assert p.cli("send", "e1", "hello").stdout == "hi there\n"
    ended = p.cli("send", "e1", "/end")
    assert ended.exit_code == 0, ended.output
    assert ended.stdout == ""  # (was "hi there" again: the state's last reply)
    assert "the conversation e1 has ended" in ended.stderr


def test_chat_prints_each_reply_once_when_a_calls_pieces_come_before_the_last_record(
        capsys: Any) -> None:
    """A busy server's event stream may send the next model call's reply pieces before
    the previous call's ``agent.reply`` (it drains the pieces it holds before each record
    it sends): `interlock chat --server` printed "let me looklooked it up" and then the
    reply again, and a turn whose first call only called a tool printed its reply twice."""
    from interlock.cli._chat_live import Printer

    shown = Printer("c1")

    def pieces(turn: int, text: str) -> None:
        for word in text.split(" "):
            shown.token({"run_id": "c1", "node": "a", "turn": turn,
                         "text": word if word == text.split(" ")[0] else " " + word})

    def rec(rtype: str, **fields: Any) -> None:
        shown.record({"type": rtype, "run_id": "c1", "node": "a", **fields})

    # conversation turn 1: "let me look" with a tool call, then the answer -- the
    # answer's pieces before the first call's records
    pieces(0, "let me look")
    pieces(1, "looked it up")
    rec("agent.reply", turn=0, reply="let me look", tool_calls=[{"name": "lookup"}])
    rec("tool.called", tool="lookup", arguments={}, result="found")
    rec("agent.reply", turn=1, reply="looked it up")
    rec("chat.reply", message=0, reply="looked it up")
    # conversation turn 2: a call that only calls a tool, its record after the answer's
    # pieces
    pieces(3, "second answer")
    rec("agent.reply", turn=2, reply=None, tool_calls=[{"name": "lookup"}])
    rec("tool.called", tool="lookup", arguments={}, result="found")
    rec("agent.reply", turn=3, reply="second answer")
    rec("chat.reply", message=1, reply="second answer")
    # conversation turn 3: not streamed -- printed whole, once
    rec("agent.reply", turn=4, reply="third")
    rec("chat.reply", message=2, reply="third")
    assert capsys.readouterr().out.splitlines() == [
        "let me look", "looked it up", "second answer", "third"]


def test_chat_session_of_a_failed_conversation_says_why_and_what_to_do(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(PLAIN.replace("[hi there, bye now, more]", "[only]"))
    assert p.cli("run", wf, "--run-id", "f1").exit_code == 3
    assert p.cli("send", "f1", "hello").exit_code == 3
    assert p.cli("send", "f1", "again").exit_code == 1  # no reply left: the run failed
    out = _chat(p, wf, "more\n", "--session", "f1")
    assert out.exit_code == 1, out.output
    # (was the header line alone: the typed text dropped without a word)
    assert "the conversation f1 is FAILED: node 'assistant' raised RepliesExhausted" \
        in out.stderr
    assert "it takes no message (nothing typed is sent)" in out.stderr
    assert "interlock resume f1" in out.stderr
    assert [r["text"] for r in records("f1", p.store, "chat.message")] == ["hello", "again"]
