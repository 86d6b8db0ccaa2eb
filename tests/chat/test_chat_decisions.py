"""A gate decided in ``interlock chat``: a typo of ``/approve`` while the gate waits is
said to be one (not "a gate waits"), the decision says whom it was recorded as
(``--by``, else anonymous, as ``interlock resume``), and ``trace`` shows a conversation's
messages as messages, not as approvals. Real CLI commands on a SQLite store."""

from __future__ import annotations

import re
from typing import Any

from click.testing import CliRunner
from conftest import records
from test_chat import TOOLS, chat_file

from interlock.cli import cli

GUARDED = dict(replies="[{tool_calls: [{name: restart_service, arguments: {service: db}}]}, "
                       "done, bye]",
               tools="[{call: {mod}:restart_service, confirm: true}]")


def _chat(p: Any, wf: str, text: str, *args: str) -> Any:
    """``interlock chat`` with ``text`` typed, in a conversation started for it (a
    ``--session`` given: that run id)."""
    if "--session" in args:
        run_id = args[args.index("--session") + 1]
        assert p.cli("run", wf, "--run-id", run_id).exit_code == 3
    return CliRunner().invoke(cli, ["chat", wf, "--store", p.store, *args], input=text,
                              catch_exceptions=False)


def test_a_typo_while_a_gate_waits_is_named_and_the_decider_is_said(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", **GUARDED))
    out = _chat(p, wf, "restart db\n/aprove\n/approve go ahead\n/end\n", "--session", "d1")
    assert out.exit_code == 0, out.output
    assert "unknown command /aprove (did you mean /approve?): nothing was sent" in out.stderr
    assert "a gate waits: /approve [COMMENT] or /reject [COMMENT]" in out.stderr
    assert "approved 'assistant' by an anonymous decider (chat with --by NAME to record " \
        "who decides)" in out.stderr
    [decided] = [r for r in records("d1", p.store, "approval.decided")
                 if r["kind"] != "message"]
    assert (decided["decision"], decided.get("by"), decided["via"]) == ("approved", None, "cli")
    assert p.executions() == ["restart_service:start", "restart_service:done"]
    # with --by, the decider is recorded and said
    out = _chat(p, wf, "restart db\n/reject not now\n/end\n", "--session", "d2",
                "--by", "ann")
    assert out.exit_code == 0, out.output
    assert "rejected 'assistant' by ann" in out.stderr
    [decided] = [r for r in records("d2", p.store, "approval.decided")
                 if r["kind"] != "message"]
    assert (decided["decision"], decided["by"]) == ("rejected", "ann")


def test_trace_shows_a_conversations_messages_as_messages(make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", **GUARDED))
    assert _chat(p, wf, "restart db\n/approve\n/end\n", "--session", "d3").exit_code == 0
    trace = p.cli("trace", "d3")
    assert trace.exit_code == 0, trace.output
    decided = [line for line in trace.stdout.splitlines() if "approval.decided" in line]
    assert len(decided) == 3, trace.stdout  # two messages and the guarded call
    assert sum(bool(re.search(r"assistant +message accepted$", line))
               for line in decided) == 2, decided
    assert sum("approved by an anonymous decider" in line for line in decided) == 1
    assert not any("message by" in line for line in decided)


def test_through_a_server_the_chat_says_the_decider_the_server_recorded(
        make_project: Any, tmp_path: Any) -> None:
    from test_server import Served

    p = make_project(TOOLS)
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "chat.yaml").write_text((tmp_path / p.workflow(chat_file("scripted", **GUARDED)))
                                     .read_text())
    served = Served(tmp_path, store=p.store)
    try:
        out = CliRunner().invoke(cli, ["chat", str(flows / "chat.yaml"), "--server",
                                       served.url],
                                 input="restart db\n/aprove\n/approve go\n/end\n",
                                 catch_exceptions=False)
    finally:
        served.stop()
    assert out.exit_code == 0, out.output
    assert "unknown command /aprove (did you mean /approve?)" in out.stderr
    assert "approved 'assistant' by local" in out.stderr  # (the server's name, no --auth)
    session = out.stderr.split("conversation ", 1)[1].split()[0]
    [decided] = [r for r in records(session, p.store, "approval.decided")
                 if r["kind"] != "message"]
    assert (decided["by"], decided["via"]) == ("local", "cli")
