"""A message to a conversation: ``POST /api/runs/{id}/messages {"text"}``.

202 once the message is recorded; the turn runs in the server's pool and its records
(the reply, tool calls, child runs, a gate it reaches) arrive on the run's event stream --
and, where the provider streams, the reply as it arrives, as ``chat.token`` events
(``{"run_id", "node", "turn", "text"}``, no id: they are not records of the log).
A run that is not waiting for a message refuses it (409) and records nothing. Under
``--auth`` the message's ``by`` is the token's name (``operator`` role).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import Field

import interlock
from interlock import UsageError

from ._deps import Operator, Srv
from ._guard import Problemed
from ._models import RunObject, _Body

router = APIRouter()


class MessageIn(_Body):
    text: str = Field(min_length=1, max_length=100_000)
    by: str | None = Field(default=None, max_length=200,
                           description="who sends it; ignored when the server has --auth "
                                       "(the token's name is recorded)")


@router.post("/api/runs/{run_id}/messages", response_model=RunObject, status_code=202)
async def message(run_id: str, body: MessageIn, server: Srv, who: Operator) -> dict[str, object]:
    row = await server.st.get_run(run_id)
    by = who.name if who.authenticated else (body.by or "local")

    async def turn(listen: Any, st: Any) -> Any:  # (its reply streams: `Server.launch`)
        return await interlock.send(run_id, body.text, by=by, store=st,
                                    workflow=server.workflows.get(row.workflow),
                                    listener=listen, detach=server.records_only)

    server.refuse_unkeyed(row.workflow, "the message was not taken")  # (409)
    async with server.lock(run_id):
        try:
            await server.launch(f"message to run {run_id}", run_id, row.workflow, turn)
        except UsageError as exc:
            raise Problemed(409, "Conflict", str(exc)) from None
    return await server.run_object(run_id)
