"""An agent using MCP servers' tools (SPEC §12), against a server of the test's own
(tests/mcp/toolsrv.py, the SDK's MCPServer) over stdio and over streamable HTTP, in real
processes: plain calls and their records, a server's error as a tool error, confirm
approved and rejected, the server killed and restarted (between two runs, and between
two calls of one visit), a server that is down failing the node with its address, and a
run SIGKILLed after the tool list was recorded, resumed against a server whose list
changed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import interlock

HERE = Path(__file__).resolve().parent
TREE = HERE.parents[1]

PAUSE = '''
import time
from pathlib import Path

def pause() -> str:
    """Waits for the test."""
    Path("pause.started").write_text("1")
    while not Path("pause.release").exists():
        time.sleep(0.02)
    return "resumed"
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    shutil.copy(HERE / "toolsrv.py", tmp_path / "toolsrv.py")
    (tmp_path / "pnodes.py").write_text(PAUSE)
    monkeypatch.chdir(tmp_path)  # a command runs in the engine's working directory
    monkeypatch.setenv("TOOLSRV_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def workflow(server: dict[str, Any], replies: list[Any], *, extra: str = "",
             tools_extra: Sequence[Any] = ()) -> dict[str, Any]:
    """One scripted agent node with the server's tools (``confirm: [delete]``, unless
    ``extra`` -- JSON -- says otherwise) after ``tools_extra``."""
    entry = {"mcp": server, "confirm": ["delete"], **json.loads(extra or "{}")}
    return {"workflow": "helper",
            "nodes": {"helper": {"agent": {
                "provider": "scripted", "prompt": "help",
                "tools": [*tools_extra, entry], "replies": replies}}},
            "edges": [{"from": "START", "to": "helper"}, {"from": "helper", "to": "END"}]}


def stdio() -> dict[str, Any]:
    return {"command": [sys.executable, "toolsrv.py"]}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _records(run_id: str, store: str) -> list[dict[str, Any]]:
    """The run's log records (``interlock trace --json``'s)."""
    return asyncio.run(interlock.trace(run_id, store=store))


def calls(root: Path) -> list[str]:
    log = root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_stdio_servers_tools_are_called_and_recorded(project: Path) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    wf = interlock.load(workflow(stdio(), [
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                        {"name": "broken", "arguments": {}}]},
        "done"]))
    result = wf.run_sync({}, store=store)
    assert result.status == "COMPLETED", result.error
    recs = _records(result.run_id, store)
    address = f"{sys.executable} toolsrv.py"
    listed = [r for r in recs if r["type"] == "mcp.tools"]
    assert [(r["server"], r["tools"]) for r in listed] == [
        (address, ["add", "delete", "broken", "hold"])]
    called = [r for r in recs if r["type"] == "tool.called"]
    assert [(r["server"], r["tool"]) for r in called] == [(address, "add"),
                                                          (address, "broken")]
    assert called[0]["result"] == {"result": 5}
    assert called[1]["error"]["type"] == "McpToolError"  # tool_errors: return (the model is told)
    assert "the disk is on fire" in called[1]["error"]["message"]
    request = next(r for r in recs if r["type"] == "agent.request")
    assert request["tools"] == ["add", "delete", "broken", "hold"]
    assert [c.split(" pid=")[0] for c in calls(project)] == ["add 2 3"]


def test_tools_and_prefix_choose_what_the_model_sees(project: Path) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    wf = interlock.load(workflow(stdio(), [call("fs_add", a=1, b=1), call("fs_hold"), "done"],
                                 extra='{"tools": ["add"], "prefix": "fs", "confirm": []}'))
    result = wf.run_sync({}, store=store)
    assert result.status == "COMPLETED", result.error
    recs = _records(result.run_id, store)
    assert [r["tools"] for r in recs if r["type"] == "mcp.tools"] == [["add"]]
    called = [r for r in recs if r["type"] == "tool.called"]
    assert (called[0]["tool"], called[0]["server_tool"]) == ("fs_add", "add")
    assert "no tool 'fs_hold'" in called[1]["problem"]  # not offered: never sent to the server
    assert [c.split(" pid=")[0] for c in calls(project)] == ["add 1 1"]


def test_a_tool_named_twice_is_a_node_error_naming_both(project: Path) -> None:
    wf = interlock.load(workflow(stdio(), ["done"], tools_extra=["pnodes:pause"],
                                 extra='{"tools": ["add"], "confirm": []}'))
    # a Python tool "pause" and the server's "add": no clash; the server twice: a clash
    spec = workflow(stdio(), ["done"], extra='{"confirm": []}')
    spec["nodes"]["helper"]["agent"]["tools"].append({"mcp": stdio(), "confirm": []})
    assert wf.run_sync({}, store="memory://").status == "COMPLETED"
    result = interlock.load(spec).run_sync({}, store="memory://")
    assert result.status == "FAILED"
    assert "two tools are named 'add'" in result.error["message"]
    assert "prefix" in result.error["message"]


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_confirm_tool_waits_for_a_person(project: Path, decision: str) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    wf = interlock.load(workflow(stdio(), [call("delete", path="/tmp/x"), "done"]))
    first = wf.run_sync({}, store=store)
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["show"] == {"tool": "delete", "arguments": {"path": "/tmp/x"}}
    assert calls(project) == []  # not called before a person decides
    how = interlock.approve(by="alice") if decision == "approve" else \
        interlock.reject(by="alice", comment="not that one")
    done = wf.resume_sync(first.run_id, how, store=store)
    assert done.status == "COMPLETED", done.error
    recs = _records(first.run_id, store)
    if decision == "approve":
        assert [c.split(" pid=")[0] for c in calls(project)] == ["delete /tmp/x"]
        assert [r["tool"] for r in recs if r["type"] == "tool.called"] == ["delete"]
    else:
        assert calls(project) == []
        assert [r["tool"] for r in recs if r["type"] == "tool.rejected"] == ["delete"]
    # the listing was recorded once: the resumed visit offered the recorded list
    assert len([r for r in recs if r["type"] == "mcp.tools"]) == 1


# -- over streamable HTTP, with the server killed and restarted ---------------------------


class ToolServer:
    """tests/mcp/toolsrv.py serving streamable HTTP on a port, as a subprocess."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ToolServer:
        self.proc = subprocess.Popen([sys.executable, "toolsrv.py", str(self.port)],
                                     cwd=self.root, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     env={**os.environ, "TOOLSRV_DIR": str(self.root)})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            assert self.proc.poll() is None, "the tool server exited"
            time.sleep(0.05)
        raise AssertionError("the tool server did not listen")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def tool_server(project: Path) -> Iterator[ToolServer]:
    srv = ToolServer(project).start()
    yield srv
    srv.kill()


