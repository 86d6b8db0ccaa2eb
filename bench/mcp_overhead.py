"""What a run through ``/mcp`` costs over the same run through the REST API
(docs/mcp.md).

Starts ``interlock serve`` on a loopback port over a SQLite store with a workflow of
``--nodes`` trivial nodes, then times, alternating, ``--trials`` runs each way, from the
client's request to the run's final state in hand:

- **rest**: ``POST /api/workflows/{name}/runs`` (201 at once, the run executing), then
  ``GET /api/runs/{id}/events`` until ``run.completed`` -- the API's way to wait;
- **rest-poll**: the same start, then ``GET /api/runs/{id}`` every 5 ms until it is no
  longer RUNNING;
- **mcp**: one ``tools/call`` of the workflow's tool on an open session of the MCP SDK's
  client (2026-07-28 protocol, the SDK's default), which answers with the final state;
- **mcp+connect**: the same with a new client session per call (connect, call, close);
- **mcp-task**: the call from a client of MCP's tasks extension, answered with a task at
  once, then ``tasks/get`` every 5 ms until the task is completed (its result inlined).

Prints the medians (ms) and the difference mcp - rest.

    python bench/mcp_overhead.py [--nodes 3] [--trials 40]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import httpx
from _serve import served

NODES = "def step(state):\n    return {'n': state.get('n', 0) + 1}\n"


def flow(nodes: int) -> str:
    names = [f"s{i}" for i in range(nodes)]
    body = "".join(f"  {n}: bnodes:step\n" for n in names)
    chain = ["START", *names, "END"]
    edges = "".join(f"  - {{from: {a}, to: {b}}}\n" for a, b in itertools.pairwise(chain))
    return f"workflow: chain\ninput: [n]\nnodes:\n{body}edges:\n{edges}"


async def rest(client: httpx.AsyncClient) -> float:
    t0 = time.perf_counter()
    r = await client.post("/api/workflows/chain/runs", json={"input": {"n": 0}})
    run_id = r.json()["run_id"]
    async with client.stream("GET", f"/api/runs/{run_id}/events") as events:
        async for line in events.aiter_lines():
            if line.startswith("event: run.completed"):
                break
    run = (await client.get(f"/api/runs/{run_id}")).json()
    assert run["status"] == "COMPLETED", run
    return (time.perf_counter() - t0) * 1000


async def rest_poll(client: httpx.AsyncClient, every: float = 0.005) -> float:
    t0 = time.perf_counter()
    r = await client.post("/api/workflows/chain/runs", json={"input": {"n": 0}})
    run = r.json()
    while run["status"] == "RUNNING":
        await asyncio.sleep(every)
        run = (await client.get(f"/api/runs/{run['run_id']}")).json()
    assert run["status"] == "COMPLETED", run
    return (time.perf_counter() - t0) * 1000


async def mcp_call(session: object) -> float:
    t0 = time.perf_counter()
    res = await session.call_tool("chain", {"n": 0})  # type: ignore[attr-defined]
    assert res.structured_content["status"] == "COMPLETED", res
    return (time.perf_counter() - t0) * 1000


async def mcp_connect(url: str) -> float:
    from mcp import Client

    t0 = time.perf_counter()
    async with Client(f"{url}/mcp") as c:
        res = await c.call_tool("chain", {"n": 0})
        assert res.structured_content["status"] == "COMPLETED", res
    return (time.perf_counter() - t0) * 1000


def tasks_extension() -> Any:
    """The client side of the tasks extension, as small as the SDK's extension API
    allows: it claims ``resultType: task`` (this bench polls the task itself)."""
    import mcp_types as types
    from mcp.client.extension import ClientExtension, ResultClaim

    class Handle(types.Result):
        result_type: Literal["task"] = "task"
        task_id: str
        status: str

    async def unused(handle: Handle, ctx: Any) -> types.CallToolResult:
        raise AssertionError("the bench polls the task itself")

    class Tasks(ClientExtension):
        identifier = "io.modelcontextprotocol/tasks"

        def claims(self) -> list[ResultClaim[Any]]:
            return [ResultClaim(result_type="task", model=Handle, resolve=unused)]

    return Tasks()


async def mcp_task(session: Any, every: float = 0.005) -> float:
    import mcp_types as types

    class Ref(types.RequestParams):
        task_id: str

    class Get(types.Request[Ref, Literal["tasks/get"]]):
        method: Literal["tasks/get"] = "tasks/get"
        params: Ref

    class Got(types.Result):
        status: str
        result: dict[str, Any] | None = None

    t0 = time.perf_counter()
    handle = await session.session.call_tool("chain", {"n": 0}, allow_claimed=True)
    task = Got(status=handle.status)
    while task.status not in ("completed", "failed", "cancelled"):
        await asyncio.sleep(every)
        task = await session.session.send_request(Get(params=Ref(task_id=handle.task_id)),
                                                  Got)
    assert task.result and task.result["structuredContent"]["status"] == "COMPLETED", task
    return (time.perf_counter() - t0) * 1000


async def measure(url: str, trials: int) -> dict[str, list[float]]:
    from mcp import Client

    out: dict[str, list[float]] = {"rest": [], "rest-poll": [], "mcp": [], "mcp+connect": [],
                                   "mcp-task": []}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http, \
            Client(f"{url}/mcp") as session, \
            Client(f"{url}/mcp", extensions=[tasks_extension()]) as tasked:
        for _ in range(3):  # warm-up: imports, first connections, the store's pages
            await rest(http)
            await rest_poll(http)
            await mcp_call(session)
            await mcp_connect(url)
            await mcp_task(tasked)
        for i in range(trials):
            order = [("rest", lambda: rest(http)), ("rest-poll", lambda: rest_poll(http)),
                     ("mcp", lambda: mcp_call(session)),
                     ("mcp+connect", lambda: mcp_connect(url)),
                     ("mcp-task", lambda: mcp_task(tasked))]
            k = i % len(order)
            for name, fn in order[k:] + order[:k]:  # alternate who goes first
                out[name].append(await fn())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--trials", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bnodes.py").write_text(NODES)
        (root / "flows").mkdir()
        (root / "flows" / "chain.yaml").write_text(flow(args.nodes))
        with served(root, "--store", f"sqlite:///{root / 'runs.db'}", "--workflows",
                    "flows") as url:
            times = asyncio.run(measure(url, args.trials))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"nodes": args.nodes, "trials": args.trials,
                      **{f"{k}_ms": round(v, 2) for k, v in med.items()}}))
    print(f"{'path':<14}{'median ms':>10}")
    for k, v in med.items():
        print(f"{k:<14}{v:>10.2f}")
    best = min(med["rest"], med["rest-poll"])
    print(f"/mcp adds {med['mcp'] - best:+.2f} ms over the faster REST path (an open "
          f"session), {med['mcp+connect'] - best:+.2f} ms with a session per call, "
          f"{med['mcp-task'] - best:+.2f} ms as a task polled every 5 ms")


if __name__ == "__main__":
    main()
