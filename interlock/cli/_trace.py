"""``interlock trace``: a run's log as a timeline, one line per record, saying why the
run went where it went."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import click

from ._common import call_engine, need_store, store_option, with_store
from ._format import (
    _STATUS_STYLE,
    _decision_detail,
    _duration,
    _json,
    _node_detail,
    _reads,
    _short,
    _sources,
    _when,
)
from ._remote import Remote, server_options

if TYPE_CHECKING:
    from rich.text import Text

    from .. import Store, WorkflowSpec
    from ..support import Entry, Record, RunRow


@click.command(short_help="Show a run's log as a timeline.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--json", "as_json", is_flag=True,
              help="Print the log records as one JSON list on stdout.")
@store_option
@server_options
def trace(run_id: str, as_json: bool, store_url: str | None, server_url: str | None,
          token: str | None) -> None:
    """Print RUN_ID's log, one line per record: when, what, which node, how long, how
    many tokens, and for every edge decision the expression, its value and the values
    it read -- why the run went where it went."""
    if server_url:
        _remote_trace(Remote(server_url, token, store_url), run_id, as_json)
        return
    need_store(store_url)
    call_engine(with_store(store_url, lambda st: _trace(st, run_id, as_json)))


def _remote_trace(remote: Remote, run_id: str, as_json: bool) -> None:
    """The trace as the server gives it (the server's store checked the log as it read
    it); edges are named from the records alone."""
    import asyncio

    try:
        records = remote.records(run_id)
    finally:
        remote.close()

    async def pages() -> AsyncIterator[list[Record]]:
        yield records

    if as_json:
        asyncio.run(_print_json(pages()))
        return
    widths = _Widths()
    for rec in records:
        widths.seq = max(widths.seq, len(str(rec["seq"])))
        widths.type = max(widths.type, len(rec["type"]))
        widths.node = max(widths.node, len(rec.get("node") or ""))
    asyncio.run(_print_trace(pages(), None, widths))


async def _trace(st: Store, run_id: str, as_json: bool) -> None:
    """Two passes over the log, a page of records at a time (memory stays flat however
    long the run): the first verifies it and measures the columns, the second prints."""
    from ..support import TRACE_PAGE, LogCheck, trace_pages

    row = await st.get_run(run_id)
    check = LogCheck(row)
    widths = _Widths()
    async for entries in st.iter_entries(run_id, page=TRACE_PAGE):
        check.feed(entries)
        widths.add(entries)
    await check.settle(st)  # (records appended while it read: the summary read again)
    checked = check.result()
    if not checked.ok and checked.seq is None:  # it could not be checked (a keyed log)
        click.echo(f"warning: run {run_id}'s log was not checked: {checked.message}",
                   err=True)
    elif not checked.ok:  # shown all the same: it is what the store holds
        click.echo(f"warning: run {run_id}'s log does not verify at record {checked.seq}: "
                   f"{checked.message}. The records shown may have been changed after they "
                   f"were written (`interlock verify {run_id}`)", err=True)
    pages = trace_pages(run_id, store=st)
    if as_json:
        await _print_json(pages)
    else:
        await _print_trace(pages, _stored_spec(row), widths)


async def _print_json(pages: AsyncIterator[list[Record]]) -> None:
    """The records as one JSON list -- what ``json.dumps(records)`` prints -- written a
    page at a time."""
    out = sys.stdout
    sep = "["
    async for page in pages:
        for rec in page:
            out.write(sep)
            out.write(json.dumps(rec, ensure_ascii=False, default=str))
            sep = ", "
    out.write("]\n" if sep == ", " else "[]\n")
    out.flush()


class _Widths:
    """The columns of the timeline, measured from the stored entries (no JSON read)."""

    def __init__(self) -> None:
        self.seq = 1
        self.type = 0
        self.node = 0

    def add(self, entries: list[Entry]) -> None:
        self.seq = max(self.seq, len(str(entries[-1].seq)))
        self.type = max(self.type, *(len(e.type) for e in entries))
        self.node = max(self.node, *(len(e.node or "") for e in entries))


def _stored_spec(row: RunRow) -> WorkflowSpec | None:
    """The definition the run executes (to name its edges), if it still parses."""
    from .. import InterlockError
    from ..support import parse_definition as parse

    try:
        return parse(row.definition)
    except (InterlockError, ValueError):
        return None


def _migrated_spec(rec: Record, spec: WorkflowSpec | None) -> WorkflowSpec | None:
    """The definition a ``run.migrated`` moves the run onto, if it parses."""
    from .. import InterlockError
    from ..support import parse_definition as parse

    try:
        return parse(rec["definition"])
    except (InterlockError, ValueError, KeyError, TypeError):
        return spec


async def _print_trace(pages: AsyncIterator[list[Record]], spec: WorkflowSpec | None,
                       widths: _Widths) -> None:
    from rich.console import Console
    from rich.text import Text

    out = Console(highlight=False, soft_wrap=True)
    plain = out.color_system is None  # not a terminal (or NO_COLOR): the text alone
    seq_w = widths.seq
    t0: float | None = None
    async for records in pages:
        if t0 is None and records:
            t0 = _time(records[0]) or 0.0
        lines: list[Text] = []
        # a child run's records (a sub-workflow's) follow its start, indented: (record,
        # depth), depth-first
        todo = [(rec, 0) for rec in reversed(records)]
        while todo:
            rec, depth = todo.pop()
            if rec.get("type") == "run.migrated" and not depth:
                spec = _migrated_spec(rec, spec)  # the records after it: its definition's
            try:
                line = _trace_line(rec, depth, t0 or 0.0, widths, spec)
            except (KeyError, TypeError, AttributeError, ValueError, IndexError):
                # not a record interlock writes (a changed log; the trace warned): as it is
                line = Text("  " * depth + f"{rec.get('seq')!s:>{seq_w}}  {'?':>11}  "
                            + json.dumps(rec, ensure_ascii=False, default=str))
            lines.append(line)
            todo += [(sub, depth + 1) for sub in reversed(rec.get("records") or ())]
            # what log format 2 implies (`interlock.trace`'s ``implies``): a line each
            todo += [(sub, depth) for sub in reversed(rec.get("implies") or ())]
        # a page at a time: Console.print's cost is mostly per call, not per line
        if not lines:
            continue
        if plain:
            out.file.write("".join(f"{line.plain}\n" for line in lines))
        else:
            out.print(Text("\n").join(lines))


def _trace_line(rec: Record, depth: int, t0: float, widths: _Widths,
                spec: WorkflowSpec | None) -> Text:
    from rich.text import Text

    seq_w, type_w, node_w = widths.seq, widths.type, widths.node
    rtype = rec["type"]
    at = _time(rec)
    line = Text("  " * depth + ("│ " if depth else "") + f"{rec['seq']:>{seq_w}}  "
                f"{'?' if at is None else '+' + _duration((at - t0) * 1000):>11}  ")
    line.append(rtype.ljust(type_w), style=_record_style(rec))
    if node_w:
        line.append("  ")
        line.append((rec.get("node") or "").ljust(node_w), style="bold")
    # (a child's record carries its run's id, which its start names already)
    detail = _record_detail(rec, spec) if not depth else _record_detail(
        {k: v for k, v in rec.items() if k != "run_id"}, None)
    if detail:
        line.append("  " + detail)
    line.rstrip()
    return line


def _time(rec: Record) -> float | None:
    """The record's time, if it has one (a changed log's record may not)."""
    at = rec.get("at")
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


def _record_style(rec: Record) -> str:
    rtype: str = rec["type"]
    if rtype in ("edge.taken", "edge.skipped"):
        return _STATUS_STYLE["taken" if rtype == "edge.taken" else "skipped"]
    if rtype == "node.visited":  # (log format 2) started and completed
        return _STATUS_STYLE["completed"]
    if rtype == "approval.decided":
        return _STATUS_STYLE.get(rec.get("decision", ""), "")
    if rtype == "run.waiting" or rtype == "approval.requested":
        return _STATUS_STYLE["waiting"]
    return _STATUS_STYLE.get(rtype.rpartition(".")[2], "")


def _record_detail(rec: Record, spec: WorkflowSpec | None) -> str:
    """The part of a trace line that says what the record means."""
    rtype: str = rec["type"]
    if rtype.startswith("edge."):
        return _edge_detail(rec, spec)
    if rtype.startswith("node."):
        detail = _node_detail(rec)  # names a re-started attempt itself
        parts = [f"visit {rec['visit']}" if (rec.get("visit") or 1) > 1 else "",
                 f"item {rec['item']}" if rec.get("item") is not None else "",
                 f"attempt {rec['attempt']}" if rec.get("attempt") is not None
                 and not detail.startswith("attempt") else "",
                 detail]
        if rtype in ("node.completed", "node.visited") and rec.get("update"):
            parts.append("update " + _short(_json(rec["update"]), 100))
        if rec.get("goto"):
            parts.append(f"goto {rec['goto']}")
        return "  ".join(p for p in parts if p)
    describe = _RECORD_DETAIL.get(rtype)
    if describe is not None:
        return describe(rec)
    if rec.get("error"):
        e = rec["error"]
        return f"{e.get('type')}: {_short(str(e.get('message', '')), 200)}"
    return _other_detail(rec)


_ENVELOPE = frozenset({"seq", "type", "at", "node", "visit", "attempt", "duration_ms", "tokens",
                       "error", "hash"})


def _other_detail(rec: Record) -> str:
    """Records of other kinds (agent.request, tool.called, effect.recorded, ...): their own
    fields, briefly."""
    fields = {k: v for k, v in rec.items() if k not in _ENVELOPE and v is not None}
    return _short(_json(fields), 160) if fields else ""


def _numbered(n: object) -> str:
    """A conversation's message as people count them: from 1 (its records' ``message``
    and a request's ``show.turn`` count from 0), as ``status`` and the chat say it."""
    return f"message {n + 1}" if isinstance(n, int) and not isinstance(n, bool) else "message"


