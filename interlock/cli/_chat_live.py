"""``interlock chat FILE`` on a store: the conversation's records printed as they are
committed (a listener on the run), the user's lines sent as messages, a gate decided in
place (``/approve``, ``/reject``). `Printer` shows a conversation's records and reply
pieces; it is shared with ``interlock chat --server`` (`interlock.cli._chat_remote`),
which gets the same records and pieces from the server's event stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from ._chat_lines import Lines, read_line
from ._common import CliError

if TYPE_CHECKING:
    from .. import RunResult, Store, Workflow

WAITS = ("WAITING_INPUT", "WAITING_APPROVAL")
BUSY = ("RUNNING", "RETRYING", "PENDING")  # a turn executes (here or elsewhere)
IDLE_POLL = 1.0  # seconds between two looks at the conversation when nothing tells of one

HELP = ("type a message; /end ends the conversation; when a gate waits: /approve [COMMENT] "
        "or /reject [COMMENT]")


def _short(value: Any, n: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= n else text[:n] + "..."


class Printer:
    """What a person sees of a conversation: the reply growing as its pieces arrive (or
    whole, when the provider does not stream), tool calls, child runs, a gate, a turn's
    error. ``run_id``: the conversation (records of other runs are its child runs')."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id
        self.streaming = False  # a model reply's text is being printed as it streams
        # the model call (the pieces' and agent.reply's ``turn``) whose text streams, and
        # the text so far: a piece of the next call ends its line even when that call's
        # agent.reply comes later (an older server's stream may send the next call's pieces
        # before the record), and a late agent.reply does not end the next call's line
        self.stream_turn: object = None
        self.stream_text = ""
        # the texts of this conversation turn's model replies printed as they streamed:
        # the turn's reply is not printed again when it is one of them (a reply that
        # calls a tool too -- "let me look", or "Goodbye!" with end_conversation -- is
        # the turn's reply when the tool ends the conversation)
        self.streamed: list[str] = []
        self.where = ""  # the options a printed command needs to reach the run
        self.gates = 0  # the gates shown so far

    def token(self, piece: dict[str, Any]) -> None:
        """A piece of the reply, printed as it arrives (the provider streams)."""
        turn = piece.get("turn")
        if self.streaming and turn != self.stream_turn:  # the next model call's text
            self._end_line()
        if not self.streaming:
            self.streaming, self.stream_turn, self.stream_text = True, turn, ""
        text = str(piece.get("text") or "")
        self.stream_text += text
        click.echo(click.style(text, bold=True), nl=False)
        sys.stdout.flush()

    def _end_line(self, text: str | None = None) -> None:
        if self.streaming:  # the text printed as it streamed: its line ends here
            click.echo("")
            self.streaming = False
            self.streamed.append(text if text is not None else self.stream_text)

    def record(self, rec: dict[str, Any]) -> None:
        """A committed record of the conversation (or of one of its child runs)."""
        rtype = rec.get("type")
        owner = rec.get("run_id")
        child = owner is not None and owner != self.run_id and rtype != "child.started"
        indent = "    " if child else "  "
        if rtype == "agent.reply" and not child and rec.get("turn") == self.stream_turn:
            self._end_line(rec.get("reply"))
        if rtype == "chat.reply" and not child:
            self._end_line()
            reply = rec.get("reply")
            if reply is not None and reply not in self.streamed:  # (not streamed: whole)
                click.echo(click.style(str(reply), bold=True))
            self.streamed = []
            if rec.get("turn_error"):
                click.echo(click.style(f"the turn failed: {rec['turn_error']} (the conversation "
                                       "goes on: send the next message)", fg="red"), err=True)
        if rtype == "tool.called":
            out = rec.get("result", rec.get("error", rec.get("problem")))
            click.echo(click.style(f"{indent}> {rec.get('tool')}"
                                   f"({_short(rec.get('arguments') or {}, 120)}) -> "
                                   f"{_short(out)}", dim=True), err=True)
        elif rtype == "tool.rejected":
            click.echo(f"{indent}> {rec.get('tool')}: rejected", err=True)
        elif rtype == "child.started":
            click.echo(click.style(f"{indent}> child run {rec.get('run_id')} "
                                   f"({rec.get('workflow')})", fg="cyan"), err=True)
        elif rtype == "approval.requested" and rec.get("kind") != "message" and not child:
            self.gate(rec.get("path") or rec.get("node"), rec.get("show"), rec)
        elif rtype == "approval.decided" and not child and \
                rec.get("decision") in ("approved", "rejected", "modified"):
            self.decided(rec)

    def decided(self, rec: dict[str, Any]) -> None:
        """A gate of the conversation decided (here or elsewhere): how, and by whom as
        recorded -- without ``--by``, anonymously, as ``interlock resume`` does."""
        item = rec.get("item")
        name = rec.get("path") or (rec.get("node") if item is None
                                   else f"{rec.get('node')}[{item}]")
        who = f"by {rec['by']}" if rec.get("by") else \
            "by an anonymous decider (chat with --by NAME to record who decides)"
        self._end_line()
        click.echo(f"{rec.get('decision')} {name!r} {who}", err=True)

    def left(self, status: str, waiting: dict[str, Any] | None, file: str, where: str,
             error: dict[str, Any] | None = None, remote: bool = False) -> None:
        """The session is over and the conversation did not end: how to go on (``where``:
        the options that reach the same store or server, ``remote``: a server's) -- it
        waits (standard input ended first), or it failed (``error``)."""
        from ..support import decide_hint

        if status == "FAILED" and self.run_id is not None:
            from ._gate_hints import failed_hint

            click.echo(failed_hint(self.run_id, error, where, remote), err=True)
        if status not in ("WAITING_INPUT", "WAITING_APPROVAL") or self.run_id is None:
            return
        self._end_line()
        session = f"interlock chat {shlex.quote(file)} --session {shlex.quote(self.run_id)}{where}"
        if status == "WAITING_APPROVAL" and waiting:
            click.echo(f"the conversation waits for a decision at {waiting.get('node')!r}: "
                       f"decide with: {decide_hint(self.run_id, waiting, where)}; or "
                       f"continue here: {session}", err=True)
        else:
            click.echo(f"the conversation waits for the next message: {session}", err=True)

    def sent_elsewhere(self, rec: dict[str, Any]) -> None:
        """A message (``chat.message``) another process sent: who, and its text."""
        self._end_line()
        click.echo(f"{rec.get('by') or 'someone'} (elsewhere): {rec.get('text')}", err=True)

    def continued(self, log: list[dict[str, Any]]) -> None:
        """The reply of the conversation's last turn, when that turn was interrupted and
        continued by another execution after its message (a server's take-over, a
        worker, ``interlock resume``): whoever sent the message may not have seen it. A
        continuation is a ``run.resumed`` that neither a decision nor a message follows."""
        sent = [i for i, r in enumerate(log) if r.get("type") == "chat.message"]
        if not sent:
            return
        turn = log[sent[-1] + 1:]
        moved = ("approval.decided", "chat.message")
        resumed = any(r.get("type") == "run.resumed" and
                      (i + 1 == len(turn) or turn[i + 1].get("type") not in moved)
                      for i, r in enumerate(turn))
        replies = [r.get("reply") for r in turn if r.get("type") == "chat.reply"]
        if resumed and replies and replies[-1] is not None:
            number = int(log[sent[-1]].get("message") or 0) + 1  # (as `status` counts)
            click.echo(f"the turn of message {number} was interrupted and continued by "
                       "another process; its reply:", err=True)
            click.echo(click.style(str(replies[-1]), bold=True))

    def gate(self, where: Any, show: Any, waiting: dict[str, Any] | None = None) -> None:
        """A gate the conversation waits at (``waiting``: its record or summary, whose
        ``kind`` says whether it is an action with an unknown outcome)."""
        from ._gate_hints import chat_outcome_lines

        self.gates += 1
        self._end_line()
        notes = chat_outcome_lines(str(self.run_id), {**(waiting or {}), "node": where,
                                                      "show": show}, self.where)
        if notes:
            show = notes.pop(0)
        click.echo(click.style(f"waiting for a decision at {where}: {_short(show)}",
                               fg="magenta"), err=True)
        for line in notes:
            click.echo(f"  {line}", err=True)
        click.echo("  /approve [COMMENT] or /reject [COMMENT]", err=True)


class Terminal(Printer):
    """One session of ``interlock chat FILE`` on a store: this process executes the
    turns of the messages typed here; what other processes commit to the conversation
    meanwhile (a gate decided with ``interlock resume`` or from the dashboard, the turn
    that follows, a message sent with ``interlock send``) is shown as it is committed --
    the store's change detector (`Store.wait_changed`) wakes the session while the
    person has not typed anything, and the run is read again before each line is
    handled (`_next_line`)."""

    def __init__(self, wf: Workflow, store_url: str | None, by: str | None) -> None:
        from ._format import where_options

        super().__init__()
        self.wf, self.store_url, self.by = wf, store_url, by
        self.result: RunResult | None = None
        self.where = where_options(store_url)
        self.seen = 0  # the last record of the conversation shown (or read) here
        self.file = "FILE"  # the conversation's file, as the person named it

    def run(self, data: dict[str, Any], session: str | None, file: str = "FILE") -> str:
        """Hold the conversation until standard input ends or it does: its status then."""
        from ._common import call_engine
        from ._format import where_options

        self.file = file
        status = call_engine(self._main(data, session))
        waiting = self.result.waiting if self.result is not None else None
        error = self.result.error if self.result is not None else None
        self.left(status, dict(waiting or {}), file, where_options(self.store_url), error)
        return status

    def listen(self, rec: dict[str, Any], view: Any) -> None:
        """Each committed record of the conversation (and of its child runs) that a
        person wants to see, as it happens."""
        seq = rec.get("seq")
        if isinstance(seq, int) and seq > self.seen:
            self.seen = seq
        self.record(rec)

    async def _session(self, st: Store, session: str, opening: bool = True) -> RunResult:
        """The conversation ``session`` as this terminal takes it up (``opening``; else
        again, its turn's executor gone): a run of this file's workflow (else
        `CliError`), its interrupted turn -- the process that executed it is gone --
        continued first, as ``interlock resume`` would, its reply shown (`CliError` when
        a live process still executes it)."""
        from .. import ClaimError, status

        row = await st.get_run(session)
        if row.workflow != self.wf.name:
            raise CliError(f"run {session} is a run of workflow {row.workflow!r}, not of "
                           f"{self.wf.name!r} (this file's): nothing was sent; continue it "
                           f"with its own file (interlock chat FILE --session {session}, "
                           f"FILE declaring workflow: {row.workflow})")
        self.seen = max(self.seen, row.summary.last_seq)
        if opening:
            await self._compare(st, session, row.definition_hash)
        result = await status(session, store=st)
        if result.status in ("FAILED", "REJECTED", "CANCELLED"):
            self._stopped(result)
        if result.status not in BUSY:
            return result
        click.echo(f"the conversation {session} was interrupted during a turn: continuing "
                   "that turn first", err=True)
        try:
            return await self.wf.resume(session, store=st, listener=self.listen)
        except ClaimError as exc:
            raise CliError(f"the conversation {session} is in a turn another process is "
                           f"executing ({exc.owner}); nothing was sent. Wait for the turn "
                           f"to end (interlock status {session}), then continue with "
                           f"interlock chat FILE --session {session}") from None

    async def _compare(self, st: Store, session: str, started: str) -> None:
        """Warn when this file is not the definition the conversation runs on -- it was
        migrated onto another one, or the file was edited since it started: the run's
        definition is used (as ``chat --server`` says of the server's)."""
        from ..support import load_run

        migration = (await load_run(st, session)).view.migration
        pinned = str(migration["to_hash"]) if migration else started
        mine = self.wf.definition_hash()
        if pinned == mine:
            return
        why = " (it was migrated onto another definition)" if migration else ""
        click.echo(f"warning: {self.file} differs from the definition run {session} "
                   f"keeps{why} (definition {pinned[:12]}, the file's {mine[:12]}): the "
                   "run's definition is used, not the file's (interlock migrate moves a "
                   "run onto a changed file)", err=True)

    def _stopped(self, result: RunResult) -> None:
        """A conversation that takes no message (failed, rejected, cancelled): why, and
        what can be done -- nothing typed is sent."""
        from ._format import where_options
        from ._gate_hints import failed_hint

        error = (result.error or {}).get("message")
        click.echo(f"the conversation {result.run_id} is {result.status}"
                   f"{': ' + str(error) if error else ''}; it takes no message (nothing "
                   "typed is sent)", err=True)
        if result.status == "FAILED":
            click.echo(failed_hint(result.run_id, result.error,
                                    where_options(self.store_url)), err=True)

    async def _main(self, data: dict[str, Any], session: str | None) -> str:
        from .. import open_store
        from ..support import TOKEN_SINK

        st: Store = open_store(self.store_url)
        TOKEN_SINK.set(self.token)  # (this task's context: the runs it executes stream here)
        self.run_id = session
        new = session is None
        try:
            if session is None:
                self.result = await self.wf.run(data, store=st, listener=self.listen)
                session = self.run_id = self.result.run_id
            else:
                self.result = await self._session(st, session)
            if new or self.result.status in WAITS:
                click.echo(f"conversation {session} ({HELP})", err=True)
            w = self.result.waiting
            if not new and self.result.status == "WAITING_APPROVAL" and w and not self.gates:
                self.gate(w.get("node"), w.get("show"), w)  # (opened at a gate: it again)
            lines = Lines()
            while self.result.status in WAITS:
                line = await self._next_line(st, lines)
                if line is None:
                    break
                if self.result.status not in WAITS:  # it ended elsewhere meanwhile
                    if line.strip():
                        click.echo(f"not sent: the conversation {session} is "
                                   f"{self.result.status}", err=True)
                    break
                await self._handle(st, line)
            if self.result.status == "COMPLETED":
                click.echo(f"the conversation {session} has ended", err=True)
            return self.result.status
        finally:
            await st.close()

    async def _handle(self, st: Store, line: str) -> None:
        """A line typed while the conversation waits: a message sent (its turn executed
        here), a gate decided, or what to tell the person instead."""
        from .. import ClaimError, ClaimLost, ConflictError, UsageError, approve, reject

        assert self.result is not None and self.run_id is not None
        typed = read_line(line, self.result.status == "WAITING_APPROVAL")
        if typed is None:
            return
        if typed.action == "say":  # (not a message: nothing sent, nothing recorded)
            click.echo(typed.text, err=True)
            return
        try:
            if typed.action == "decide":
                decide = approve if typed.decision == "approve" else reject
                made = replace(decide(by=self.by, comment=typed.text), via="cli")
                self.result = await self.wf.resume(self.run_id, made, store=st,
                                                   listener=self.listen)
            else:
                self.result = await self.wf.send(self.run_id, str(typed.text), by=self.by,
                                                 store=st, listener=self.listen)
        except ClaimLost:
            raise
        except (UsageError, ConflictError, ClaimError) as exc:  # another process was first
            click.echo(f"refused: {exc}", err=True)
            await self._catch_up(st, force=True)
            return
        if self.result.status == "FAILED":
            click.echo(f"the turn failed: {(self.result.error or {}).get('message')}",
                       err=True)

    async def _next_line(self, st: Store, lines: Lines) -> str | None:
        """The next line typed (None: standard input ended), once the conversation waits
        or has ended: what other processes commit to it is shown meanwhile (`_catch_up`,
        woken by the store's change detector, and every `IDLE_POLL` seconds behind it),
        and it is read again before the line is handled -- a line typed while another
        process executes a turn waits for that turn."""
        assert self.result is not None
        typed = asyncio.ensure_future(lines.get())
        seen: int | None = None
        try:
            while True:
                watch = asyncio.ensure_future(st.wait_changed(IDLE_POLL, seen, self.run_id))
                try:
                    await asyncio.wait({watch} if typed.done() else {typed, watch},
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not watch.done():
                        watch.cancel()
                        await asyncio.wait({watch})
                if not watch.cancelled() and watch.exception() is None:
                    seen = watch.result()
                await self._catch_up(st)
                if typed.done() and self.result.status not in BUSY:
                    return typed.result()
        finally:
            typed.cancel()

    async def _catch_up(self, st: Store, force: bool = False) -> None:
        """Show the records committed to the conversation after the last one shown, by
        other processes, and read the run again when there are any (``force``: anyway).
        A turn that another process was executing, and that process is gone, is
        continued here."""
        from .. import status
        from ..support import trace_pages

        assert self.run_id is not None and self.result is not None
        new = bool(await st.entries_page(self.run_id, self.seen, 1))
        if new:
            async for page in trace_pages(self.run_id, store=st, after=self.seen):
                for rec in page:
                    self.seen = max(self.seen, int(rec["seq"]))
                    self._elsewhere(rec)
        if new or force:
            self.result = await status(self.run_id, store=st)
        elif self.result.status in BUSY and await self._executor_gone(st):
            with contextlib.suppress(CliError):  # (another process took it over first)
                self.result = await self._session(st, self.run_id, opening=False)

    def _elsewhere(self, rec: dict[str, Any]) -> None:
        """A record another process committed: shown as this session's are, and a
        message sent from elsewhere (``interlock send``) with who sent it."""
        if rec.get("type") == "chat.message":
            self.sent_elsewhere(rec)
        self.record(rec)

    async def _executor_gone(self, st: Store) -> bool:
        """Whether the turn another process was executing has no executor any more (it
        died: its lease ran out, or it was a process of this host that is gone)."""
        from ..support import owner_gone

        assert self.run_id is not None
        row = await st.get_run(self.run_id)
        if row.summary.status not in BUSY:
            return False
        return not row.owner or owner_gone(row.owner) or (row.lease_until or 0) < time.time()
