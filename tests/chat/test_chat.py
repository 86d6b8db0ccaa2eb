"""Conversations (SPEC §11): a run of a ``chat:`` file, driven through the CLI in process
(``interlock run``/``send``/``resume``), with the local OpenAI-compatible server as the model
where a test asserts what the model received."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import interlock_process, wait_for
from _workflows import triage
from conftest import CliProject, records
from fake_openai import FakeOpenAI
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

TOOLS = '''
import os, pathlib

def _note(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")

def service_status(service: str) -> dict:
    """The status of a service."""
    _note("service_status")
    return {"service": service, "status": "degraded"}

def restart_service(service: str) -> str:
    """Restart a service."""
    _note("restart_service:start")
    while pathlib.Path("block").exists():   # the test kills the process here
        import time; time.sleep(0.05)
    _note("restart_service:done")
    return f"{service} restarted"

def record(state):
    _note("child:" + str(state.get("service")))
    return {"checked": state.get("service")}
'''


def chat_file(model: str, replies: str = "", history: int | None = None,
              tools: str = "[]") -> str:
    provider = (f"provider: openai\n      model: {model}" if model != "scripted"
                else f"provider: scripted\n      replies: {replies}")
    extra = f"\n      history: {history}" if history else ""
    return f"""
workflow: assistant-chat
chat: assistant
nodes:
  assistant:
    agent:
      {provider}
      system: You are the on-call assistant.{extra}
      tools: {tools}
