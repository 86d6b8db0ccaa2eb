"""The MCP tools: one per registered workflow, and ``interlock_run_status``.

A call of a workflow's tool starts a run and answers when it stops: ended (its run
object as structured content, ``is_error`` for a failed or cancelled run) or waiting for
a person (``{run_id, status, waiting, decide}`` at once, ``decide`` saying how to
decide). Progress notifications follow the run's nodes as they complete.

Where the client can be asked (elicitation) and the caller may decide, a gate is
offered to the client first: on the handshake protocols (2025-11-25 and before) by an
``elicitation/create`` request in the middle of the call; on the 2026-07-28 protocol
(no server-to-client request) by answering ``input_required`` with the question, which
the client answers by calling again with the answer and the ``request_state`` (the run
and the gate, which is not trusted: the decision is checked as any decision is). An
accepted answer is a decision (``by`` the caller, ``via: mcp``), after which
the call follows the run again; a declined one leaves the gate waiting.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from interlock import Decision, RunNotFound, StoreError, UsageError
from interlock.support import decide_command, decision_flags, gate_text

from ._conversation import conversation_tool, converse, is_conversation, turn_answer
from ._runs import Caller, Refused, Runs
from ._tasks import Tasks, wanted

if TYPE_CHECKING:
    from interlock import Workflow

STATUS_TOOL = "interlock_run_status"
STOPPED = frozenset({"COMPLETED", "FAILED", "REJECTED", "CANCELLED", "WAITING_APPROVAL",
                     "WAITING_INPUT"})
_ERRORED = frozenset({"FAILED", "CANCELLED"})
_GATE_KEY = "gate"  # the key of the one input request a waiting call sends
# an unknown outcome's form field: the outcome a person checked by hand (approve records
# it as the action's result instead of running the action again)
CHECKED = "checked_outcome"
# a decision through elicitation is recorded ``via: mcp`` where `Decision` has the field
# (the per-gate decision path); else the comment says so
VIA: dict[str, Any] = {"via": "mcp"} if "via" in {
    f.name for f in dataclasses.fields(Decision)} else {}


def input_schema(wf: Workflow) -> dict[str, object]:
    """The tool's input schema: the workflow's ``input:`` fields, each required (the
    file names them, not their types: any JSON value); other fields are allowed, as a
    run's input may carry more than it declares."""
    fields = list(wf.spec.input)
    return {"type": "object",
            "properties": {f: {"description": f"the run's input field {f!r}"} for f in fields},
            "required": fields, "additionalProperties": True}


def _tool(wf: Workflow) -> types.Tool:
    if is_conversation(wf):
        return conversation_tool(wf)
    spec = wf.spec
    what = spec.description or f"Run the interlock workflow {spec.workflow!r}."
    return types.Tool(
        name=spec.workflow, input_schema=input_schema(wf),
        description=f"{what}\n\nRuns the workflow and returns its run object (final state "
                    "in `state`). A run that waits for a person returns at once with "
                    "`run_id`, `waiting` and `decide`; `interlock_run_status` follows it.")


_STATUS = types.Tool(
    name=STATUS_TOOL,
    description="The run object of an interlock run (status, state, waiting, error), as "
                "`interlock status RUN_ID --json` prints it.",
    input_schema={"type": "object", "properties": {"run_id": {"type": "string"}},
                  "required": ["run_id"], "additionalProperties": False})


def tools_server(runs: Runs, name: str = "interlock") -> Server[Any]:
    """The MCP server of ``runs``' workflows."""
    from interlock import __version__

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        tools = [_tool(wf) for _, wf in sorted(runs.workflows.items())]
        return types.ListToolsResult(tools=[*tools, _STATUS])

    tasks = Tasks(runs, lambda run: _result(run, error=run["status"] in _ERRORED),
                  _question, _decision)

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        try:
            if _as_task(runs, ctx, params):  # a run as an MCP task: answered at once
                caller = runs.caller(ctx)
                caller.refuse("operate", "start runs")
                return await tasks.start(params.name, dict(params.arguments or {}), caller)
            return await _Call(runs, ctx, params).answer()
        except (Refused, UsageError, RunNotFound) as exc:
            return _error(str(exc))
        except StoreError as exc:
            return _error(f"the store refused: {exc}")

    server: Server[Any] = Server(
        name, version=__version__, on_list_tools=list_tools,
        instructions=f"Each tool runs an interlock workflow; {STATUS_TOOL} reads a run.")
    # registered as a method (not on_call_tool), so that it may answer with a task
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)
    tasks.serve(server)
    return server


def _as_task(runs: Runs, ctx: ServerRequestContext[Any, Any],
             params: types.CallToolRequestParams) -> bool:
    """A workflow's call from a client of the tasks extension (not a conversation's
    turn, not the status tool, not the answer to a question)."""
    wf = runs.workflows.get(params.name)
    return wf is not None and not is_conversation(wf) and params.request_state is None \
        and wanted(ctx)


