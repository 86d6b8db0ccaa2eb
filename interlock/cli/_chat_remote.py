"""``interlock chat FILE --server URL``: a conversation held through an ``interlock serve``.

The server executes the turns; this side follows the run's event stream -- one stream
for the whole session, opened before the first message is sent, so that the reply's
pieces (``chat.token`` events, handed only to the streams open when they arrive) reach
it -- and prints what a local ``interlock chat`` prints (`Printer`). Each line of
standard input is a message (``POST /api/runs/{id}/messages``); when a turn reaches a
gate (its own, or a child run's, by its path), ``/approve [COMMENT]`` or ``/reject
[COMMENT]`` decides it (``POST /api/runs/{id}/decisions`` with the gate's path), and the
turn goes on, streamed as before.
"""

from __future__ import annotations

import json
import queue
import shlex
import sys
import threading
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from ._chat_lines import read_line
from ._chat_live import HELP, Printer
from ._common import EXIT_USAGE, CliError, echo_diagnostics, read_input
from ._remote import Remote

if TYPE_CHECKING:
    from .. import Workflow

_ENDED = {"run.completed": "COMPLETED", "run.failed": "FAILED", "run.rejected": "REJECTED",
          "run.cancelled": "CANCELLED"}
_STATUS = {"message": "WAITING_INPUT", "approval": "WAITING_APPROVAL"}
_MOVED = {"run.resumed", "approval.decided", "chat.message"}  # (not a note, a snapshot)


def _parse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """An SSE stream's events as ``(event, data)`` (comments -- keepalives -- skipped)."""
    event: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if event is not None:
                yield event, json.loads("\n".join(data)) if data else None
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


class Stream:
    """The run's event stream read by a thread into a queue: ``(event, data)``, then
    ``("", None)`` when the stream ends, or ``("!", error)``."""

    def __init__(self, remote: Remote, run_id: str, after: int) -> None:
        self.remote, self.run_id, self.after = remote, run_id, after
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.client = remote._httpx.Client(base_url=remote.url, headers=remote.client.headers,
                                           timeout=None)
        self.thread = threading.Thread(target=self._read, daemon=True,
                                       name=f"interlock chat: events of {run_id}")
        self.thread.start()

    def _read(self) -> None:
        try:
            with self.client.stream("GET", f"/api/runs/{self.run_id}/events",
                                    params={"after": self.after}) as response:
                if not response.is_success:
                    response.read()
                    detail = response.json().get("detail")
                    raise CliError(str(detail or f"the server answered "
                                                 f"{response.status_code}"))
                for item in _parse(response.iter_lines()):
                    self.events.put(item)
            self.events.put(("", None))
        except Exception as exc:  # (the stream closed under us at the end is no error)
            self.events.put(("!", exc))

    def close(self) -> None:
        self.client.close()


def _local(file: str, session: str | None) -> Workflow | None:
    """The local ``file``, read for its ``workflow:`` name and its definition (which the
    server's is compared with) only: the server executes the turns, so the modules its
    nodes and tools call are not imported here -- a client without them, or without
    their dependencies, chats. None (said) when a session is taken up and the file
    cannot be read here -- the server holds the definition."""
    from .. import Workflow, WorkflowError
    from ..support import load_spec

    try:
        return Workflow.from_spec(load_spec(file))
    except WorkflowError as exc:
        if session is None:
            echo_diagnostics(exc.diagnostics, err=True)
            raise SystemExit(EXIT_USAGE) from None
        first = exc.diagnostics[0].message if exc.diagnostics else str(exc)
        click.echo(f"warning: {file} is not checked against run {session}'s workflow "
                   f"({first}): the server's definition is used", err=True)
        return None


def _lines(events: queue.Queue[tuple[str, Any]]) -> None:
    """Standard input's lines into ``events`` (``(">", line)``), then ``("<", None)``."""
    for line in sys.stdin:
        events.put((">", line.rstrip("\n")))
    events.put(("<", None))


