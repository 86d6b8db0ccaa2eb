"""MCP tasks (the ``io.modelcontextprotocol/tasks`` extension of the 2026-07-28
protocol): a workflow's run served as a task, driven by the MCP SDK's own client -- with
a client extension of the test's own that claims the ``task`` result and polls it, as
the SDK lets a client do -- over stdio (``interlock mcp``) and at ``/mcp`` of a real
``interlock serve``: a task polled to completion; ``input_required`` at a gate, answered
with ``tasks/update`` (a decision recorded ``via: mcp``); ``tasks/cancel`` cancelling
the run; a legacy client (no extension on its handshake) answered as before."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from mcp_project import cli as _cli
from mcp_project import client as mcp_client
from mcp_project import project, served, stdio_params
from test_server import TOKENS, Served

pytest.importorskip("mcp")

__all__ = ["project", "served"]  # the fixtures, used by name

import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")


class TaskHandle(types.Result):
    """A ``tools/call`` answered with a task (``resultType: task``)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_seconds: int | None = None
    poll_interval_milliseconds: int | None = None


class DetailedTask(types.Result):
    """What ``tasks/get`` answers."""

    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    result: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskRef(types.RequestParams):
    task_id: str


class UpdateParams(TaskRef):
    input_responses: dict[str, Any]


