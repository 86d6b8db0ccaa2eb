"""``interlock mcp`` over stdio, driven by the MCP SDK's own client in a real
subprocess: the tools and their schemas, a call to completion with progress, a call that
waits (decided through the CLI, then read with interlock_run_status), a gate answered
through elicitation on both protocol generations."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_project import cli as _cli
from mcp_project import project, stdio_params
from test_server import pythonpath

pytest.importorskip("mcp")

__all__ = ["project"]  # the fixtures, used by name

import mcp_types as types
from mcp import Client


def test_tools_are_the_workflows_with_their_input_schemas(project: Path) -> None:
    async def go() -> list[types.Tool]:
        async with Client(stdio_params(project)) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in anyio.run(go)}
    assert set(tools) == {"gated", "plain", "asked", "talk", "interlock_run_status"}
    assert tools["plain"].input_schema["required"] == ["n"]
    assert "n" in tools["plain"].input_schema["properties"]
    assert tools["plain"].description is not None
    assert tools["plain"].description.startswith("Adds one to n, then doubles it.")
    assert tools["interlock_run_status"].input_schema["required"] == ["run_id"]


def test_a_call_runs_the_workflow_to_completion_with_progress(project: Path) -> None:
    """(Its first node prints to stdout: the protocol stream is not disturbed.)"""
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async def go() -> types.CallToolResult:
        async with Client(stdio_params(project)) as c:
            return await c.call_tool("plain", {"n": 4}, progress_callback=on_progress)

    res = anyio.run(go)
    assert not res.is_error
    run = res.structured_content
    assert run["status"] == "COMPLETED"
    assert run["state"]["first"] == 5 and run["state"]["last"] == 10
    assert [m for _, m in progress] == ["node first completed", "node last completed"]
    # the run is in the store the process was given, as the CLI sees it
    shown = json.loads(_cli(project, "status", run["run_id"], "--json").stdout)
    assert shown["state"] == run["state"]


def test_a_refused_input_is_a_tool_error_and_starts_no_run(project: Path) -> None:
    async def go() -> types.CallToolResult:
        async with Client(stdio_params(project)) as c:
            return await c.call_tool("plain", {"m": 1})

    res = anyio.run(go)
    assert res.is_error
    assert "lacks 'n'" in res.content[0].text  # type: ignore[union-attr]
    # no run: the store was never made, or it holds none
    if (project / "runs.db").exists():
        assert json.loads(_cli(project, "runs", "--json").stdout) == []
    else:
        assert "no store at" in _cli(project, "runs", "--json").stderr


def test_a_waiting_run_returns_at_once_and_is_decided_elsewhere(project: Path) -> None:
    async def call() -> types.CallToolResult:
        # no elicitation callback: the client cannot be asked
        async with Client(stdio_params(project)) as c:
            return await c.call_tool("gated", {"n": 1})

    res = anyio.run(call)
    assert not res.is_error
    out = res.structured_content
    run_id = out["run_id"]
    assert out["status"] == "WAITING_APPROVAL"
    assert out["waiting"]["node"] == "gate"
    gate = " --gate gate" if "pending" in out["waiting"] else ""  # (several gates at once)
    assert out["decide"]["cli"].startswith(f"interlock resume {run_id}{gate} --approve")
    assert "url" not in out["decide"]  # no --public-url

    # the command as given (it names this store), by alice (the gate's approvers:)
    decided = _cli(project, *shlex.split(out["decide"]["cli"])[1:], "--by", "alice")
    assert decided.returncode == 0, decided.stderr

    async def status() -> types.CallToolResult:
        async with Client(stdio_params(project)) as c:
            return await c.call_tool("interlock_run_status", {"run_id": run_id})

    after = anyio.run(status).structured_content
    assert after["status"] == "COMPLETED"
    assert after["state"]["gate"]["by"] == "alice"


def test_public_url_links_the_gate_in_the_dashboard(project: Path) -> None:
    async def call() -> Any:
        async with Client(stdio_params(project, "--public-url", "http://ops.example:8765")) as c:
            return (await c.call_tool("gated", {"n": 1})).structured_content

    out = anyio.run(call)
    assert out["decide"]["url"] == f"http://ops.example:8765/approvals?run_id={out['run_id']}"
    assert out["decide"]["api"].endswith(f"/api/runs/{out['run_id']}/decisions")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("answer", ["approve", "reject"])
def test_a_gate_is_answered_through_elicitation(project: Path, mode: str,
                                                answer: str) -> None:
    """legacy: elicitation/create mid-call; auto (2026-07-28): input_required, then the
    call again with the answer."""
    asked: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept",
                                  content={"decision": answer, "comment": "looks fine"})

    async def call() -> types.CallToolResult:
        async with Client(stdio_params(project), mode=mode,  # type: ignore[arg-type]
                          elicitation_callback=elicit) as c:
            return await c.call_tool("asked", {"n": 2})

    res = anyio.run(call)
    assert len(asked) == 1 and "'gate'" in asked[0]
    run = res.structured_content
    assert run["status"] == ("COMPLETED" if answer == "approve" else "REJECTED")
    gate = run["state"]["gate"]
    assert gate["decision"] == ("approved" if answer == "approve" else "rejected")
    assert gate["by"].startswith("mcp:")
    assert gate["comment"] == "looks fine"
    # the decision is recorded via: mcp
    traced = _cli(project, "trace", run["run_id"], "--json")
    decided = [r for r in json.loads(traced.stdout) if r["type"] == "approval.decided"]
    assert [r.get("data", r).get("via") for r in decided] == ["mcp"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_declined_elicitation_leaves_the_gate_waiting(project: Path, mode: str) -> None:
    asked: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    async def call() -> types.CallToolResult:
        async with Client(stdio_params(project), mode=mode,  # type: ignore[arg-type]
                          elicitation_callback=elicit) as c:
            return await c.call_tool("asked", {"n": 2})

    out = anyio.run(call).structured_content
    assert len(asked) == 1  # asked once: a declined question is not asked again
    assert out["status"] == "WAITING_APPROVAL"
    assert out["decide"]["cli"].startswith(f"interlock resume {out['run_id']}")


def test_a_workflows_path_that_is_not_there_is_a_usage_error(project: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "interlock", "mcp", "--workflows", "nowhere"],
                          cwd=project, text=True, capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": pythonpath(project)})
    assert proc.returncode == 2
    assert proc.stdout == ""  # (stdout is the protocol's)
    assert "error: --workflows nowhere: no such file or folder" in proc.stderr