class RemoteTerminal(Printer):
    """One session of ``interlock chat --server``: the stream's events and standard
    input's lines read by threads into one queue, handled in order here -- so what the
    run does (a gate decided from the dashboard, a message sent by someone else) is
    shown as it happens, not when the person types next. Lines typed while a turn runs
    wait for the conversation to wait again."""

    def __init__(self, remote: Remote, by: str | None) -> None:
        from ._format import where_options

        super().__init__()
        self.remote, self.by = remote, by
        self.where = where_options(server_url=remote.url, token=remote.token)
        self.status = "PENDING"
        self.waiting: dict[str, Any] = {}
        self.asking = False  # the run waits for this person's next line
        self.lines: deque[str] = deque()
        self.eof = False
        self.error: dict[str, Any] | None = None  # the conversation's, when it failed
        self.file = "FILE"  # the conversation's file, as the person named it
        self.mine = 0  # messages sent by this session whose chat.message is still to come

    def run(self, workflow: str, session: str | None, input_json: str | None) -> str:
        """Hold the conversation until standard input ends or it does: its status then."""
        try:
            session, seen = self._open(_local(workflow, session), workflow, session,
                                       input_json)
        except BaseException:  # (refused: the connection is not left open)
            self.remote.close()
            raise
        self.run_id, self.file = session, workflow
        click.echo(f"conversation {session} ({HELP})", err=True)
        stream = Stream(self.remote, session, max(seen - 1, 0))
        threading.Thread(target=_lines, args=(stream.events,), daemon=True,
                         name="interlock chat: standard input").start()
        try:
            return self._follow(stream, seen)
        finally:
            stream.close()
            self.remote.close()

    def _open(self, wf: Workflow | None, workflow: str, session: str | None,
              input_json: str | None) -> tuple[str, int]:
        """Start the conversation, or take ``session`` up: its id and the last record's
        seq already seen."""
        if session is None:
            assert wf is not None
            served = self.remote.call("GET", f"/api/workflows/{wf.name}")
            self._compare(wf, workflow, str(served.get("hash")),
                          f"the server's workflow {wf.name!r}")
            started = self.remote.call("POST", f"/api/workflows/{wf.name}/runs",
                                       json={"input": read_input(input_json, None)})
            return str(started["run_id"]), 0
        # follow from its last record (then only what the session adds is shown)
        log = self.remote.records(session)
        if wf is not None:
            self._check_session(wf, workflow, session, log)
        run = self.remote.result(session)
        self.status, self.waiting = run.status, dict(run.waiting or {})
        self.continued(log)  # (a turn the server finished while no one followed it)
        return session, log[-1]["seq"] if log else 0

    def _check_session(self, wf: Workflow, file: str, session: str,
                       log: list[dict[str, Any]]) -> None:
        """``session`` is a run of ``file``'s workflow (else `CliError`: nothing is sent);
        a ``file`` edited since the run's definition was pinned is said to be unused."""
        started = log[0] if log else {}
        name = started.get("workflow")
        if name is not None and name != wf.name:
            raise CliError(f"run {session} is a run of workflow {name!r}, not of "
                           f"{wf.name!r} ({file}'s): nothing was sent; continue it with its "
                           f"own file (interlock chat FILE --session {session} --server URL, "
                           f"FILE declaring workflow: {name})")
        pinned = started.get("definition_hash")
        for rec in log:  # (a migration moves the run onto another definition)
            if rec.get("type") == "run.migrated" and rec.get("to_hash"):
                pinned = rec["to_hash"]
        self._compare(wf, file, str(pinned), f"the definition run {session} keeps")

    def _compare(self, wf: Workflow, file: str, served: str, what: str) -> None:
        """Warn when the local ``file`` is not the definition the server executes."""
        if served in ("None", wf.definition_hash()):
            return
        click.echo(f"warning: {file} differs from {what} on the server (definition "
                   f"{served[:12]}, the file's {wf.definition_hash()[:12]}): the server's "
                   f"definition is used, not the file's edits (interlock migrate moves a "
                   f"run onto a changed file)", err=True)

    def _follow(self, stream: Stream, seen: int) -> str:
        while True:
            event, data = stream.events.get()
            if event == "!":
                raise CliError(self._broke(data))
            if event == "":
                return self.status
            if event == ">":
                self.lines.append(str(data))
            elif event == "<":
                self.eof = True
            elif event == "chat.token":
                if isinstance(data, dict) and data.get("run_id") == self.run_id:
                    self.token(data)
            elif isinstance(data, dict) and self._record(event, data, seen):
                return self.status
            if self.asking:
                self._answer()
                if self.asking and self.eof:
                    return self.status

    def _broke(self, error: object) -> str:
        """Why the session stopped when the event stream broke, and how to go on: a lost
        connection (the server stopped, the network) is no refusal -- the conversation
        is in the server's store."""
        if isinstance(error, CliError):  # the server refused the stream
            return f"the event stream of run {self.run_id} broke: {error}"
        again = (f"interlock chat {shlex.quote(self.file)} --session {self.run_id}"
                 f"{self.where}")
        return (f"the connection to the server was lost while following conversation "
                f"{self.run_id} ({error}); the conversation is kept in the server's store: "
                f"once the server is back, continue with `{again}` (a turn it was "
                "executing is continued by the server, and its reply shown then)")

    def _record(self, event: str, rec: dict[str, Any], seen: int) -> bool:
        """One record of the stream; True when the conversation ended."""
        seq = int(rec.get("seq") or 0)
        if seq > seen:
            if event == "chat.message" and not self.mine:
                self.sent_elsewhere(rec)  # (not one of this session's: sent elsewhere)
            elif event == "chat.message":
                self.mine -= 1
            self.record(rec)
            if event in _MOVED:  # the run goes on (whoever moved it): nothing to answer
                self.asking = False
        elif event != "run.waiting" and self.status in _STATUS.values():
            # the session's last record is not its wait (a note after it): the run object
            # said what it waits for
            self._ask(replayed=True)
            return False
        if event in _ENDED:
            self.status = _ENDED[event]
            self._ended(rec)
            return True
        if event == "run.waiting":
            self.waiting = rec.get("waiting") or {}
            self.status = _STATUS.get(str(self.waiting.get("kind")), "WAITING_APPROVAL")
            self._ask(replayed=seq <= seen)
        return False

    def _ask(self, replayed: bool) -> None:
        """The run waits for the person (``replayed``: it did when the session was opened
        -- its gate is shown again)."""
        if replayed and self.status == "WAITING_APPROVAL":
            self.gate(self.waiting.get("node"), self.waiting.get("show"), self.waiting)
        self.asking = True

    def _ended(self, rec: dict[str, Any]) -> None:
        if self.status == "COMPLETED":
            click.echo(f"the conversation {self.run_id} has ended", err=True)
        elif self.status == "FAILED":
            error = rec.get("error") or {}
            self.error = error if isinstance(error, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            click.echo(f"the conversation failed: {message}", err=True)

    def _answer(self) -> None:
        """Send the lines typed so far until one is taken (a message, or the gate's
        decision: the run goes on, and ``asking`` ends)."""
        while self.asking and self.lines:
            typed = read_line(self.lines.popleft(), self.status == "WAITING_APPROVAL")
            if typed is None:
                continue
            if typed.action == "say":  # (not a message: nothing sent, nothing recorded)
                click.echo(typed.text, err=True)
                continue
            try:
                if typed.action == "decide":
                    body = {"decision": typed.decision, "by": self.by, "comment": typed.text,
                            "node": self.waiting.get("node"), "via": "cli"}
                    self.remote.call("POST", f"/api/runs/{self.run_id}/decisions",
                                     json={k: v for k, v in body.items() if v is not None})
                else:
                    self.remote.call("POST", f"/api/runs/{self.run_id}/messages",
                                     json={"text": typed.text, "by": self.by})
                    self.mine += 1  # (its chat.message is the next one the stream brings)
            except CliError as exc:  # refused (decided elsewhere, ...): say so, go on
                click.echo(f"refused: {exc}", err=True)
                continue
            self.asking = False
