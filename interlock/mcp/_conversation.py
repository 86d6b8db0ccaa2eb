"""A conversation file (``chat: NODE``) as one MCP tool of its name, taking
``{text, run_id?}``.

Without ``run_id`` a call starts a conversation (a run of the file, which waits for its
first message) and sends ``text`` as that first message; with it, ``text`` is the next
message of that conversation. The call answers when the turn stops, with ``{run_id,
workflow, status, reply}``: the reply as structured content and as the result's text.
A turn that reaches a gate (a ``confirm:`` tool, a child run's approval) answers as a
workflow's waiting call does -- at once, with ``waiting`` and ``decide``, or through
elicitation where the client supports it -- and the conversation goes on once it is
decided. A ``run_id`` the store does not know, a run of another workflow, or a
conversation that has ended is refused before anything is recorded.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import mcp_types as types

from interlock import ClaimError, ClaimLost, ConflictError, RunNotFound, UsageError

if TYPE_CHECKING:
    from interlock import Workflow

    from ._runs import Caller, Progress, Runs

ENDED = frozenset({"COMPLETED", "FAILED", "REJECTED", "CANCELLED"})


def is_conversation(wf: Workflow) -> bool:
    return wf.spec.chat is not None


def conversation_tool(wf: Workflow) -> types.Tool:
    """The tool of a conversation file: ``{text, run_id?}`` (and ``input`` when the
    file declares ``input:`` fields, for a new conversation)."""
    spec = wf.spec
    what = spec.description or f"Talk with the interlock conversation {spec.workflow!r}."
    props: dict[str, object] = {
        "text": {"type": "string", "minLength": 1,
                 "description": "your message (`/end` ends the conversation)"},
        "run_id": {"type": "string", "minLength": 1,
                   "description": "the conversation to continue: the run_id an earlier "
                                  "call answered; without it, a new conversation starts"}}
    if spec.input:
        fields = ", ".join(spec.input)
        props["input"] = {"type": "object",
                          "description": f"a new conversation's input (its fields: {fields})"}
    return types.Tool(
        name=spec.workflow, description=(
            f"{what}\n\nA conversation: send a message, get the reply (`reply`) and the "
            "conversation's `run_id`; pass that `run_id` to go on with the same "
            "conversation. A turn that waits for a person's decision answers at once "
            "with `waiting` and `decide`; once decided, the conversation goes on."),
        input_schema={"type": "object", "properties": props, "required": ["text"],
                      "additionalProperties": False})


def _arguments(name: str, args: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    text, run_id, data = args.get("text"), args.get("run_id"), args.get("input")
    usage = (f"{name} takes {{\"text\": \"your message\", \"run_id\": \"...\"}} (run_id "
             "only to continue a conversation)")
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{usage}: text is missing or empty")
    if run_id is not None and (not isinstance(run_id, str) or not run_id):
        raise UsageError(f"{usage}: run_id is not a run id")
    if data is not None and not isinstance(data, dict):
        raise UsageError(f"{usage}: input is not an object")
    extra = sorted(set(args) - {"text", "run_id", "input"})
    if extra:
        raise UsageError(f"{usage}: it takes no {', '.join(map(repr, extra))}")
    return text, run_id, dict(data or {})


async def converse(runs: Runs, name: str, args: dict[str, Any], caller: Caller,
                   progress: Progress) -> dict[str, Any]:
    """Send the call's message (starting the conversation first without ``run_id``);
    the run object once the turn stops."""
    text, run_id, data = _arguments(name, args)
    if run_id is None:
        started = await runs.call(name, data, caller, progress)
        if started["status"] != "WAITING_INPUT":  # (a new conversation waits for a message)
            return started
        run_id = str(started["run_id"])
    else:
        if data:
            raise UsageError(f"input is for a new conversation; run {run_id!r} has started "
                             "already (send text and run_id only)")
        await _continuable(runs, name, run_id, caller)
    try:
        return await runs.message(run_id, text, caller, progress)
    except ClaimLost:
        raise  # (this turn's own claim, lost midway: not a refusal)
    except (ClaimError, ConflictError):  # before the message's first record
        raise UsageError(
            f"the message to conversation {run_id!r} is refused and nothing was recorded: "
            "another message or decision was being answered at the same moment; read the "
            f"conversation with interlock_run_status, and send again once it waits for a "
            "message") from None


async def _continuable(runs: Runs, name: str, run_id: str, caller: Caller) -> None:
    """Refuses (nothing recorded) a run_id that is not a conversation of ``name`` that
    can go on."""
    again = f"call {name} without run_id to start a new conversation"
    try:
        run = await runs.status(run_id, caller)
    except RunNotFound:
        raise UsageError(f"there is no conversation {run_id!r} in this store; {again}") \
            from None
    workflow = run.get("workflow")
    if workflow != name:
        raise UsageError(f"run {run_id!r} is a run of {workflow!r}, not a conversation of "
                         f"{name!r}; {again}, or call {workflow} to talk with it")
    status = run.get("status")
    if status in ENDED:
        how = (f"; `interlock resume {shlex.quote(run_id)}{runs.store_hint}` retries its "
               "failed turn" if status == "FAILED" else "")
        raise UsageError(f"the conversation {run_id!r} has ended ({status}): it takes no "
                         f"more messages{how}; {again}")


def reply_of(run: dict[str, Any], chat_node: str) -> str | None:
    """The turn's reply: what the conversation waits with (``waiting.show.last_reply``),
    or, when it ended, the chat node's last reply in state."""
    waiting = run.get("waiting") or {}
    if waiting.get("kind") == "message":
        reply = (waiting.get("show") or {}).get("last_reply")
        return reply if isinstance(reply, str) else None
    if run.get("status") == "COMPLETED":
        reply = (run.get("state") or {}).get(chat_node)
        return reply if isinstance(reply, str) else None
    return None


def turn_answer(run: dict[str, Any], chat_node: str) -> tuple[dict[str, object], str, bool]:
    """``{run_id, workflow, status, reply}`` (with ``error`` for a failed run,
    ``turn_error`` for a turn that failed on its own limits while the conversation goes
    on), the result's text -- the reply, or what happened --, and whether it failed."""
    reply = reply_of(run, chat_node)
    out: dict[str, object] = {"run_id": run["run_id"], "workflow": run.get("workflow"),
                              "status": run["status"], "reply": reply}
    waiting = run.get("waiting") or {}
    turn_error = (waiting.get("show") or {}).get("turn_error") \
        if waiting.get("kind") == "message" else None
    if turn_error:
        out["turn_error"] = turn_error
        return out, (f"the turn failed: {turn_error}; the conversation {run['run_id']} "
                     "waits for the next message"), True
    if run.get("error"):
        out["error"] = run["error"]
    if reply is not None:
        return out, reply, False
    error = run.get("error") or {}
    return out, (f"the turn of conversation {run['run_id']} ended {run['status']}"
                 + (f": {error.get('message')}" if error.get("message") else "")), False
