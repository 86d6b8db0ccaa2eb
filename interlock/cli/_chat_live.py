"""``interlock chat FILE`` on a store: the conversation's records printed as they are
committed (a listener on the run), the user's lines sent as messages, a gate decided in
place (``/approve``, ``/reject``). `Printer` shows a conversation's records and reply
pieces; it is shared with ``interlock chat --server`` (`interlock.cli._chat_remote`),
which gets the same records and pieces from the server's event stream."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from .. import RunResult, Store, Workflow

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
        self.streaming = False  # a reply is being printed as it streams
        self.shown = False  # the turn's reply was printed as it streamed
        self.where = ""  # the options a printed command needs to reach the run

    def token(self, piece: dict[str, Any]) -> None:
        """A piece of the reply, printed as it arrives (the provider streams)."""
        self.streaming = True
        click.echo(click.style(str(piece.get("text") or ""), bold=True), nl=False)
        sys.stdout.flush()

    def _end_line(self) -> None:
        if self.streaming:  # the text printed as it streamed: its line ends here
            click.echo("")
            self.streaming = False
            self.shown = True

    def record(self, rec: dict[str, Any]) -> None:
        """A committed record of the conversation (or of one of its child runs)."""
        rtype = rec.get("type")
        owner = rec.get("run_id")
        child = owner is not None and owner != self.run_id and rtype != "child.started"
        indent = "    " if child else "  "
        if rtype == "agent.reply" and not child:
            self._end_line()
        if rtype == "chat.reply" and not child:
            self._end_line()
            if not self.shown and rec.get("reply") is not None:  # (not streamed: whole)
                click.echo(click.style(str(rec.get("reply") or ""), bold=True))
            self.shown = False
            if rec.get("turn_error"):
                click.echo(click.style(f"the turn failed: {rec['turn_error']} (the conversation "
                                       "goes on: send the next message)", fg="red"), err=True)
        elif rtype == "agent.reply" and not child and rec.get("tool_calls"):
            self.shown = False  # the turn goes on: its final reply is still to come
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

    def gate(self, where: Any, show: Any, waiting: dict[str, Any] | None = None) -> None:
        """A gate the conversation waits at (``waiting``: its record or summary, whose
        ``kind`` says whether it is an action with an unknown outcome)."""
        from ._gate_hints import chat_outcome_lines

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
    def __init__(self, wf: Workflow, store_url: str | None, by: str | None) -> None:
        from ._format import where_options

        super().__init__()
        self.wf, self.store_url, self.by = wf, store_url, by
        self.where = where_options(store_url)

    def run(self, data: dict[str, Any], session: str | None) -> str:
        """Hold the conversation until standard input ends or it does: its status then."""
        from ._common import call_engine

        return call_engine(self._main(data, session))

    def listen(self, rec: dict[str, Any], view: Any) -> None:
        """Each committed record of the conversation (and of its child runs) that a
        person wants to see, as it happens."""
        self.record(rec)

    async def _main(self, data: dict[str, Any], session: str | None) -> str:
        from .. import approve, open_store, reject, status
        from ..support import TOKEN_SINK

        st: Store = open_store(self.store_url)
        TOKEN_SINK.set(self.token)  # (this task's context: the runs it executes stream here)
        self.run_id = session
        try:
            if session is None:
                result: RunResult = await self.wf.run(data, store=st, listener=self.listen)
                session = self.run_id = result.run_id
            else:
                result = await status(session, store=st)
            click.echo(f"conversation {session} ({HELP})", err=True)
            if session is not None and result.status == "WAITING_APPROVAL" and result.waiting:
                w = result.waiting  # a session opened at a gate: what it asks, again
                self.gate(w.get("node"), w.get("show"), w)
            while result.status in ("WAITING_INPUT", "WAITING_APPROVAL"):
                line = await asyncio.to_thread(sys.stdin.readline)
                if not line:
                    break
                text = line.rstrip("\n")
                if not text.strip():
                    continue
                word, _, rest = text.strip().partition(" ")
                if result.status == "WAITING_APPROVAL":
                    if word not in ("/approve", "/reject"):
                        click.echo("a gate waits: /approve [COMMENT] or /reject [COMMENT]",
                                   err=True)
                        continue
                    decide = approve if word == "/approve" else reject
                    result = await self.wf.resume(session, decide(by=self.by,
                                                                  comment=rest or None),
                                                  store=st, listener=self.listen)
                else:
                    result = await self.wf.send(session, text, by=self.by, store=st,
                                                listener=self.listen)
                if result.status == "FAILED":
                    click.echo(f"the turn failed: {(result.error or {}).get('message')}",
                               err=True)
            if result.status == "COMPLETED":
                click.echo(f"the conversation {session} has ended", err=True)
            return result.status
        finally:
            await st.close()