class _Call:
    """One ``tools/call``."""

    def __init__(self, runs: Runs, ctx: ServerRequestContext[Any, Any],
                 params: types.CallToolRequestParams) -> None:
        self.runs, self.ctx, self.params = runs, ctx, params
        self.done = 0  # nodes completed, for progress
        self.declined = False  # the client declined a gate's question: not asked again

    async def answer(self) -> types.CallToolResult | types.InputRequiredResult:
        runs, params = self.runs, self.params
        caller = runs.caller(self.ctx)
        args = dict(params.arguments or {})
        if params.name == STATUS_TOOL:
            caller.refuse("read", "read runs")
            run_id = args.get("run_id")
            if not isinstance(run_id, str) or not run_id:
                raise UsageError(f"{STATUS_TOOL} takes {{\"run_id\": \"...\"}}")
            return _result(await runs.status(run_id, caller), error=False)
        if params.name not in runs.workflows:
            known = ", ".join(sorted(runs.workflows)) or "(none)"
            raise UsageError(f"no workflow is named {params.name!r} here; the tools are: "
                             f"{known}, {STATUS_TOOL}")
        talk = is_conversation(runs.workflows[params.name])
        caller.refuse("operate", "talk in conversations" if talk else "start runs")
        if params.request_state is not None:  # the answer to a gate's question (2026-07-28)
            run = await self._answered(caller)
        elif talk:
            run = await converse(runs, params.name, args, caller, self.progress)
        else:
            run = await runs.call(params.name, args, caller, self.progress)
        return await self._stopped(run, caller)

    async def progress(self, rec: Mapping[str, object]) -> None:
        """A completed node, or (an agent's turn) a tool it called."""
        kind = rec.get("type")
        if kind in ("node.completed", "node.visited"):
            what = f"node {rec.get('node')} completed"
        elif kind == "tool.called":
            what = f"tool {rec.get('tool')} called"
        else:
            return
        self.done += 1
        await self.ctx.session.report_progress(self.done, None, what)

    async def _stopped(self, run: dict[str, Any], caller: Caller
                       ) -> types.CallToolResult | types.InputRequiredResult:
        """The answer for a run that stopped: asks the client about a gate while it can."""
        while run["status"] == "WAITING_APPROVAL" and caller.may("decide") and \
                not self.declined:
            gate = run.get("waiting") or {}
            if not self._can_elicit() or not gate.get("node"):
                break
            question = _question(run, gate)
            if self.ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                state = json.dumps({"run_id": run["run_id"], "gate": gate["node"]})
                return types.InputRequiredResult(
                    input_requests={_GATE_KEY: types.ElicitRequest(params=question)},
                    request_state=state)
            if not self.ctx.session.can_send_request:
                break
            answer = await self.ctx.session.elicit_form(
                question.message, question.requested_schema,
                related_request_id=self.ctx.request_id)
            decision = _decision(answer, gate["node"], caller)
            if decision is None:
                break
            run = await self.runs.decide(run["run_id"], decision, caller, self.progress)
        return self._final(run)

    def _final(self, run: dict[str, Any]) -> types.CallToolResult:
        """A workflow's run object (or its waiting shape); a conversation's turn."""
        error = run["status"] in _ERRORED
        wf = self.runs.workflows[self.params.name]
        if run["status"] == "WAITING_APPROVAL":
            waiting = self._waiting(run)
            if is_conversation(wf):
                waiting["reply"] = None
            return _result(waiting, error=error)
        if is_conversation(wf) and wf.spec.chat is not None:
            out, text, failed = turn_answer(run, wf.spec.chat)
            return _result(out, error=error or failed, text=text)
        return _result(run, error=error)

    async def _answered(self, caller: Caller) -> dict[str, Any]:
        """A retried call carrying a gate's answer: decided, then followed."""
        try:
            state = json.loads(self.params.request_state or "")
            run_id, gate = str(state["run_id"]), str(state["gate"])
        except (ValueError, TypeError, KeyError):
            raise UsageError("the request_state of this call is not one this server "
                             "sent (it names a run and a gate)") from None
        run = await self.runs.status(run_id, caller)
        if run.get("workflow") != self.params.name:
            raise UsageError(f"run {run_id!r} is not a run of {self.params.name!r}")
        answer = (self.params.input_responses or {}).get(_GATE_KEY)
        decision = (_decision(answer, gate, caller)
                    if isinstance(answer, types.ElicitResult) else None)
        if decision is None:
            self.declined = True
            return run
        caller.refuse("decide", "decide approvals")
        return await self.runs.decide(run_id, decision, caller, self.progress)

    def _can_elicit(self) -> bool:
        caps = self.ctx.session.client_capabilities
        return caps is not None and caps.elicitation is not None

    def _waiting(self, run: dict[str, Any]) -> dict[str, object]:
        """``{run_id, status, waiting, decide}``."""
        waiting = run.get("waiting") or {}
        return {"run_id": run["run_id"], "workflow": run.get("workflow"),
                "status": run["status"], "waiting": waiting,
                "decide": decide_hints(run["run_id"], waiting, self.runs.public_url,
                                       self.runs.store_hint)}


