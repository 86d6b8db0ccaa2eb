"""The workflows endpoints: the registered workflows, one's definition and graph, and
starting a run of one."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Response

from interlock import RunExists, Workflow
from interlock.support import to_mermaid

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


def graph_of(spec: Any) -> Graph:
    """A definition's graph as the API shows it: nodes, edges (in order), Mermaid."""
    nodes = [{"name": n, **ns.model_dump(mode="json", exclude_none=True,
                                          exclude_defaults=True)}
             for n, ns in spec.nodes.items()]
    edges = [e.model_dump(mode="json", by_alias=True, exclude_none=True,
                          exclude_defaults=True) for e in spec.edges]
    return Graph(nodes=nodes, edges=edges, mermaid=to_mermaid(spec),
                 layout=layout(nodes, edges))


async def graph_off_loop(spec: Any) -> Graph:
    """`graph_of` on a worker thread: a large graph's first layout takes a while (a
    chain of a thousand nodes about a second), which the API's loop does not wait for."""
    return await anyio.to_thread.run_sync(graph_of, spec)


@router.get("/api/workflows", response_model=list[WorkflowInfo])
async def workflows(server: Srv, who: Reader) -> list[dict[str, Any]]:
    return [{"name": n, "description": wf.spec.description or "",
             "hash": wf.definition_hash()} for n, wf in sorted(server.workflows.items())]

@router.get("/api/workflows/{name}", response_model=WorkflowDetail)
async def workflow(name: str, server: Srv, who: Reader) -> dict[str, Any]:
    wf = _workflow(server, name)
    return {"name": name, "description": wf.spec.description or "",
            "hash": wf.definition_hash(), "definition": wf.definition(),
            "graph": await graph_off_loop(wf.spec)}

@router.post("/api/workflows/{name}/runs", response_model=RunObject, status_code=201,
          responses={200: {"model": RunObject,
                           "description": "the run_id exists with the same workflow "
                                          "and input: that run"}})
async def start(name: str, body: StartRun, response: Response, server: Srv,
                who: Operator) -> dict[str, Any]:
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
