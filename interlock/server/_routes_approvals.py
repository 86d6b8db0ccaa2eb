"""The approvals endpoints: the inbox of gates waiting for a decision, and deciding one."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Response

from interlock import Decision, UsageError
from interlock.support import approvers_refuse, parse_definition

from ._deps import Approver, Reader, Srv
from ._guard import Problemed
from ._models import Approval, DecisionIn, RunObject

router = APIRouter()


@router.post("/api/runs/{run_id}/decisions", response_model=RunObject)
async def decide(run_id: str, body: DecisionIn, server: Srv,
                 who: Approver) -> dict[str, object]:
    row = await server.st.get_run(run_id)
    by = who.name if who.authenticated else (body.by or "local")
    roles = who.roles if who.authenticated else ()
    if body.decision == "modify":
        if not body.patch:
            raise UsageError("modify takes a non-empty JSON object of state fields to "
                             "replace (patch)")
    elif body.patch is not None or body.at is not None:
        raise UsageError(f"patch and at go with modify, not {body.decision}")
    waiting = row.summary.waiting or {}
    gate = body.node or waiting.get("node")
    if row.summary.status == "WAITING_APPROVAL" and gate:
        spec = parse_definition(row.definition)
        if gate in spec.nodes:
            refused = approvers_refuse(spec, gate, by, roles)
            if refused is not None:
                raise Problemed(403, "Forbidden", refused)
    decision = Decision(body.decision, by, body.comment, dict(body.patch or {}), body.at,
                        body.node, data=body.data, roles=tuple(roles),
                        requested_at=body.requested_at)
    await server.decide_gate(run_id, body.node, decision, via=body.via or "api")
    return await server.run_object(run_id)


@router.get("/api/approvals", response_model=list[Approval])
async def approvals(server: Srv, who: Reader, run_id: str | None = None) -> Response:
    """The gates waiting for a decision, from the waiting runs' summaries (each
    approval object kept per run at its last seq: no fold per request; sent as it
    is kept, not validated again); ``run_id``: that run's only (a child run's too,
    which the whole list has as its parent's rows)."""
    return Response(orjson.dumps(await server.approvals.list(server.st, run_id)),
                    media_type="application/json")
