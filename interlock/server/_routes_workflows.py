"""The workflows endpoints: the registered workflows, one's definition and graph, and
starting a run of one."""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import APIRouter, Response

from interlock import RunExists, Workflow, WorkflowSpec
from interlock.support import describe_trigger, run_json, to_mermaid

from ._deps import Operator, Reader, Srv
from ._guard import Problemed
from ._layout import layout
from ._models import Graph, RunObject, StartRun, WorkflowDetail, WorkflowInfo
from ._service import Server

router = APIRouter()


def _workflow(server: Server, name: str) -> Workflow:
    wf = server.workflows.get(name)
    if wf is None:
        known = ", ".join(sorted(server.workflows)) or "none (start the server with --workflows)"
        raise Problemed(404, "Not Found", f"no workflow {name!r} is registered; registered: "
                        f"{known}")
    return wf


def graph_of(spec: WorkflowSpec) -> Graph:
    """A definition's graph as the API shows it: nodes, edges (in order), Mermaid."""
    nodes = [{"name": n, **ns.model_dump(mode="json", exclude_none=True,
                                          exclude_defaults=True)}
             for n, ns in spec.nodes.items()]
    edges = [e.model_dump(mode="json", by_alias=True, exclude_none=True,
                          exclude_defaults=True) for e in spec.edges]
    return Graph(nodes=nodes, edges=edges, mermaid=to_mermaid(spec),
                 layout=layout(nodes, edges))


async def graph_off_loop(spec: WorkflowSpec) -> Graph:
    """`graph_of` on a worker thread: a large graph's first layout takes a while (a
    chain of a thousand nodes about a second), which the API's loop does not wait for."""
    return await anyio.to_thread.run_sync(graph_of, spec)


def _kind(wf: Workflow) -> str:
    """chat for a conversation's workflow, graph for the others."""
    return "chat" if wf.spec.chat is not None else "graph"


@router.get("/api/workflows", response_model=list[WorkflowInfo])
async def workflows(server: Srv, who: Reader) -> list[dict[str, object]]:
    return [{"name": n, "description": wf.spec.description or "",
             "hash": wf.definition_hash(), "kind": _kind(wf)}
            for n, wf in sorted(server.workflows.items())]

@router.get("/api/workflows/{name}", response_model=WorkflowDetail)
async def workflow(name: str, server: Srv, who: Reader) -> dict[str, object]:
    wf = _workflow(server, name)
    return {"name": name, "description": wf.spec.description or "",
            "hash": wf.definition_hash(), "kind": _kind(wf), "definition": wf.definition(),
            "graph": await graph_off_loop(wf.spec)}

@router.post("/api/workflows/{name}/runs", response_model=RunObject, status_code=201,
          responses={200: {"model": RunObject,
                           "description": "the run_id exists with the same workflow "
                                          "and input: that run"}})
async def start(name: str, body: StartRun, response: Response, server: Srv,
                who: Operator) -> dict[str, object]:
    wf = _workflow(server, name)
    try:
        return (await server.begin(name, body.input, body.run_id,
                                   body.config or None)).to_json()
    except RunExists:
        assert body.run_id is not None
        row = await server.st.get_run(body.run_id)
        same = (row.workflow == name and row.definition_hash == wf.definition_hash()
                and row.input == body.input
                and (row.options.get("config") or {}) == body.config)
        if not same:
            raise Problemed(409, "Conflict", f"a run with id {body.run_id!r} already "
                            "exists with another workflow, input or config; choose "
                            "another run_id") from None
        response.status_code = 200
        return await server.run_object(body.run_id)


_LAST_RUN_SCAN = 5000  # runs of a workflow read, newest first, for its triggers' last runs


@router.get("/api/schedules", responses={200: {"description": "each registered workflow's "
                                                             "triggers: `workflow, id, kind, "
                                                             "what, input, next, next_utc, "
                                                             "run_prefix, last_run`"}})
async def schedules(server: Srv, who: Reader) -> list[dict[str, object]]:
    """Each trigger of the registered workflows (as ``interlock triggers`` lists them):
    what it is, its next fire (Unix time and UTC) and the last run it started (among
    its workflow's newest 5,000 runs; null when none)."""
    now = time.time()
    out: list[dict[str, Any]] = []
    for name, wf in sorted(server.workflows.items()):
        if not wf.spec.triggers:
            continue
        shown = []
        for t in wf.spec.triggers:
            try:
                d = describe_trigger(name, t, now)
            except ValueError as exc:  # validated at load: a croniter refusal all the same
                d = {"workflow": name, "kind": t.kind, "error": str(exc), "run_prefix": None}
            d["last_run"] = None
            shown.append(d)
        await _last_runs(server, name, shown)
        out.extend(shown)
    return out


async def _last_runs(server: Server, workflow: str, shown: list[dict[str, Any]]) -> None:
    wanted = [d for d in shown if d.get("run_prefix")]
    before, read = None, 0
    while wanted and read < _LAST_RUN_SCAN:
        rows = await server.st.list_page(workflow=workflow, limit=500, before=before)
        for row in rows:
            for d in list(wanted):
                if row.run_id.startswith(d["run_prefix"]):
                    d["last_run"] = run_json(row)
                    wanted.remove(d)
        read += len(rows)
        if len(rows) < 500:
            return
        before = (rows[-1].created_at, rows[-1].run_id)