def decide_hints(run_id: str, waiting: dict[str, Any], public_url: str | None,
                 where: str = "") -> dict[str, object]:
    """How a person decides: ``cli``, the CLI's command for the oldest gate (``where``
    says which store or server it talks to), ``gates`` one per waiting gate when several
    wait, and with a public URL, the API's endpoint and the dashboard's inbox. A gate
    whose outcome is unknown (an approved action whose process died while it ran) gets
    its explanation in ``outcomes`` and, for its command, each decision it takes spelled
    out (``--approve`` alone runs the action AGAIN)."""
    gates = [g for g in waiting.get("pending") or () if isinstance(g, dict) and g.get("node")]
    kinds = {str(g["node"]): g for g in gates} | (
        {str(waiting["node"]): waiting} if waiting.get("node") else {})

    def cli(gate: str | None) -> str:
        w = kinds.get(str(gate)) or {}
        if gate is not None and gate_text.is_unknown(w):  # every choice, none by default
            return decide_command(run_id, gate, " | ".join(decision_flags(w)), where)
        cmd = ["interlock", "resume", run_id] + (["--gate", gate] if gate else [])
        return " ".join(map(shlex.quote, cmd)) + " --approve" + where

    pending = [str(g["node"]) for g in gates]
    out: dict[str, object] = {"cli": cli(waiting.get("node") if pending else None)}
    if len(pending) > 1:
        out["gates"] = {gate: cli(gate) for gate in pending}
    unknown = {gate: gate_text.unknown_lines(w, data="`" + decide_command(
        run_id, gate, f"--approve --data '{gate_text.data_example(w)}'", where) + "`")
        for gate, w in kinds.items() if gate_text.is_unknown(w)}
    if unknown:
        out["outcomes"] = unknown
    if public_url:
        base = public_url.rstrip("/")
        out["api"] = f"POST {base}/api/runs/{quote(run_id)}/decisions"
        out["url"] = f"{base}/approvals?run_id={quote(run_id)}"
    return out


def _question(run: dict[str, Any], gate: dict[str, Any]) -> types.ElicitRequestFormParams:
    """The form a gate is offered as: approve or reject, a comment, and the gate's own
    ``input:`` fields when they are flat (what a form can ask)."""
    props: dict[str, object] = {
        "decision": {"type": "string", "enum": ["approve", "reject"],
                     "description": "approve or reject"},
        "comment": {"type": "string", "description": "why (recorded with the decision)"}}
    required = ["decision"]
    extra = gate.get("input")
    if isinstance(extra, dict) and isinstance(extra.get("properties"), dict):
        for key, schema in extra["properties"].items():
            if key not in props and isinstance(schema, dict) and \
                    schema.get("type") in ("string", "number", "integer", "boolean"):
                props[key] = schema
        required += [k for k in extra.get("required", []) if k in props and k not in required]
    shown = json.dumps(gate_text.shown(gate), default=str)[:2000]
    message = (f"Run {run['run_id']} of workflow {run.get('workflow')!r} waits at the gate "
               f"{gate['node']!r} ({gate.get('kind', 'approval')}). It shows: {shown}. ")
    if gate_text.is_unknown(gate):  # approving runs the action again: said first
        example = gate_text.data_example(gate)
        props[CHECKED] = {"type": "string", "description": (
            "only if you checked by hand what happened: the outcome, as JSON (the "
            f"`result` of {example}); approve then records it and does NOT run it again")}
        lines = gate_text.unknown_lines(gate, data=f"approve with {CHECKED!r} filled in")
        message = f"{lines[0]}. {message}" + "; ".join(lines[1:]) + ". "
    message += "Approve or reject?"
    return types.ElicitRequestFormParams(
        message=message,
        requested_schema={"type": "object", "properties": props, "required": required})


def _decision(answer: types.ElicitResult | None, gate: str, caller: Caller) -> Decision | None:
    """An accepted form as a decision on ``gate`` (None: declined, cancelled, empty)."""
    if answer is None or answer.action != "accept" or not answer.content:
        return None
    content = dict(answer.content)
    chosen = content.pop("decision", None)
    if chosen not in ("approve", "reject"):
        return None
    kind: Literal["approve", "reject"] = "approve" if chosen == "approve" else "reject"
    checked = content.pop(CHECKED, None)  # an unknown outcome's, checked by hand
    if kind == "approve" and isinstance(checked, str) and checked.strip():
        try:
            content["result"] = json.loads(checked)
        except ValueError:  # (a tool's plain-text answer)
            content["result"] = checked
    given = content.pop("comment", None)
    comment = str(given) if given not in (None, "") else None
    if VIA:  # the engine records where a decision came from
        return Decision(kind, caller.name, comment, node=gate, data=content or None,
                        roles=caller.roles or (), **VIA)
    note = "via mcp" if not comment else f"{comment} (via mcp)"  # said in the comment
    return Decision(kind, caller.name, note, node=gate, data=content or None,
                    roles=caller.roles or ())


def _result(obj: dict[str, object], *, error: bool, text: str | None = None
            ) -> types.CallToolResult:
    if text is None:
        text = json.dumps(obj, default=str, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=obj, is_error=error)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)],
                                is_error=True)