class GetTask(types.Request[TaskRef, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskRef


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams


class CancelTask(types.Request[TaskRef, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskRef


async def get(session: ClientSession, task_id: str) -> DetailedTask:
    return await session.send_request(GetTask(params=TaskRef(task_id=task_id)), DetailedTask)


async def poll(session: ClientSession, task_id: str,
               until: Sequence[str] = TERMINAL) -> list[DetailedTask]:
    """``tasks/get`` until the task's status is one of ``until``: every answer."""
    seen: list[DetailedTask] = []
    with anyio.fail_after(60):
        while not seen or seen[-1].status not in until:
            if seen:
                await anyio.sleep(0.05)
            seen.append(await get(session, task_id))
    return seen


Answerer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class Tasks(ClientExtension):
    """The client side of the tasks extension, as a test writes it with the SDK's
    extension API: a ``task`` result is polled to its end, a question answered."""

    identifier = TASKS

    def __init__(self, answer: Answerer | None = None) -> None:
        self.answer, self.seen = answer, list[str]()

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        self.seen.append(handle.status)
        answered: set[str] = set()
        while True:
            task = (await poll(ctx.session, handle.task_id,
                               (*TERMINAL, "input_required")))[-1]
            self.seen.append(task.status)
            if task.status in TERMINAL:
                assert task.result is not None, task
                return types.CallToolResult.model_validate(task.result)
            for key, request in (task.input_requests or {}).items():
                if key not in answered and self.answer is not None:
                    answered.add(key)
                    await ctx.session.send_request(UpdateTask(params=UpdateParams(
                        task_id=handle.task_id,
                        input_responses={key: await self.answer(request)})), types.Result)


async def approve(request: dict[str, Any]) -> dict[str, Any]:
    assert request["method"] == "elicitation/create"
    return {"action": "accept", "content": {"decision": "approve", "comment": "ok"}}


def _status(root: Path, run_id: str) -> dict[str, Any]:
    return dict(json.loads(_cli(root, "status", run_id, "--json").stdout))


def test_a_run_is_a_task_polled_to_completion(project: Path) -> None:
    ext = Tasks()

    async def go() -> tuple[types.CallToolResult, types.Result]:
        async with Client(stdio_params(project), mode="auto", extensions=[ext]) as c:
            transparent = await c.call_tool("plain", {"n": 4})
            raw = await c.session.call_tool("plain", {"n": 5}, allow_claimed=True)
            return transparent, raw

    res, raw = anyio.run(go)
    assert ext.seen[0] in ("working", "completed") and ext.seen[-1] == "completed"
    assert not res.is_error and res.structured_content is not None
    assert res.structured_content["status"] == "COMPLETED"
    assert res.structured_content["state"]["last"] == 10
    # the handle itself: its task id is the run's, in the store at once
    assert isinstance(raw, TaskHandle)
    assert raw.ttl_seconds is None and raw.poll_interval_milliseconds
    assert _status(project, raw.task_id)["workflow"] == "plain"


def test_a_gate_is_input_required_and_answered_with_tasks_update(project: Path) -> None:
    async def go() -> tuple[list[DetailedTask], list[DetailedTask]]:
        async with Client(stdio_params(project), mode="auto", extensions=[Tasks()]) as c:
            handle = await c.session.call_tool("asked", {"n": 2}, allow_claimed=True)
            assert isinstance(handle, TaskHandle)
            asking = await poll(c.session, handle.task_id, ("input_required",))
            key, request = next(iter((asking[-1].input_requests or {}).items()))
            # an answer to a key never asked is ignored (the gate waits on)
            await c.session.send_request(UpdateTask(params=UpdateParams(
                task_id=handle.task_id, input_responses={"other": {"action": "accept"}})),
                types.Result)
            assert (await get(c.session, handle.task_id)).status == "input_required"
            with pytest.raises(MCPError, match="is not an elicitation result"):
                await c.session.send_request(UpdateTask(params=UpdateParams(
                    task_id=handle.task_id, input_responses={key: {"action": "maybe"}})),
                    types.Result)
            await c.session.send_request(UpdateTask(params=UpdateParams(
                task_id=handle.task_id, input_responses={key: await approve(request)})),
                types.Result)
            return asking, await poll(c.session, handle.task_id)

    asking, done = anyio.run(go)
    ask = asking[-1]
    request = next(iter((ask.input_requests or {}).values()))
    assert "'gate'" in request["params"]["message"]
    assert "waits for a decision at 'gate'" in (ask.status_message or "")
    assert done[-1].status == "completed"
    result = done[-1].result or {}
    assert result["structuredContent"]["status"] == "COMPLETED"
    gate = result["structuredContent"]["state"]["gate"]
    assert gate["decision"] == "approved" and gate["comment"] == "ok"
    assert gate["by"].startswith("mcp:")
    traced = json.loads(_cli(project, "trace", ask.task_id, "--json").stdout)
    decided = [r for r in traced if r["type"] == "approval.decided"]
    assert [r.get("data", r).get("via") for r in decided] == ["mcp"]


def test_tasks_cancel_cancels_the_run(project: Path) -> None:
    async def go() -> list[DetailedTask]:
        async with Client(stdio_params(project), mode="auto", extensions=[Tasks()]) as c:
            handle = await c.session.call_tool("asked", {"n": 2}, allow_claimed=True)
            assert isinstance(handle, TaskHandle)
            await poll(c.session, handle.task_id, ("input_required",))
            await c.session.send_request(CancelTask(params=TaskRef(task_id=handle.task_id)),
                                         types.Result)
            return await poll(c.session, handle.task_id)

    seen = anyio.run(go)
    assert seen[-1].status == "cancelled" and seen[-1].result is None
    assert _status(project, seen[-1].task_id)["status"] == "CANCELLED"


SLOW = """
workflow: slow
input: [n]
nodes:
  wait: slownodes:wait
edges:
  - {from: START, to: wait}
  - {from: wait, to: END}
"""

SLOW_NODES = """
import asyncio, pathlib

async def wait(state):
    pathlib.Path("started").write_text("")
    await asyncio.sleep(120)   # the test cancels the run here
    return {"waited": True}
"""


def test_tasks_cancel_stops_a_working_run_executing_in_the_process(project: Path) -> None:
    (project / "flows" / "slow.yaml").write_text(SLOW)
    (project / "slownodes.py").write_text(SLOW_NODES)

    async def go() -> tuple[list[DetailedTask], list[DetailedTask]]:
        async with Client(stdio_params(project), mode="auto", extensions=[Tasks()]) as c:
            handle = await c.session.call_tool("slow", {"n": 1}, allow_claimed=True)
            assert isinstance(handle, TaskHandle)
            working: list[DetailedTask] = []
            with anyio.fail_after(60):  # the node is in its sleep
                while not (project / "started").exists():
                    working.append(await get(c.session, handle.task_id))
                    await anyio.sleep(0.05)
            working.append(await get(c.session, handle.task_id))
            await c.session.send_request(CancelTask(params=TaskRef(task_id=handle.task_id)),
                                         types.Result)
            return working, await poll(c.session, handle.task_id)

    working, seen = anyio.run(go)
    assert working[-1].status == "working"
    assert seen[-1].status == "cancelled"
    status = _status(project, seen[-1].task_id)
    assert status["status"] == "CANCELLED" and "waited" not in status["state"]


def test_unknown_tasks_and_legacy_clients(project: Path) -> None:
    """An unknown task id is an error naming it; a handshake-protocol client (which
    cannot declare the extension) is answered as before, and has no tasks/*."""
    async def go() -> tuple[str, types.CallToolResult, str]:
        async with Client(stdio_params(project), mode="auto", extensions=[Tasks()]) as c:
            with pytest.raises(MCPError) as unknown:
                await get(c.session, "no-such-run")
        async with Client(stdio_params(project), mode="legacy", extensions=[Tasks()]) as c:
            res = await c.call_tool("plain", {"n": 1})
            with pytest.raises(MCPError) as legacy:
                await get(c.session, "no-such-run")
        return str(unknown.value), res, str(legacy.value)

    unknown, res, legacy = anyio.run(go)
    assert "there is no task 'no-such-run'" in unknown
    assert res.structured_content is not None
    assert res.structured_content["status"] == "COMPLETED"
    assert "tasks extension of the 2026-07-28 protocol" in legacy


def client(served: Served, who: str, **kwargs: Any) -> Any:
    """`mcp_project.client` in the SDK's ``auto`` mode (tasks where the server offers)."""
    return mcp_client(served, who, mode="auto", **kwargs)


def test_tasks_at_mcp_on_a_server_follow_roles(served: Served) -> None:
    """An operator's call is a task; a viewer may read it but not answer its question;
    an admin's answer decides the gate, and the run completes in the server's pool."""
    async def go() -> tuple[str, str, list[DetailedTask]]:
        async with client(served, "olga", extensions=[Tasks()]) as c:
            handle = await c.session.call_tool("asked", {"n": 3}, allow_claimed=True)
        assert isinstance(handle, TaskHandle)
        async with client(served, "vic", extensions=[Tasks()]) as c:
            asking = (await poll(c.session, handle.task_id, ("input_required",)))[-1]
            key = next(iter(asking.input_requests or {}))
            with pytest.raises(MCPError) as refused:
                await c.session.send_request(UpdateTask(params=UpdateParams(
                    task_id=handle.task_id,
                    input_responses={key: await approve({"method": "elicitation/create"})})),
                    types.Result)
        async with client(served, "ada", extensions=[Tasks()]) as c:
            await c.session.send_request(UpdateTask(params=UpdateParams(
                task_id=handle.task_id,
                input_responses={key: await approve({"method": "elicitation/create"})})),
                types.Result)
            return handle.task_id, str(refused.value), await poll(c.session, handle.task_id)

    run_id, refused, seen = anyio.run(go)
    assert "vic (roles: viewer) may not decide approvals" in refused
    assert seen[-1].status == "completed"
    with served.client(TOKENS["ada"][0]) as http:
        run = http.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "COMPLETED" and run["state"]["gate"]["by"] == "ada"


HELD_NODES = """
import asyncio, pathlib

async def wait(state):
    pathlib.Path("started").write_text("")
    while pathlib.Path("hold").exists():   # the test closes the client meanwhile
        await asyncio.sleep(0.05)
    return {"waited": True}
"""


def test_a_tasks_run_left_by_a_closed_interlock_mcp_is_resumable(project: Path) -> None:
    """The client goes away while its task's run executes in ``interlock mcp``: the
    process ends, the run stops where it was, and ``interlock resume`` finishes it."""
    (project / "flows" / "slow.yaml").write_text(SLOW)
    (project / "slownodes.py").write_text(HELD_NODES)
    (project / "hold").write_text("")

    async def go() -> str:
        async with Client(stdio_params(project), mode="auto", extensions=[Tasks()]) as c:
            handle = await c.session.call_tool("slow", {"n": 1}, allow_claimed=True)
            assert isinstance(handle, TaskHandle)
            with anyio.fail_after(60):
                while not (project / "started").exists():
                    await anyio.sleep(0.05)
            return handle.task_id

    run_id = anyio.run(go)
    assert _status(project, run_id)["status"] == "RUNNING"  # (nobody executes it now)
    (project / "hold").unlink()
    resumed = _cli(project, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    done = _status(project, run_id)
    assert done["status"] == "COMPLETED" and done["state"]["waited"] is True
    assert _cli(project, "verify", run_id).returncode == 0


BOTH = """
workflow: both
input: [n]
nodes:
  slow: slownodes:wait
  gate: {approval: {show: [n]}}
edges:
  - {from: START, to: slow}
  - {from: START, to: gate}
  - {from: slow, to: END}
  - {from: gate, to: END}
"""


def test_a_gate_answered_while_another_branch_still_runs(project: Path) -> None:
    """The run waits at a gate (input_required) while its other branch still executes
    in ``interlock mcp``: the answer is taken in by that execution, and the run
    completes once the branch is done -- executed once, not twice."""
    (project / "flows" / "both.yaml").write_text(BOTH)
    (project / "slownodes.py").write_text(HELD_NODES)
    (project / "hold").write_text("")

    async def go() -> list[DetailedTask]:
        async with Client(stdio_params(project), mode="auto", extensions=[Tasks()]) as c:
            handle = await c.session.call_tool("both", {"n": 1}, allow_claimed=True)
            assert isinstance(handle, TaskHandle)
            asking = (await poll(c.session, handle.task_id, ("input_required",)))[-1]
            with anyio.fail_after(60):
                while not (project / "started").exists():
                    await anyio.sleep(0.05)
            key, request = next(iter((asking.input_requests or {}).items()))
            await c.session.send_request(UpdateTask(params=UpdateParams(
                task_id=handle.task_id, input_responses={key: await approve(request)})),
                types.Result)
            (project / "hold").unlink()
            return await poll(c.session, handle.task_id)

    seen = anyio.run(go)
    assert seen[-1].status == "completed", seen[-1]
    run = (seen[-1].result or {})["structuredContent"]
    assert run["status"] == "COMPLETED" and run["state"]["waited"] is True
    assert run["state"]["gate"]["decision"] == "approved"
    traced = json.loads(_cli(project, "trace", run["run_id"], "--json").stdout)
    assert len([r for r in traced if r["type"] == "node.completed"
                and r.get("node") == "slow"]) == 1


def test_tasks_cancel_at_mcp_stops_a_run_in_the_servers_pool(project: Path) -> None:
    (project / "flows" / "slow.yaml").write_text(SLOW)
    (project / "slownodes.py").write_text(SLOW_NODES)
    served = Served(project, "--auth", "auth.yaml")
    try:
        async def go() -> tuple[str, list[DetailedTask]]:
            async with client(served, "olga", extensions=[Tasks()]) as c:
                handle = await c.session.call_tool("slow", {"n": 1}, allow_claimed=True)
                assert isinstance(handle, TaskHandle)
                with anyio.fail_after(60):
                    while not (project / "started").exists():
                        await anyio.sleep(0.05)
                assert (await get(c.session, handle.task_id)).status == "working"
            async with client(served, "vic", extensions=[Tasks()]) as c:
                with pytest.raises(MCPError) as refused:
                    await c.session.send_request(
                        CancelTask(params=TaskRef(task_id=handle.task_id)), types.Result)
            async with client(served, "olga", extensions=[Tasks()]) as c:
                await c.session.send_request(
                    CancelTask(params=TaskRef(task_id=handle.task_id)), types.Result)
                return str(refused.value), await poll(c.session, handle.task_id)

        refused, seen = anyio.run(go)
        assert "vic (roles: viewer) may not cancel runs" in refused
        assert seen[-1].status == "cancelled"
        with served.client(TOKENS["ada"][0]) as http:
            assert http.get(f"/api/runs/{seen[-1].task_id}").json()["status"] == "CANCELLED"
    finally:
        served.stop()