def _chat_detail(rec: Record) -> str:
    """A conversation's message (``chat.message``) or the reply its turn ended with."""
    label = _numbered(rec.get("message"))
    if rec["type"] == "chat.message":
        by = f" by {rec['by']}" if rec.get("by") else ""
        return f"{label}{by}: {_short(_json(rec.get('text')), 140)}"
    text = f"reply to {label}: {_short(_json(rec.get('reply')), 140)}"
    if rec.get("turn_error"):
        text += f"  (the turn failed: {_short(str(rec['turn_error']), 120)})"
    return text


def _waiting_detail(rec: Record) -> str:
    waiting = rec.get("waiting") or {}
    if waiting.get("kind") == "message":
        return f"for {_numbered((waiting.get('show') or {}).get('turn'))} of the conversation"
    return f"for a decision at {waiting.get('node')!r}"


def _requested_detail(rec: Record) -> str:
    if rec.get("kind") == "message":  # (its show: the last reply, the chat.reply before)
        return f"asks for {_numbered((rec.get('show') or {}).get('turn'))} of the conversation"
    parts = [f"{rec.get('kind', 'approval')}: shows {_short(_json(rec.get('show')), 100)}",
             "decisions " + ", ".join(rec.get("decisions") or [])]
    if rec.get("deadline"):
        parts.append(f"deadline {_when(rec['deadline'])}")
    return "  ".join(parts)