"""


def killed_in_its_tool_call(p: CliProject, run_id: str, text: str,
                            started: Callable[[], bool]) -> None:
    """``interlock send RUN_ID TEXT`` in a process of its own, SIGKILLed once ``started()``
    (its tool call began: `TOOLS`' ``restart_service`` blocks while a file ``block``
    exists); then the tool is unblocked for what comes next."""
    (p.root / "block").write_text("")
    proc = interlock_process(p.root, "send", run_id, text, "--store", p.store)
    try:
        wait_for(started, "its tool call", every=0.05, alive=proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    (p.root / "block").unlink()


def _user_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["body"]["messages"] if m["role"] == "user"]


def test_three_turns_through_the_cli_the_third_reply_depends_on_the_first(
        make_project: Any, llm: FakeOpenAI, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.url)

    def answer(body: dict[str, Any]) -> str:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if len(users) == 3:  # the third turn answers from the first message
            return f"You told me: {users[0]}"
        return f"noted {len(users)}"

    fake = FakeOpenAI(answer)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    try:
        p: CliProject = make_project(TOOLS)
        wf = p.workflow(chat_file("gpt-test"))
        started = p.cli("run", wf, "--run-id", "c1")
        assert started.exit_code == 3, started.output  # waits for its first message
        _, status = p.cli_json("status", "c1")
        assert status["status"] == "WAITING_INPUT"
        assert status["waiting"]["kind"] == "message"
        assert status["waiting"]["node"] == "assistant"
        one = p.cli("send", "c1", "the database is db-7")
        assert one.exit_code == 3, one.output
        assert one.stdout.strip() == "noted 1"
        two = p.cli("send", "c1", "anything else?", "--by", "alice")
        assert two.exit_code == 3 and two.stdout.strip() == "noted 2"
        three, data = p.cli_json("send", "c1", "what did I say first?")
        assert three.exit_code == 3
        assert data["status"] == "WAITING_INPUT"
        assert data["waiting"]["show"]["last_reply"] == "You told me: the database is db-7"
        # the model received every earlier message, in order, with the replies between
        third = fake.requests[-1]["body"]["messages"]
        assert [m["role"] for m in third] == ["system", "user", "assistant", "user",
                                              "assistant", "user"]
        assert third[2]["content"] == "noted 1"
        messages = records("c1", p.store, "chat.message")
        assert [m["text"] for m in messages] == ["the database is db-7", "anything else?",
                                                 "what did I say first?"]
        assert messages[1]["by"] == "alice"
        assert [r["reply"] for r in records("c1", p.store, "chat.reply")] == [
            "noted 1", "noted 2", "You told me: the database is db-7"]
        end = p.cli("send", "c1", "/end")
        assert end.exit_code == 0, end.output
        _, final = p.cli_json("status", "c1")
        assert final["status"] == "COMPLETED"
        assert final["state"] == {"assistant": "You told me: the database is db-7"}
        assert len(fake.requests) == 3  # /end asks the model nothing
        assert p.cli("verify", "c1").exit_code == 0
    finally:
        fake.close()


def test_history_sends_exactly_the_last_messages(make_project: Any, llm: FakeOpenAI,
                                                 monkeypatch: Any) -> None:
    fake = FakeOpenAI(lambda body: f"reply {len(body['messages'])}")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    try:
        p = make_project(TOOLS)
        wf = p.workflow(chat_file("gpt-test", history=3))
        assert p.cli("run", wf, "--run-id", "h").exit_code == 3
        for text in ("m1", "m2", "m3"):
            assert p.cli("send", "h", text).exit_code == 3
        sent = fake.requests[-1]["body"]["messages"]
        # the system prompt, then exactly the last three messages: m2's reply, ... m3
        assert sent[0]["role"] == "system"
        assert sent[1:] == [{"role": "user", "content": "m2"},
                            {"role": "assistant", "content": "reply 4"},
                            {"role": "user", "content": "m3"}]
        first = fake.requests[0]["body"]["messages"]
        assert [m["role"] for m in first] == ["system", "user"]
    finally:
        fake.close()


def test_a_message_to_a_run_not_waiting_for_one_is_refused_and_records_nothing(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", replies=(
        "[hi, {tool_calls: [{name: restart_service, arguments: {service: db}}]}, done]"),
        tools="[{call: {mod}:restart_service, confirm: true}]"))
    assert p.cli("run", wf, "--run-id", "r").exit_code == 3
    assert p.cli("send", "r", "hello").exit_code == 3
    gated = p.cli("send", "r", "restart db")
    assert gated.exit_code == 3  # waits for a gate the turn reached
    _, status = p.cli_json("status", "r")
    assert status["status"] == "WAITING_APPROVAL"
    assert status["waiting"]["kind"] == "tool"
    before = len(p.records("r"))
    refused = p.cli("send", "r", "are you there?")
    assert refused.exit_code == 2
    assert "refused and nothing was recorded" in refused.output
    assert "decide it first" in refused.output
    assert len(p.records("r")) == before
    decided = p.cli("resume", "r", "--approve")
    assert decided.exit_code == 3, decided.output
    _, status = p.cli_json("status", "r")
    assert status["status"] == "WAITING_INPUT"
    assert status["waiting"]["show"]["last_reply"] == "done"
    assert p.executions() == ["restart_service:start", "restart_service:done"]
    assert p.cli("send", "r", "/end").exit_code == 0
    before = len(p.records("r"))
    again = p.cli("send", "r", "one more")
    assert again.exit_code == 2 and "it is COMPLETED" in again.output
    assert len(p.records("r")) == before
    # an approval decision is no message either: resume on a waiting conversation
    assert p.cli("run", wf, "--run-id", "r2").exit_code == 3
    wrong = p.cli("resume", "r2", "--approve")
    assert wrong.exit_code == 2


def test_end_conversation_tool_completes_the_run_with_the_last_reply(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", replies=(
        "[{content: Goodbye, tool_calls: [{name: end_conversation}]}]")))
    assert p.cli("run", wf, "--run-id", "e").exit_code == 3
    result, data = p.cli_json("send", "e", "thanks, bye")
    assert result.exit_code == 0
    assert data["status"] == "COMPLETED"
    assert data["state"] == {"assistant": "Goodbye"}


def test_sigkill_during_a_tool_call_of_turn_two_then_resume(make_project: Any) -> None:
    p = make_project(TOOLS)
    replies = ("[first answer, "
               "{tool_calls: [{name: service_status, arguments: {service: db}},"
               " {name: restart_service, arguments: {service: db}}]}, "
               "db restarted, third answer]")
    wf = p.workflow(chat_file("scripted", replies=replies,
                              tools="[{mod}:service_status, {mod}:restart_service]"))
    assert p.cli("run", wf, "--run-id", "k").exit_code == 3
    assert p.cli("send", "k", "hello").exit_code == 3
    killed_in_its_tool_call(p, "k", "restart db",
                            lambda: "restart_service:start" in p.executions())
    resumed = p.cli("resume", "k")
    assert resumed.exit_code == 3, resumed.output
    _, status = p.cli_json("status", "k")
    assert status["status"] == "WAITING_INPUT"
    assert status["waiting"]["show"]["last_reply"] == "db restarted"
    # the completed tool call of turn 2 was not done again; the interrupted one was
    assert p.executions().count("service_status") == 1
    assert p.executions().count("restart_service:done") == 1
    third = p.cli("send", "k", "thanks")
    assert third.exit_code == 3 and third.stdout.strip() == "third answer"
    assert [r["reply"] for r in records("k", p.store, "chat.reply")] == [
        "first answer", "db restarted", "third answer"]
    assert [r["text"] for r in records("k", p.store, "chat.message")] == [
        "hello", "restart db", "thanks"]
    assert p.cli("verify", "k").exit_code == 0


CHILD = triage("{mod}:record")


def _workflow_tool_project(make_project: Any) -> tuple[CliProject, str]:
    p = make_project(TOOLS)
    p.workflow(CHILD, "triage.yaml")
    call = "{tool_calls: [{name: run_triage, arguments: {service: %s}}]}"
    replies = f"[{call % 'db'}, triage done, {call % 'api'}, triage refused]"
    wf = p.workflow(chat_file("scripted", replies=replies, tools=(
        "[{workflow: triage.yaml, name: run_triage, description: Sweep a service}]")))
    return p, wf


def test_a_workflow_tool_gate_pauses_the_conversation_approved_then_rejected(
        make_project: Any) -> None:
    p, wf = _workflow_tool_project(make_project)
    assert p.cli("run", wf, "--run-id", "w").exit_code == 3
    first = p.cli("send", "w", "triage db")
    assert first.exit_code == 3
    _, status = p.cli_json("status", "w")
    assert status["status"] == "WAITING_APPROVAL"
    assert status["waiting"]["node"] == "assistant/run_triage/approval"
    assert status["waiting"]["show"] == {"checked": "db"}
    refused = p.cli("send", "w", "hurry up")
    assert refused.exit_code == 2
    approved = p.cli("resume", "w", "--approve", "--by", "alice")
    assert approved.exit_code == 3, approved.output
    assert "reply: triage done" in approved.output  # the turn's reply, where it is decided
    _, status = p.cli_json("status", "w")
    assert status["status"] == "WAITING_INPUT"
    assert status["waiting"]["show"]["last_reply"] == "triage done"
    called = [r for r in records("w", p.store, "tool.called") if r["tool"] == "run_triage"]
    assert called[0]["result"]["checked"] == "db"
    assert called[0]["result"]["approval"]["decision"] == "approved"
    children = records("w", p.store, "child.started")
    assert len(children) == 1
    _, child = p.cli_json("status", children[0]["run_id"])
    assert child["status"] == "COMPLETED"
    # the second call: its gate rejected -> the child ends REJECTED, a tool error the
    # model is told about; the turn goes on
    assert p.cli("send", "w", "now triage api").exit_code == 3
    rejected = p.cli("resume", "w", "--reject", "--comment", "not now")
    assert rejected.exit_code == 3, rejected.output
    _, status = p.cli_json("status", "w")
    assert status["status"] == "WAITING_INPUT"
    assert status["waiting"]["show"]["last_reply"] == "triage refused"
    called = [r for r in records("w", p.store, "tool.called") if r["tool"] == "run_triage"]
    assert called[-1]["error"]["type"] == "ToolWorkflowError"
    assert "rejected" in called[-1]["error"]["message"]
    assert p.executions() == ["child:db", "child:api"]
    assert p.cli("verify", "w").exit_code == 0
    trace = json.loads(p.cli("trace", "w", "--json").stdout)
    nested = [r for r in trace if r["type"] == "child.started"]
    assert all(r.get("records") for r in nested)  # the children's logs nest in the trace


def test_a_specialist_agent_as_a_tool(make_project: Any) -> None:
    p = make_project(TOOLS)
    tools = ("[{name: kafka, description: Ask the Kafka specialist, agent: {provider: "
             "scripted, system: You know Kafka., tools: ['{mod}:service_status'], replies: ["
             "{tool_calls: [{name: service_status, arguments: {service: kafka}}]}, "
             "lag is 3]}}]")
    replies = ("[{tool_calls: [{name: kafka, arguments: {request: how is kafka?}}]}, "
               "Kafka lag is 3]")
    wf = p.workflow(chat_file("scripted", replies=replies, tools=tools))
    assert p.cli("run", wf, "--run-id", "s").exit_code == 3
    sent = p.cli("send", "s", "kafka?")
    assert sent.exit_code == 3, sent.output
    assert sent.stdout.strip() == "Kafka lag is 3"
    called = records("s", p.store, "tool.called")
    inner = [r for r in called if r.get("agent_tool") == "kafka"]
    assert inner and inner[0]["tool"] == "service_status"
    outer = [r for r in called if r["tool"] == "kafka"]
    assert outer[0]["result"] == "lag is 3"
    assert p.executions() == ["service_status"]


def test_interlock_chat_holds_a_conversation_from_standard_input_with_a_gate_inline(
        make_project: Any) -> None:
    p, wf = _workflow_tool_project(make_project)
    from click.testing import CliRunner

    from interlock.cli import cli

    out = CliRunner().invoke(cli, ["chat", wf, "--store", p.store, "--by", "alice"],
                             input="triage db\nhello?\n/approve looks fine\n/end\n",
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == ["triage done"]
    assert "waiting for a decision at assistant/run_triage/approval" in out.stderr
    assert "a gate waits: /approve" in out.stderr  # "hello?" while the gate waits
    assert "> run_triage(" in out.stderr and "child run" in out.stderr
    assert "has ended" in out.stderr
    session = out.stderr.split("conversation ", 1)[1].split()[0]
    _, status = p.cli_json("status", session)
    assert status["status"] == "COMPLETED"
    decided = records(session, p.store, "approval.decided")
    assert [(d["kind"], d["by"], d["comment"]) for d in decided if d["kind"] != "message"] \
        == [("workflow", "alice", "looks fine")]
    # --session continues it: a conversation that ended takes no message
    again = CliRunner().invoke(cli, ["chat", wf, "--store", p.store, "--session", session],
                               input="more\n", catch_exceptions=False)
    assert again.exit_code == 0 and "has ended" in again.stderr


def test_interlock_chat_prints_a_streamed_reply_as_it_arrives(
        make_project: Any, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from interlock.cli import cli

    fake = FakeOpenAI(lambda body: "one two three")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    try:
        p = make_project(TOOLS)
        wf = p.workflow(chat_file("gpt-test"))
        out = CliRunner().invoke(cli, ["chat", wf, "--store", p.store],
                                 input="hi\n/end\n", catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert out.stdout == "one two three\n"  # streamed, printed once
        assert fake.requests[0]["body"]["stream"] is True
    finally:
        fake.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_conversation_continued_by_other_processes_has_its_whole_context(
        kind: str, make_project: Any, monkeypatch: Any, request: Any) -> None:
    fake = FakeOpenAI(lambda body: f"turn {sum(m['role'] == 'user' for m in body['messages'])}")
    try:
        p = make_project(TOOLS)
        store = p.store if kind == "sqlite" else request.getfixturevalue("pg_schema_url")
        wf = p.workflow(chat_file("gpt-test"))
        env = {**os.environ, "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake.url,
               "PYTHONPATH": os.pathsep.join([str(p.root),
                                              str(Path(__file__).resolve().parents[2])])}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "interlock", *args, "--store", store],
                                  cwd=p.root, env=env, capture_output=True, text=True,
                                  timeout=120)

        assert cli("run", wf, "--run-id", "far").returncode == 3
        for text in ("first: the token is abc-123", "second", "third"):
            sent = cli("send", "far", text)  # each turn in a process of its own
            assert sent.returncode == 3, sent.stderr
        assert sent.stdout.strip() == "turn 3"
        users = [m["content"] for m in fake.requests[-1]["body"]["messages"]
                 if m["role"] == "user"]
        assert users == ["first: the token is abc-123", "second", "third"]
    finally:
        fake.close()


def test_limits_cover_the_whole_conversation_and_a_waiting_one_can_be_cancelled(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    usage = "{content: fine, usage: {prompt_tokens: 40, completion_tokens: 20}}"
    text = chat_file("scripted", replies=f"[{usage}, {usage}, {usage}]").replace(
        "chat: assistant\n", "chat: assistant\nlimits: {tokens: 150}\n")
    wf = p.workflow(text)
    assert p.cli("run", wf, "--run-id", "b").exit_code == 3
    assert p.cli("send", "b", "one").exit_code == 3   # 60 tokens
    assert p.cli("send", "b", "two").exit_code == 3   # 120
    over, data = p.cli_json("send", "b", "three")     # 180 > 150: the turn fails the run
    assert over.exit_code == 1
    assert data["status"] == "FAILED"
    assert data["error"]["type"] == "budget_exceeded"
    assert data["tokens"] == 180
    assert p.cli("run", wf, "--run-id", "c").exit_code == 3
    assert p.cli("cancel", "c", "--by", "ops").exit_code == 0
    _, status = p.cli_json("status", "c")
    assert status["status"] == "CANCELLED"
    refused = p.cli("send", "c", "hello?")
    assert refused.exit_code == 2 and "it is CANCELLED" in refused.output


def test_limits_steps_cover_a_conversation_that_only_talks(make_project: Any) -> None:
    """Each turn is a step (the first is the node's visit): ``limits: {steps: 3}`` allows
    three turns of a conversation whose turns call no tool -- they added no step before,
    so the limit never bit. The fourth message fails the run as any limit does; a resume
    with a higher limit answers it; ``/end`` is no turn."""
    p = make_project(TOOLS)
    text = chat_file("scripted", replies="[one, two, three, four, five]").replace(
        "chat: assistant\n", "chat: assistant\nlimits: {steps: 3}\n")
    wf = p.workflow(text)
    assert p.cli("run", wf, "--run-id", "s").exit_code == 3
    for n, word in enumerate(("a", "b", "c"), 1):
        sent, data = p.cli_json("send", "s", word)
        assert sent.exit_code == 3, sent.output
        assert data["steps"] == n
    over = p.cli("send", "s", "d")
    assert over.exit_code == 1
    assert (f"continue with a higher limit: `interlock resume s --store {p.store} --set "
            "limits.steps=N`") in over.stderr.splitlines()
    _, data = p.cli_json("status", "s")
    assert data["status"] == "FAILED"
    assert data["error"]["type"] == "step_limit"
    assert "limits.steps=3 before message 4 could be answered" in data["error"]["message"]
    assert data["steps"] == 4
    status = p.cli("status", "s")
    assert "`interlock resume s --store" in status.stdout and "--set limits.steps=N`" \
        in status.stdout
    resumed, data = p.cli_json("resume", "s", "--set", "limits.steps=5")
    assert resumed.exit_code == 3, resumed.output
    assert data["waiting"]["show"]["last_reply"] == "four"  # message 4, answered
    ended, data = p.cli_json("send", "s", "/end")
    assert ended.exit_code == 0
    assert data["steps"] == 4  # (/end is no turn)
    assert [r["text"] for r in records("s", p.store, "chat.message")] == \
        ["a", "b", "c", "d", "/end"]
    assert p.cli("verify", "s").exit_code == 0
    # `interlock chat` over the limit: the run failed, and how to go on
    from click.testing import CliRunner

    from interlock.cli import cli

    out = CliRunner().invoke(cli, ["chat", wf, "--store", p.store], input="a\nb\nc\nd\n",
                             catch_exceptions=False)
    assert out.exit_code == 1
    assert out.stdout.splitlines() == ["one", "two", "three"]
    session = out.stderr.split("conversation ", 1)[1].split()[0]
    assert (f"continue with a higher limit: `interlock resume {session} --store {p.store} "
            "--set limits.steps=N`") in out.stderr.splitlines()


def test_run_and_resume_say_a_conversation_waits_for_a_message(make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", replies="[hi]"))
    started = p.cli("run", wf, "--run-id", "say")
    assert started.exit_code == 3
    assert "waiting for the next message: interlock send say TEXT" in started.output
    for args in (("resume", "say"), ("resume", "say", "--approve")):
        refused = p.cli(*args)
        assert refused.exit_code == 2
        assert "a conversation waiting for its next message" in refused.output
        assert "interlock send say TEXT" in refused.output


def test_runs_waiting_lists_gates_and_conversations_waiting_for_a_message(
        make_project: Any) -> None:
    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", replies=(
        "[{tool_calls: [{name: restart_service, arguments: {service: db}}]}, done]"),
        tools="[{call: {mod}:restart_service, confirm: true}]"))
    assert p.cli("run", wf, "--run-id", "talking").exit_code == 3
    assert p.cli("run", wf, "--run-id", "gated").exit_code == 3
    assert p.cli("send", "gated", "restart db").exit_code == 3
    listed = p.cli("runs", "--waiting")
    assert listed.exit_code == 0
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert set(lines) == {"talking", "gated"}
    assert "message to assistant" in lines["talking"]
    assert "message to" not in lines["gated"]
    _, rows = p.cli_json("runs", "--waiting", "--status", "WAITING_INPUT")
    assert [r["run_id"] for r in rows] == ["talking"]


def test_a_message_recorded_for_a_worker_is_answered_by_the_worker(tmp_path: Path) -> None:
    import asyncio

    import interlock
    from interlock._ops._execute import continue_claimed
    from interlock._ops._messages import send

    wf = interlock.load({"workflow": "queued", "chat": "assistant", "nodes": {"assistant": {
        "agent": {"provider": "scripted", "replies": ["from the worker"]}}}})

    async def go() -> tuple[str, str, interlock.RunResult]:
        store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        try:
            run = await wf.run({}, store=store)
            queued = await send(run.run_id, "hello", store=store, detach=True)
            claimed = await store.claim_next("worker-1", 15.0)
            assert claimed == run.run_id
            done = await continue_claimed(store, claimed, "worker-1")
            return queued.status, claimed, done
        finally:
            await store.close()

    queued, _, done = asyncio.run(go())
    assert queued == "PENDING"  # recorded; no turn ran in the sender
    assert done.status == "WAITING_INPUT"
    assert done.waiting is not None and done.waiting["show"]["last_reply"] == "from the worker"


def test_interlock_chat_exits_3_when_its_input_ends_before_the_conversation(
        make_project: Any) -> None:
    from click.testing import CliRunner

    from interlock.cli import cli

    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", replies="[first, second]"))
    out = CliRunner().invoke(cli, ["chat", wf, "--store", p.store], input="hello\n",
                             catch_exceptions=False)
    assert out.exit_code == 3  # it waits for the next message
    session = out.stderr.split("conversation ", 1)[1].split()[0]
    again = CliRunner().invoke(cli, ["chat", wf, "--store", p.store, "--session", session],
                               input="more\n/end\n", catch_exceptions=False)
    assert again.exit_code == 0
    assert again.stdout.splitlines() == ["second"]  # the conversation went on


def test_interlock_chat_prints_a_goodbye_that_ends_the_conversation_once(
        make_project: Any) -> None:
    """A reply streamed beside a tool call (here ``end_conversation``: the reply is the
    turn's, and the conversation's last) is printed once -- it was printed again whole
    when the turn's ``chat.reply`` came."""
    from click.testing import CliRunner

    from interlock.cli import cli

    p = make_project(TOOLS)
    wf = p.workflow(chat_file("scripted", replies=(
        "[hello there, {content: Goodbye!, tool_calls: [{name: end_conversation}]}]")))
    out = CliRunner().invoke(cli, ["chat", wf, "--store", p.store], input="hi\nbye\n",
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert out.stdout == "hello there\nGoodbye!\n"
    assert "> end_conversation({}) -> ended" in out.stderr


def test_resume_of_a_conversation_shows_the_turn_not_an_attempt(make_project: Any) -> None:
    """A conversation's node re-runs after each message and decision (the visit's attempt
    count grows with them): the progress line says which turn it answers, not
    ``attempt 4`` of a node that never retried."""
    p, wf = _workflow_tool_project(make_project)
    assert p.cli("run", wf, "--run-id", "t").exit_code == 3
    assert p.cli("send", "t", "triage db").exit_code == 3
    assert p.cli("resume", "t", "--approve").exit_code == 3
    assert p.cli("send", "t", "now triage api").exit_code == 3
    rejected = p.cli("resume", "t", "--reject")
    assert rejected.exit_code == 3, rejected.output
    lines = [line for line in rejected.stderr.splitlines() if line.startswith("  assistant")]
    assert lines == ["  assistant  rejected   by an anonymous decider",
                     "  assistant  running    turn 2",
                     "  assistant  waiting    for the next message"]
    started = [r["attempt"] for r in records("t", p.store, "node.started")]
    assert started[-1] == 5  # (what the progress line said before)
