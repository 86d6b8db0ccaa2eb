"""A message to a conversation: ``interlock send``, ``POST /api/runs/{id}/messages``.

A conversation waits for its next message as a gate of kind ``message`` (the chat
agent's visit paused at it, `agents._chat`). A message is recorded in one batch with the
run's resumption -- ``run.resumed``, ``chat.message {node, message, text, by}``, the
gate's ``approval.decided`` and the message journaled for the visit -- and the run is
executed until the turn stops: the reply (the conversation waits again), a gate the turn
reached, the end of the conversation, or a failure. A message to a run that is not
waiting for one is refused before anything is recorded; of two sent at once, one wins
(the other finds the log moved on: `ConflictError`, nothing recorded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _log as L
from .._definition._bounds import check_data
from .._definition._model import WorkflowSpec
from .._engine import _records as R
from .._engine._fold import RunResult, RunView
from .._engine._view import Gate
from .._errors import ConflictError, UsageError
from .._hints import decide_hint, shell_word
from .._store import Store, release_store
from ..agents._chat import END_COMMAND
from ._execute import Listener, _traced, drive
from ._load import Functions, load_run, open_store_arg

CHAT_MESSAGE = "chat.message"
CHAT_REPLY = "chat.reply"
MAX_MESSAGE_CHARS = 100_000


class MessageRefused(UsageError):
    """A message to a run that is not waiting for one (exit 2, HTTP 409). ``status`` and
    ``waiting``: the run's, for a tool that says it again with its own options
    (`refusal`)."""

    def __init__(self, message: str, status: str | None = None,
                 waiting: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.waiting = status, waiting


def refusal(run_id: str, status: str, waiting: Mapping[str, Any] | None,
            where: str = "") -> str:
    """Why a message to ``run_id`` (``status``, ``waiting``) is refused, with the command
    that goes on -- carrying ``where``, the options that reach the run (``--store``,
    ``--server``)."""
    rid = shell_word(run_id)
    if status == "WAITING_APPROVAL":
        waiting = waiting or {}
        why = (f"it waits for a decision at {waiting.get('node')!r}; decide it first, then "
               f"send the message. Decide with: {decide_hint(run_id, waiting, where)}")
    elif status in ("COMPLETED", "FAILED", "REJECTED", "CANCELLED"):
        why = f"it is {status}" + ("" if status != "FAILED" else
                                   f"; resume it (interlock resume {rid}{where}) first")
    elif status in ("RUNNING", "RETRYING", "PENDING"):
        why = (f"it is {status} (a turn is in progress, or was interrupted: "
               f"`interlock resume {rid}{where}` continues it); send when it waits for a "
               "message")
    else:
        why = f"it is {status}, not a conversation waiting for its next message"
    return f"the message to run {run_id!r} is refused and nothing was recorded: {why}"


def message_gate(run_id: str, view: RunView, spec: WorkflowSpec | None = None) -> Gate:
    """The gate of the conversation's next message, or `MessageRefused` saying why the
    run takes none (``spec``: the run's definition -- a run of a workflow with no
    ``chat:`` never takes one, whatever it waits for)."""
    if spec is not None and spec.chat is None:
        hint = ""
        if view.status == "WAITING_APPROVAL":
            hint = f"; decide with: {decide_hint(run_id, view.waiting or {})}"
        raise MessageRefused(f"the message to run {run_id!r} is refused and nothing was "
                             f"recorded: run {run_id} is not a conversation (workflow "
                             f"{spec.workflow} has no `chat:`): it takes decisions, not "
                             f"messages{hint}")
    gate = next((g for g in view.pending_gates() if g.kind == "message"), None)
    if view.status == "WAITING_INPUT" and gate is not None:
        return gate
    raise MessageRefused(refusal(run_id, view.status, view.waiting), view.status,
                         view.waiting)


def message_records(view: RunView, gate: Gate, text: str, by: str | None
                    ) -> list[tuple[str, dict[str, Any]]]:
    """What a message to ``gate`` records (after ``run.resumed``)."""
    if not isinstance(text, str) or not text.strip():
        raise MessageRefused("a message is a non-empty text")
    if len(text) > MAX_MESSAGE_CHARS:
        raise MessageRefused(f"the message is {len(text):_} characters long, over the limit "
                             f"of {MAX_MESSAGE_CHARS:_}; send a shorter one")
    check_data(text, "the message")
    turn = gate.show.get("turn") if isinstance(gate.show, dict) else None
    n = turn if isinstance(turn, int) else 0
    visit = view.running.get((gate.node, gate.visit))
    assert gate.key is not None
    # each turn is a step of the conversation (``limits.steps`` covers it): the first is
    # the node's visit, each later one is counted with its message -- once, in the batch
    # that records it; `/end` is no turn
    turn = 1 if n >= 1 and text.strip() != END_COMMAND else 0
    return [
        (CHAT_MESSAGE, {"node": gate.node, "visit": gate.visit, "message": n, "text": text,
                        "by": by}),
        (L.APPROVAL_DECIDED, {"node": gate.node, "visit": gate.visit, "kind": "message",
                              "decision": "message", "by": by, "key": gate.key}),
        R.effect_recorded(gate.node, gate.visit, visit.attempt if visit else 1,
                          R.decision_key(gate.key),
                          {"decision": "message", "by": by, "text": text}, 0, steps=turn),
    ]


async def send(run_id: str, text: str, *, by: str | None = None,
               store: str | Store | None = None, workflow: Functions | None = None,
               listener: Listener | None = None, detach: bool = False) -> RunResult:
    """Send ``text`` to the conversation ``run_id`` and run its turn (``detach``: record
    the message and return; a worker runs the turn). Raises `MessageRefused` when the run
    is not waiting for a message -- nothing is recorded then."""
    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id, workflow=workflow, executable=True)
        view = loaded.view
        gate = message_gate(run_id, view, loaded.spec)
        items = message_records(view, gate, text, by)
        resumed: dict[str, Any] = {"by": by}
        if detach:
            resumed["detached"] = True
        spans, listener = await _traced(st, run_id, loaded.row.workflow, listener)
        try:
            return await drive(loaded.plan, st, run_id, view, loaded.writer(),
                               first=[(L.RUN_RESUMED, resumed), *items], listener=listener,
                               execute=not detach)
        except ConflictError as exc:
            # another process moved the run between our read and our first commit (as
            # `_execute._commit_first` says it): said as what the sender did -- a message,
            # not a resume. (A refusal of the code check, `CodeChanged`, stays as it is.)
            if type(exc) is not ConflictError or \
                    not str(exc).startswith(f"run {run_id!r} changed after this process"):
                raise
            raise ConflictError(
                f"another message to run {run_id!r} was taken first (or another process "
                "moved the conversation on); yours was not sent and nothing was recorded: "
                f"send it again once the conversation waits for a message -- see "
                f"`interlock status {run_id}`") from None
        finally:
            if spans is not None:
                spans.end()
    finally:
        if owned:
            await release_store(st)