def _started_detail(rec: Record) -> str:
    text = f"workflow {rec.get('workflow')}"
    if rec.get("input"):
        text += "  input " + _short(_json(rec["input"]), 100)
    return text


def _continued_detail(rec: Record) -> str:
    parts = []
    if rec["type"] == "run.forked":
        parts.append(f"from {rec.get('parent_run')} at record {rec.get('parent_seq')}")
    if rec.get("by"):
        parts.append(f"by {rec['by']}")
    for key in ("config", "limits", "patch"):
        if rec.get(key):
            parts.append(f"{key} {_short(_json(rec[key]), 100)}")
    return "  ".join(parts)


def _migrated_detail(rec: Record) -> str:
    parts = [f"definition {str(rec.get('from_hash'))[:12]} -> {str(rec.get('to_hash'))[:12]}"]
    if rec.get("at_node"):
        parts.append(f"at {rec['at_node']}")
    if rec.get("by"):
        parts.append(f"by {rec['by']}")
    if rec.get("comment"):
        parts.append(_short(_json(rec["comment"]), 100))
    return "  ".join(parts)


_RECORD_DETAIL: dict[str, Callable[[Record], str]] = {
    "run.migrated": _migrated_detail,
    "run.code_changed": lambda rec: "code changed: " + "; ".join(
        f"{n} ({', '.join(m)})" for n, m in (rec.get("modules") or {}).items()),
    "approval.requested": _requested_detail,
    "approval.decided": lambda rec: (
        # a conversation's message taken (its text: the chat.message before), no approval
        "message accepted" + (f" from {rec['by']}" if rec.get("by") else "")
        if rec.get("kind") == "message" else f"{rec.get('decision')} {_decision_detail(rec)}"),
    "run.started": _started_detail,
    "run.resumed": _continued_detail,
    "run.forked": _continued_detail,
    "state.patched": lambda rec: "patch " + _short(_json(rec.get("patch")), 100),
    "effect.recorded": lambda rec: f"effect {rec.get('key')!r}",
    "child.started": lambda rec: f"child run {rec.get('run_id')} (workflow "
                                 f"{rec.get('workflow')}):",
    "run.waiting": _waiting_detail,
    "chat.message": _chat_detail,
    "chat.reply": _chat_detail,
}


def _edge_detail(rec: Record, spec: WorkflowSpec | None) -> str:
    edge = None
    if spec is not None and isinstance(rec.get("edge"), int) and rec["edge"] < len(spec.edges):
        edge = spec.edges[rec["edge"]]
    taken = rec.get("to")
    src = rec.get("from")
    if src in (None, "*") and edge is not None:
        src = _sources(edge)
    if taken:
        route = f"{src} -> {', '.join(taken)}"
    elif edge is not None:
        route = edge.describe()
    else:
        route = f"edge {rec.get('edge')} from {src}"
    parts = [route]
    expr = rec.get("expr")
    if expr is not None:
        value = "" if expr == "otherwise" else f" = {_short(_json(rec.get('value')))}"
        parts.append(f"[{_short(expr, 120)}{value}]")
    reason = rec.get("reason")
    parts.append(("taken" if taken else "skipped") + (f" ({reason})" if reason else ""))
    if rec.get("reads"):
        parts.append("read " + _short(_reads(rec["reads"]), 160))
    if rec.get("implied"):  # (log format 2: the definition implies it; no record of its own)
        parts.append("(implied)")
    return "  ".join(parts)
