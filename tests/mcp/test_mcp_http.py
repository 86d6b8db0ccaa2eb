"""``/mcp`` on a real ``interlock serve`` (a subprocess on loopback), driven by the MCP
SDK's own client over streamable HTTP: the tools, a call to completion, a call that
waits (decided through the API, then read with interlock_run_status), the tokens and
roles of ``--auth`` (401 without a token, a viewer refused and no run started), a gate
answered through elicitation by an approver."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp_project import client, project, served
from test_server import TOKENS, Served

pytest.importorskip("mcp")
pytest.importorskip("fastapi")

__all__ = ["project", "served"]  # the fixtures, used by name

import mcp_types as types


def test_tools_and_a_call_to_completion_with_progress(served: Served) -> None:
    progress: list[str | None] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def go() -> tuple[list[types.Tool], types.CallToolResult]:
        async with client(served, "olga") as c:
            tools = (await c.list_tools()).tools
            return tools, await c.call_tool("plain", {"n": 1}, progress_callback=on_progress)

    tools, res = anyio.run(go)
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"gated", "plain", "asked", "talk", "interlock_run_status"}
    assert by_name["gated"].input_schema["required"] == ["n"]
    assert not res.is_error
    run = res.structured_content
    assert run["status"] == "COMPLETED" and run["state"]["last"] == 4
    assert progress == ["node first completed", "node last completed"]
    with served.client(TOKENS["vic"][0]) as http:  # the same run, through the API
        assert http.get(f"/api/runs/{run['run_id']}").json()["state"] == run["state"]


def test_a_waiting_call_is_decided_through_the_api(served: Served) -> None:
    async def call() -> types.CallToolResult:
        async with client(served, "olga") as c:  # an operator: no elicitation (and none asked)
            return await c.call_tool("gated", {"n": 1})

    out = anyio.run(call).structured_content
    run_id = out["run_id"]
    assert out["status"] == "WAITING_APPROVAL" and out["waiting"]["node"] == "gate"
    # (under serve's --public-url, by default http://HOST:PORT as given: here port 0)
    assert out["decide"]["url"].endswith(f"/approvals?run_id={run_id}")
    assert out["decide"]["api"].endswith(f"/api/runs/{run_id}/decisions")
    with served.client(TOKENS["alice"][0]) as http:
        r = http.post(f"/api/runs/{run_id}/decisions", json={"decision": "approve"})
        assert r.status_code == 200, r.text

    async def status() -> dict[str, Any]:
        async with client(served, "vic") as c:  # a viewer reads
            for _ in range(300):
                run = (await c.call_tool("interlock_run_status",
                                         {"run_id": run_id})).structured_content
                if run["status"] != "RUNNING":
                    return run
                await anyio.sleep(0.05)
            return run

    after = anyio.run(status)
    assert after["status"] == "COMPLETED"
    assert after["state"]["gate"]["by"] == "alice"


def test_no_token_is_401_and_a_viewer_may_not_start_a_run(served: Served) -> None:
    with served.client() as http:
        r = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                      headers={"Accept": "application/json, text/event-stream"})
        assert r.status_code == 401
        assert r.headers["content-type"].startswith("application/problem+json")
        assert http.get("/mcp").status_code == 401
    with served.client("not-a-token") as http:
        r = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 401

    async def call() -> types.CallToolResult:
        async with client(served, "vic") as c:
            return await c.call_tool("plain", {"n": 1})

    res = anyio.run(call)
    assert res.is_error
    assert "vic (roles: viewer) may not start runs" in res.content[0].text  # type: ignore[union-attr]
    with served.client(TOKENS["ada"][0]) as http:
        assert http.get("/api/runs").json()["runs"] == []  # no run was started


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_an_approver_answers_a_gate_through_elicitation(served: Served, mode: str) -> None:
    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async def call() -> types.CallToolResult:
        async with client(served, "ada", mode=mode, elicitation_callback=elicit) as c:
            return await c.call_tool("asked", {"n": 3})

    run = anyio.run(call).structured_content
    assert run["status"] == "COMPLETED"
    assert run["state"]["gate"]["by"] == "ada"
    assert run["state"]["gate"]["comment"] is None  # (nothing added to the person's words)
    with served.client(TOKENS["ada"][0]) as http:
        log = http.get(f"/api/runs/{run['run_id']}/records").json()
    decided = [r for r in log if r["type"] == "approval.decided"]
    assert [r.get("data", r).get("via") for r in decided] == ["mcp"]  # recorded where it came from