def _pids(root: Path) -> list[str]:
    return [c.split(" pid=")[1] for c in calls(root)]


def test_http_server_killed_and_restarted_between_two_runs(project: Path,
                                                           tool_server: ToolServer) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    wf = interlock.load(workflow({"url": tool_server.url}, [call("add", a=1, b=2), "done"]))
    assert wf.run_sync({}, store=store).status == "COMPLETED"
    tool_server.kill()
    down = wf.run_sync({}, store=store)
    assert down.status == "FAILED"
    assert down.error["details"]["exception"] == "ToolUnavailable"
    assert f"the MCP server {tool_server.url} failed while connecting: ConnectError" in \
        down.error["message"]  # its address, and the cause
    tool_server.start()  # the same port, a new process
    assert wf.run_sync({}, store=store).status == "COMPLETED"
    pids = _pids(project)
    assert len(pids) == 2 and pids[0] != pids[1]


def test_a_session_survives_its_server_dying_between_two_calls(project: Path) -> None:
    """A stdio server (the visit's own subprocess) killed between two calls: the next
    call finds the session dead and is sent once more on a new one."""
    import threading

    store = f"sqlite:///{project / 'runs.db'}"
    wf = interlock.load(workflow(stdio(), [call("add", a=1, b=1), call("pause"),
                                           call("add", a=2, b=2), "done"],
                                 tools_extra=["pnodes:pause"]))
    out: list[Any] = []
    runner = threading.Thread(target=lambda: out.append(wf.run_sync({}, store=store)))
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not (project / "pause.started").exists():
            assert time.monotonic() < deadline and runner.is_alive()
            time.sleep(0.02)
        os.kill(int(_pids(project)[0]), signal.SIGKILL)  # the server that answered add
    finally:
        (project / "pause.release").write_text("1")
        runner.join(60)
    assert out and out[0].status == "COMPLETED", out and out[0].error
    assert [c.split(" pid=")[0] for c in calls(project)] == ["add 1 1", "add 2 2"]
    pids = _pids(project)
    assert pids[0] != pids[1]
    recs = _records(out[0].run_id, store)
    assert [r["result"] for r in recs if r["type"] == "tool.called" and r["tool"] == "add"] \
        == [{"result": 2}, {"result": 4}]


