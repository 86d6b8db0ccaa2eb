"""MCP tasks: a workflow's run served as a task of the tasks extension
(``io.modelcontextprotocol/tasks``) of the 2026-07-28 protocol.

A client that declares the extension in a ``tools/call``'s capabilities gets, for a
workflow's tool, a task at once instead of a result: the run is started (durably: it is
in the store before the answer leaves) and executes on, and the task's id is the run's.
``tasks/get`` reads the run: ``working`` while it runs, ``input_required`` while a gate
waits (its question in ``inputRequests``, as elicitation asks it), ``completed`` when it
ended (the tool's result inlined -- a failed or rejected run is a result marked
``isError``, as a call's is), ``cancelled``. ``tasks/update`` answers the gate's question
(a decision, ``by`` the caller, ``via: mcp``); ``tasks/cancel`` cancels the run. The
conversation tool and ``interlock_run_status`` answer as calls always do.

The SDK (mcp 2.3) carries neither this extension nor the 2025-11-25 tasks: it lets a
server register request methods of its own and answer ``tools/call`` with an
extension's ``resultType``, which is what this module does; see docs/mcp.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field, ValidationError

from interlock import RunNotFound, UsageError
from interlock.support import gate_text

from ._runs import Caller, Refused, Runs

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server

    from interlock import Decision

TASKS = "io.modelcontextprotocol/tasks"
POLL_MS = 500  # what a task suggests as a polling interval
_WORKING = frozenset({"PENDING", "RUNNING", "RETRYING"})
_INVALID_PARAMS = -32602
_METHOD_NOT_FOUND = -32601

class TaskParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel``: ``{taskId, requestState?}``."""

    task_id: str = Field(min_length=1)
    request_state: str | None = None


class UpdateParams(TaskParams):
    """``tasks/update``: the answers to the task's ``inputRequests``."""

    input_responses: dict[str, Any] = Field(default_factory=dict)


def wanted(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client takes a task (it declares the extension, on the
    2026-07-28 protocol: the legacy handshakes cannot carry it)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = ctx.session.client_capabilities
    return caps is not None and TASKS in (caps.extensions or {})


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def gate_key(waiting: dict[str, Any]) -> str:
    """The ``inputRequests`` key of one gate's question: unique over the task's life
    (the node and when it was asked)."""
    asked = f"{waiting.get('node')}@{waiting.get('requested_at')}"
    return "gate-" + hashlib.sha256(asked.encode()).hexdigest()[:16]


def task_of(run: dict[str, Any], times: tuple[float, float]) -> dict[str, Any]:
    """The task (no result, no question) of a run as it stands."""
    status = run["status"]
    task: dict[str, Any] = {
        "taskId": run["run_id"], "createdAt": _iso(times[0]), "lastUpdatedAt": _iso(times[1]),
        "ttlSeconds": None, "pollIntervalMilliseconds": POLL_MS}
    if status in _WORKING:
        task.update(status="working", statusMessage=f"run {run['run_id']} is {status}")
    elif status == "WAITING_APPROVAL":
        waiting = run.get("waiting") or {}
        unknown = f": {gate_text.headline(waiting)}" if gate_text.is_unknown(waiting) else ""
        task.update(status="input_required", statusMessage=(
            f"run {run['run_id']} waits for a decision at {waiting.get('node')!r}{unknown}"))
    elif status == "CANCELLED":
        task.update(status="cancelled", statusMessage=f"run {run['run_id']} was cancelled")
    else:
        task.update(status="completed", statusMessage=f"run {run['run_id']} is {status}")
    return task


class Tasks:
    """The ``tasks/*`` methods on an MCP low-level server, over `Runs`."""

    def __init__(self, runs: Runs, answer: Callable[[dict[str, Any]], types.CallToolResult],
                 question: Callable[[dict[str, Any], dict[str, Any]],
                                    types.ElicitRequestFormParams],
                 decision: Callable[[types.ElicitResult | None, str, Caller],
                                    Decision | None]) -> None:
        """``answer``: a stopped run's tool result; ``question``: a gate's form;
        ``decision``: an answered form as a decision (None: declined)."""
        self.runs, self.answer, self.question, self.decision = runs, answer, question, decision

    def serve(self, server: Server[Any]) -> None:
        server.extensions[TASKS] = {}
        server.add_request_handler("tasks/get", TaskParams, self._guarded(self.get))
        server.add_request_handler("tasks/update", UpdateParams, self._guarded(self.update))
        server.add_request_handler("tasks/cancel", TaskParams, self._guarded(self.cancel))

    def _guarded(self, method: Callable[[Caller, Any], Awaitable[dict[str, Any]]]
                 ) -> Callable[[ServerRequestContext[Any, Any], Any],
                               Awaitable[dict[str, Any]]]:
        """Served on the 2026-07-28 protocol only; a refusal is a JSON-RPC error saying
        why, naming the run."""
        async def handle(ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                raise MCPError(code=_METHOD_NOT_FOUND, message=(
                    f"{ctx.method} is served with the tasks extension of the 2026-07-28 "
                    "protocol; this connection speaks " + str(ctx.protocol_version)))
            try:
                return await method(self.runs.caller(ctx), params)
            except RunNotFound:
                raise MCPError(code=_INVALID_PARAMS, message=(
                    f"there is no task {params.task_id!r}: no run of that id in this "
                    "store")) from None
            except (Refused, UsageError) as exc:
                raise MCPError(code=_INVALID_PARAMS, message=str(exc)) from None
        return handle

    async def start(self, name: str, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        """``tools/call`` answered with a task: the run started, executing on."""
        run = await self.runs.start(name, args, caller)
        return {"resultType": "task",
                **task_of(run, await self.runs.times(run["run_id"]))}

    async def get(self, caller: Caller, params: TaskParams) -> dict[str, Any]:
        caller.refuse("read", "read runs")
        run = await self.runs.status(params.task_id, caller)
        task = task_of(run, await self.runs.times(params.task_id))
        if task["status"] == "completed":
            task["result"] = self.answer(run).model_dump(by_alias=True, mode="json",
                                                         exclude_none=True)
        elif task["status"] == "input_required":
            waiting = run.get("waiting") or {}
            ask = types.ElicitRequest(params=self.question(run, waiting))
            task["inputRequests"] = {gate_key(waiting): ask.model_dump(
                by_alias=True, mode="json", exclude_none=True)}
        return task

    async def update(self, caller: Caller, params: UpdateParams) -> dict[str, Any]:
        """The gate's answer as a decision; responses to other keys (answered already,
        or never asked) are ignored, as the extension says."""
        run = await self.runs.status(params.task_id, caller)
        waiting = run.get("waiting") or {}
        given = params.input_responses.get(gate_key(waiting)) \
            if run["status"] == "WAITING_APPROVAL" else None
        if given is None:
            return {}
        caller.refuse("decide", "decide approvals")
        try:
            answer = types.ElicitResult.model_validate(given)
        except ValidationError as exc:
            raise UsageError(f"the answer to the question of task {params.task_id!r} is not "
                             f"an elicitation result ({exc.error_count()} errors: "
                             f"{exc.errors()[0]['msg']})") from None
        decision = self.decision(answer, str(waiting.get("node")), caller)
        if decision is not None:  # (declined: the gate waits on)
            await self.runs.decide_soon(params.task_id, decision, caller)
        return {}

    async def cancel(self, caller: Caller, params: TaskParams) -> dict[str, Any]:
        caller.refuse("operate", "cancel runs")
        await self.runs.cancel(params.task_id, caller)
        return {}
