"""The commands that look without changing anything: ``validate`` and ``graph`` (a
workflow file), ``status``, ``runs`` and ``verify`` (stored runs)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ._common import (
    EXIT_USAGE,
    CliError,
    call_engine,
    echo_diagnostics,
    exit_code_for,
    json_option,
    need_store,
    store_option,
    with_store,
)
from ._format import (
    _STATUS_STYLE,
    _age,
    _ago,
    _json,
    _plural,
    _short,
    _when,
    decision_flags,
    state_line,
    traceback_hint,
    where_options,
)
from ._gate_hints import (
    beside,
    code_drift,
    data_example,
    failed_hint,
    is_unknown,
    outcome_notes,
    past_deadline,
    shown,
)
from ._remote import Remote, server_options

if TYPE_CHECKING:
    from .. import Diagnostic, RunResult, Store
    from ..support import RunRow


# -- validate ---------------------------------------------------------------------------------


@click.command(short_help="Check a workflow without running it.")
@click.argument("workflow", metavar="WORKFLOW")
def validate(workflow: str) -> None:
    """Check WORKFLOW without running it: print every problem as file:line:col.

    Exits 2 when there is any error, 0 otherwise (warnings alone do not fail).
    """
    from .. import WorkflowError, load

    try:
        wf = load(workflow)
    except WorkflowError as exc:
        _report_invalid(workflow, exc.diagnostics)
    spec = wf.spec
    warnings = wf.warnings
    echo_diagnostics(warnings, err=False)  # first, like an invalid file's, the verdict last
    click.echo(f"ok: {workflow} ({_plural(len(spec.nodes), 'node')}, "
               f"{_plural(len(spec.edges), 'edge')}"
               + (f", {_plural(len(warnings), 'warning')}" if warnings else "") + ")")


def _report_invalid(workflow: str, diagnostics: list[Diagnostic]) -> NoReturn:
    echo_diagnostics(diagnostics, err=False)
    errors = sum(1 for d in diagnostics if d.severity == "error")
    warnings = len(diagnostics) - errors
    click.echo(f"invalid: {workflow} ({_plural(errors, 'error')}, "
               f"{_plural(warnings, 'warning')})")
    raise SystemExit(EXIT_USAGE)


# -- graph ------------------------------------------------------------------------------------


@click.command(short_help="Print a workflow's graph (Mermaid or DOT).")
@click.argument("workflow", metavar="WORKFLOW")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid",
              show_default=True, help="Mermaid flowchart or Graphviz DOT.")
def graph(workflow: str, fmt: str) -> None:
    """Print WORKFLOW's graph: nodes, joins, and the condition on every edge.

    Only the file is read (node modules are not imported), so a workflow can be
    drawn while it is still being written; `interlock validate` checks it.
    """
    from .. import WorkflowError
    from ..support import load_spec, to_dot, to_mermaid

    try:
        spec = load_spec(workflow)
    except WorkflowError as exc:
        echo_diagnostics(exc.diagnostics, err=True)
        raise SystemExit(EXIT_USAGE) from None
    click.echo(to_mermaid(spec) if fmt == "mermaid" else to_dot(spec), nl=False)


# -- status -----------------------------------------------------------------------------------


@click.command(short_help="Show where a run stands.")
@click.argument("run_id", metavar="RUN_ID")
@json_option
@store_option
@server_options
def status(run_id: str, as_json: bool, store_url: str | None, server_url: str | None,
           token: str | None) -> None:
    """Show RUN_ID's status, counts and error; for a run waiting for approval, the gate,
    what it shows and how to decide.

    Exits like `run`: 0 completed (or not finished: PENDING, RUNNING), 1 failed, 3
    waiting, 4 rejected.
    """
    from .. import status as run_status

    async def go(st: Store) -> tuple[RunResult, RunRow]:
        return await run_status(run_id, store=st), await st.get_run(run_id)

    if server_url:
        remote = Remote(server_url, token, store_url)
        try:
            result = remote.result(run_id)
            row = remote.row(run_id, result, remote.records(run_id))
        finally:
            remote.close()
    else:
        need_store(store_url)
        result, row = call_engine(with_store(store_url, go))
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        _print_status(result, row, store_url, where_options(store_url, server_url, token),
                      remote=bool(server_url))
    # a run not finished (recorded for a worker, or being executed) has not failed: the
    # status line says which; `run` and `resume` wait for the end instead
    sys.exit(0 if result.status in ("PENDING", "RUNNING", "RETRYING")
             else exit_code_for(result.status))


def _print_status(result: RunResult, row: RunRow, store_url: str | None,
                  where: str = "", *, remote: bool = False) -> None:
    from rich.console import Console
    from rich.text import Text

    out = Console(highlight=False, soft_wrap=True)
    head = Text()
    head.append(result.status, style=_STATUS_STYLE.get(result.status, ""))
    head.append(f"  run {result.run_id}: workflow {result.workflow}, "
                f"{_plural(result.steps, 'step')}, {_plural(result.tokens, 'token')}")
    out.print(head)
    lines = [f"created {_when(row.created_at)}, updated {_when(row.summary.updated_at)}"]
    if row.parent_run:
        lines.append(f"forked from {row.parent_run} at record {row.parent_seq}")
    if result.error:
        e = result.error
        at = f" at node {e.get('node')!r}" if e.get("node") else ""
        lines.append(f"error ({e.get('type')}){at}: {e.get('message')}")
    store = where_options(store_url)
    where = where if remote else store  # (the options that reach the run again)
    rid = shlex.quote(result.run_id)
    lines += traceback_hint(result, where)  # (after the error line)
    state = state_line(result, where)
    if state:
        lines.append(state)
    live = _executing(row)
    seen = None if remote else live  # (a server's client does not see the lease)
    if result.code_changed:  # seen before a decision: the rest runs on the code as it is
        lines.append(code_drift(result.code_changed))
    if result.waiting:
        lines += _waiting_lines(result.run_id, result.waiting, where, seen)
    elif result.status in ("RUNNING", "RETRYING", "PENDING"):
        if live:
            lines.append(f"being executed by {row.owner}")
        elif result.status == "PENDING":
            here = ("have the server execute it with `interlock resume "
                    f"{rid}{where}` (it refuses, 409, when an agent's API key the run "
                    "needs is not set where it runs)"
                    if remote else f"execute it here with `interlock resume {rid}{where}`")
            lines.append(f"pending: waiting for a worker (`interlock worker{store}` executes "
                         f"it), or {here}")
        else:
            lines.append(f"interrupted: no process is executing it; continue with "
                         f"`interlock resume {rid}{where}`")
    elif result.status == "FAILED":
        lines.append(failed_hint(result.run_id, result.error, where, remote))
    for line in lines:
        out.print(line, markup=False)


def _executing(row: RunRow) -> bool:
    """Whether a process executes the run: it holds a lease not expired, and is not
    gone (the rule `resume` takes a run over by)."""
    from ..support import owner_gone

    return bool(row.owner and row.lease_until and row.lease_until > time.time()
                and not owner_gone(row.owner))


def _interrupted(row: RunRow) -> bool:
    """A run left RUNNING (or RETRYING) by a process that is gone: `resume` continues it."""
    return row.summary.status in ("RUNNING", "RETRYING") and not _executing(row)


def _waiting_lines(run_id: str, w: dict[str, Any], where: str, live: bool | None = None
                   ) -> list[str]:
    gate = w.get("node")
    since = ""
    if w.get("requested_at"):
        since = f" for {_age(time.time() - w['requested_at'])}"
    if w.get("kind") == "message":  # a conversation, between turns
        return _message_lines(run_id, w, since, where)
    lines = [f"waiting for a decision at {gate!r}{since}"]
    if w.get("deadline"):
        left = w["deadline"] - time.time()
        due = f"in {_age(left)}" if left > 0 else f"passed {_age(-left)} ago"
        lines.append(f"deadline: {_when(w['deadline'])} ({due})")
    show = shown(w)
    if show:
        lines.append("shows:")
        lines += [f"  {field_} = {_json(value)}" for field_, value in show.items()]
    decisions = list(w.get("decisions") or [])
    lines.append(f"decisions: {', '.join(decisions)}")
    if w.get("input") is not None:
        what = "--modify's patch" if w.get("kind") == "tool" else "--data"
        lines.append(f"input ({what} must satisfy): {_json(w['input'])}")
    from ..support import decide_command

    lines += outcome_notes(w)
    passed = past_deadline(run_id, w, where)
    if passed:
        lines.append(passed)
    else:
        lines.append("decide with:")
    for flag in [] if passed else decision_flags(w):  # the gate named: a repeat is refused
        lines.append("  " + decide_command(run_id, gate, f"{flag} --by NAME [--comment TEXT]",
                                           where))
    pending = [g for g in w.get("pending") or () if isinstance(g, dict)]
    others = [g for g in pending if g.get("node") != gate]
    if others:
        lines.append("also waiting (each decided on its own, with --gate):")
        lines += [f"  {g.get('node')!s} ({g.get('kind')}, "
                  f"{', '.join(g.get('decisions') or [])})" for g in others]
        for g in others:  # each unknown outcome explained, not only the oldest gate's
            passed = past_deadline(run_id, g, where)
            if passed:
                lines.append(f"  {passed}")
            notes = outcome_notes(g)
            lines += [f"  {g.get('node')!s}: {line}" for line in notes]
            if notes:
                lines.append(f"  {g.get('node')!s}: decide with: interlock resume {run_id} "
                             f"--gate {g.get('node')} "
                             f"{' | '.join(decision_flags(g, short=True))} --by NAME{where}")
    running = w.get("running")
    if isinstance(running, list):  # the run's other branches, still at work meanwhile
        lines.append(beside(running, run_id, where, live))
    return lines


def _message_lines(run_id: str, w: dict[str, Any], since: str, where: str) -> list[str]:
    """A conversation waiting for its next message: the last reply (or why the turn
    failed) and how to send the message."""
    show = w.get("show") or {}
    lines = [f"waiting for message {int(show.get('turn') or 0) + 1} of the conversation "
             f"(to {w.get('node')!r}){since}"]
    if show.get("turn_error"):
        lines.append(f"the last turn failed: {show['turn_error']}")
    elif isinstance(show.get("last_reply"), str):
        lines.append(f"last reply: {_short(show['last_reply'], 400)}")
    rid = shlex.quote(run_id)
    lines.append(f"send it with: interlock send {rid} TEXT{where}, or interlock chat FILE "
                 f"--session {rid}{where}")
    return lines


# -- runs -------------------------------------------------------------------------------------


STATUSES = ["PENDING", "RUNNING", "RETRYING", "WAITING_APPROVAL", "WAITING_INPUT", "COMPLETED",
            "FAILED",
            "REJECTED", "CANCELLED"]


@click.command(short_help="List runs, newest first.")
@click.option("--status", "status_", type=click.Choice(STATUSES, case_sensitive=False),
              help="Only runs in this status.")
@click.option("--workflow", metavar="NAME", help="Only runs of this workflow.")
@click.option("--waiting", is_flag=True,
              help="Only runs waiting for a person -- at a gate (with how long it has "
                   "waited and its deadline), or conversations waiting for a message.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="At most this many runs.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the runs as one JSON list of objects on stdout.")
@store_option
@server_options
def runs(status_: str | None, workflow: str | None, waiting: bool, limit: int, as_json: bool,
         store_url: str | None, server_url: str | None, token: str | None) -> None:
    """List the runs in the store, newest first."""
    from .. import list_runs

    if status_ is not None:
        status_ = status_.upper()
    statuses = [status_]
    if waiting:
        if status_ not in (None, "WAITING_APPROVAL", "WAITING_INPUT"):
            raise CliError(f"--waiting lists WAITING_APPROVAL and WAITING_INPUT runs; it "
                           f"cannot be combined with --status {status_}")
        # a gate, or a conversation waiting for its next message
        statuses = [status_] if status_ else ["WAITING_APPROVAL", "WAITING_INPUT"]
    rows = []
    for one in statuses:
        if server_url:
            remote = Remote(server_url, token, store_url)
            try:
                rows += remote.rows(status=one, workflow=workflow, limit=limit)
            finally:
                remote.close()
        else:
            if need_store(store_url, listing=True) is not None:
                break  # (the default store, not made yet: no runs)
            rows += call_engine(list_runs(store=store_url, status=one, workflow=workflow,
                                          limit=limit))
    if len(statuses) > 1:
        rows = sorted(rows, key=lambda r: r.created_at, reverse=True)[:limit]
    if waiting:
        rows = through_parents(rows)
    if as_json:
        from ..support import run_json

        if waiting:  # one entry per gate (several gates at once)
            out = [{**run_json(r), "waiting": g} for r in rows for g in _gates(r)]
        else:
            out = [run_json(r) for r in rows]
        click.echo(json.dumps(out, ensure_ascii=False))
        return
    if not rows:
        click.echo("no runs waiting for a person" if waiting else "no runs")
    elif waiting:
        _print_waiting(rows, where_options(store_url, server_url, token))
    else:
        _print_runs(rows, where_options(store_url, server_url, token),
                    remote=bool(server_url))
    if len(rows) == limit:
        click.echo(f"(the newest {limit}; see more with --limit)", err=True)


def _parent(row: RunRow) -> str:
    """A fork's origin (``run@seq``), or a child run's parent (``run/node``)."""
    if row.parent_run:
        return f"{row.parent_run}@{row.parent_seq}"
    link = row.options.get("parent")
    if isinstance(link, dict):
        return f"{link.get('run')}/{link.get('node')}"
    return "-"


def _print_runs(rows: list[RunRow], where: str = "", *, remote: bool = False) -> None:
    """The runs' table; a run no process executes any more marked ``(interrupted)`` as
    `status` says it (a server's client does not see the leases: never marked)."""
    header = ["run id", "workflow", "status", "steps", "tokens", "created", "updated", "parent"]
    stopped = [] if remote else [r.run_id for r in rows if _interrupted(r)]
    body = [[r.run_id, r.workflow, r.summary.status
             + (" (interrupted)" if r.run_id in stopped else ""), str(r.summary.steps),
             str(r.summary.tokens), _when(r.created_at), _ago(r.summary.updated_at),
             _parent(r)] for r in rows]
    _print_columns(header, body, right={3, 4}, status_col=2)
    if stopped:
        click.echo(f"(interrupted): no process executes the run any more (its process "
                   f"stopped or was killed); continue it with `interlock resume RUN_ID{where}`",
                   err=True)


def _print_waiting(rows: list[RunRow], where: str = "") -> None:
    header = ["run id", "workflow", "gate", "waiting", "deadline", "shows"]
    now = time.time()
    body, notes = [], []
    for r, w in [(row, g) for row in rows for g in _gates(row)]:
        notes += _row_notes(r.run_id, w, where)
        requested = w.get("requested_at")
        deadline = w.get("deadline")
        if deadline is None:
            due = "-"
        elif deadline > now:
            due = f"{_when(deadline)} (in {_age(deadline - now)})"
        else:
            due = f"{_when(deadline)} (passed)"
        gate = str(w.get("node", "?"))
        if w.get("kind") == "message":  # a conversation: it waits for a message
            gate = f"message to {gate}"
        elif is_unknown(w):  # approving it runs a destructive action again
            gate = f"{gate} (OUTCOME UNKNOWN)"
        body.append([r.run_id, r.workflow, gate,
                     _age(now - requested) if requested else "?", due,
                     _short(_json(shown(w)), 60)])
    _print_columns(header, body, right={3})
    click.echo(_footer([g for row in rows for g in _gates(row)], where), err=True)
    for line in notes:
        click.echo(line, err=True)


def _footer(gates: list[dict[str, Any]], where: str) -> str:
    """How to decide what `runs --waiting` lists: only the decisions its gates take (an
    unknown outcome's --data, no --modify where none takes it), and a message when a
    conversation is listed."""
    from ..support import decide_hint

    decided = [g for g in gates if g.get("kind") != "message"]
    said = f"a message: interlock send RUN_ID TEXT{where}"
    if not decided:  # conversations only
        return said
    if all(is_unknown(g) for g in decided):  # its own options: approving runs it again
        every: dict[str, Any] = {**decided[0], "node": "GATE"}
    else:
        every = {"node": "GATE", "decisions": [d for d in ("approve", "reject", "modify") if
                                               any(d in (g.get("decisions") or ())
                                                   for g in decided)]}
    hint = f"decide with: {decide_hint('RUN_ID', every, where)}"
    return f"{hint}; {said}" if len(decided) < len(gates) else hint


def _row_notes(run_id: str, w: dict[str, Any], where: str = "") -> list[str]:
    """What `runs --waiting` says under its table about a gate: an unknown outcome
    explained, a gate past its deadline resumed instead of decided -- each command with
    ``where`` (the options that reach the same store or server)."""
    lines = [f"  {line}" for line in outcome_notes(w)]
    if lines:
        from ..support import decide_command

        lines.insert(0, f"{run_id} --gate {w.get('node')}:")
        lines.append("  (" + decide_command(run_id, w.get("node"), (
            f"--approve | --reject | --approve --data '{data_example(w)}' --by NAME"),
            where) + ")")
    passed = past_deadline(run_id, w, where)
    return lines + ([f"{run_id}: {passed}"] if passed else [])


def through_parents(rows: list[RunRow]) -> list[RunRow]:
    """``rows`` less each child run whose parent is listed waiting at the child's gates
    (``parent_node/gate``): one row per gate, the parent's, where it is decided."""
    gates = {r.run_id: [str(g.get("node", "")) for g in _gates(r)] for r in rows}

    def shown_by_parent(row: RunRow) -> bool:
        link = row.options.get("parent")
        parent = link.get("run") if isinstance(link, dict) else None
        return any("/" in node for node in gates.get(str(parent), ()))

    return [r for r in rows if not shown_by_parent(r)]


def _gates(row: RunRow) -> list[dict[str, Any]]:
    """The gates a run waits at: its ``waiting.pending`` (one, from a log before it)."""
    w = row.summary.waiting or {}
    pending = w.get("pending")
    return [g for g in pending if isinstance(g, dict)] if isinstance(pending, list) \
        and pending else [w]


def _print_columns(header: list[str], body: list[list[str]], *, right: set[int],
                   status_col: int | None = None) -> None:
    """Aligned columns, never wrapped (so the output greps and pipes as it reads)."""
    from rich.console import Console
    from rich.text import Text

    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(cells: list[str], style: str = "") -> Text:
        text = Text(style=style)
        for i, cell in enumerate(cells):
            padded = cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            if i == len(cells) - 1:
                padded = padded.rstrip()
            cell_style = _STATUS_STYLE.get(cell, "") if i == status_col and not style else ""
            text.append(padded, style=cell_style)
            if i < len(cells) - 1:
                text.append("  ")
        return text

    out = Console(highlight=False, soft_wrap=True)
    out.print(line(header, "bold"))
    for row in body:
        out.print(line(row))