def test_sigkill_after_the_list_was_recorded_then_resume_against_a_changed_list(
        project: Path, tool_server: ToolServer) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    spec = workflow({"url": tool_server.url}, [call("add", a=5, b=5), call("hold"), "done"])
    (project / "helper.yaml").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(TREE)])}
    run = subprocess.Popen([sys.executable, "-m", "interlock", "run", "helper.yaml",
                            "--store", store, "--run-id", "killed-run"], cwd=project,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (project / "hold.started").exists():  # listed, add called, hold running
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)
        run.wait(10)
    finally:
        if run.poll() is None:
            run.kill()
    tool_server.kill()
    (project / "v2").write_text("")  # the server no longer offers hold
    (project / "hold.release").write_text("1")
    tool_server.start()

    resumed = subprocess.run([sys.executable, "-m", "interlock", "resume", "killed-run",
                              "--store", store, "--json"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "COMPLETED"
    recs = _records("killed-run", store)
    # listed once, before the kill: the resumed visit offered that list (hold included)
    assert [r["tools"] for r in recs if r["type"] == "mcp.tools"] == [
        ["add", "delete", "broken", "hold"]]
    called = [r for r in recs if r["type"] == "tool.called"]
    assert [r["tool"] for r in called] == ["add", "hold"]  # add not called again
    # hold was offered (a tool not offered is refused here, never sent: "problem"), sent
    # to the server, which no longer has it: a tool error, told to the model
    assert "problem" not in called[1] and called[1]["server"] == tool_server.url
    assert called[1]["error"]["type"] == "McpToolError"
    assert "hold" in called[1]["error"]["message"]
    assert [c.split(" pid=")[0] for c in calls(project)] == ["add 5 5"]


def test_two_nodes_at_once_each_have_their_own_session(project: Path) -> None:
    """Two agent nodes of a fan-out call the same server at the same time: each visit
    opens its own session (here its own server process) -- none is shared."""
    agent = {"provider": "scripted", "prompt": "p",
             "tools": [{"mcp": stdio(), "confirm": []}],
             "replies": [call("add", a=1, b=1), "done"]}
    spec = {"workflow": "both",
            "nodes": {"one": {"agent": agent}, "two": {"agent": agent}},
            "edges": [{"from": "START", "to": ["one", "two"]},
                      {"from": ["one", "two"], "to": "END"}]}
    result = interlock.load(spec).run_sync({}, store="memory://")
    assert result.status == "COMPLETED", result.error
    assert [c.split(" pid=")[0] for c in calls(project)] == ["add 1 1", "add 1 1"]
    assert len(set(_pids(project))) == 2


def test_a_header_naming_an_unset_variable_fails_the_node_naming_it(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCP_TEST_TOKEN", raising=False)
    spec = workflow({"url": "http://127.0.0.1:9/mcp",
                     "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}}, ["done"],
                    extra='{"confirm": []}')
    result = interlock.load(spec).run_sync({}, store="memory://")
    assert result.status == "FAILED"
    assert "reads ${MCP_TEST_TOKEN}, which is not set" in result.error["message"]
    assert "Bearer" not in json.dumps(interlock.load(spec).definition()).replace(
        "Bearer ${MCP_TEST_TOKEN}", "")  # the definition holds the placeholder only


#: a workflow tool as loading pins it (its file's definition read)
PINNED = {"file": "c.yaml", "definition": {}}


@pytest.mark.parametrize("entry, problem", [
    ({"mcp": {"url": "http://x/mcp", "command": ["x"]}}, "exactly one of url"),
    ({"mcp": {"command": ["x"]}, "confirm": True}, "confirm: [names]"),
    ({"call": "pnodes:pause", "prefix": "p"}, "go with mcp:"),
    ({"mcp": {"command": ["x"], "headers": {"a": "b"}}}, "headers: go with url:"),
    # a tool is exactly one of call / workflow / agent / mcp (SPEC §11, §12)
    ({"mcp": {"command": ["x"]}, "confirm": [], "name": "fs", "agent": {"provider": "scripted"}},
     "exactly one of call, workflow, agent, mcp (this one has agent, mcp)"),
    ({"mcp": {"command": ["x"]}, "confirm": [], "workflow": PINNED, "name": "c"},
     "exactly one of call, workflow, agent, mcp (this one has workflow, mcp)"),
    ({"mcp": {"command": ["x"]}, "confirm": [], "name": "fs"}, "name: and description: go "
     "with workflow: or agent:"),
    ({"workflow": PINNED, "name": "c", "prefix": "p"}, "go with mcp:"),
    ({"name": "c", "description": "d"}, "{workflow: FILE, name, description}, {name, "
     "description, agent: {...}} or {mcp: {url | command}, tools, confirm, prefix}"),
])
def test_an_mcp_entry_is_checked_when_the_workflow_loads(entry: dict[str, Any],
                                                         problem: str) -> None:
    spec = workflow(stdio(), ["done"])
    spec["nodes"]["helper"]["agent"]["tools"] = [entry]
    with pytest.raises(interlock.WorkflowError) as caught:
        interlock.load(spec)
    assert problem in str(caught.value)


def test_a_tool_is_of_one_of_four_kinds() -> None:
    from interlock.agents._spec import ToolSpec

    kinds = [ToolSpec.model_validate(e).kind for e in (
        "pnodes:pause", {"workflow": PINNED, "name": "c"},
        {"name": "a", "agent": {"provider": "scripted"}},
        {"mcp": {"command": ["x"]}, "confirm": []},
        {"mcp": {"command": ["x"]}})]  # (confirm: [names] is optional, as docs/mcp.md shows)
    assert kinds == ["call", "workflow", "agent", "mcp", "mcp"]
