"""The live progress of ``run``/``resume``/``fork`` (a line per node event and guarded
edge, on stderr) and the summary table printed when the run stops."""

from __future__ import annotations

import functools
import os
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

from ._format import (
    _STATUS_STYLE,
    _decision_detail,
    _duration,
    _json,
    _node_detail,
    _plural,
    _reads,
    _short,
    _sources,
    decision_flags,
    state_line,
    traceback_hint,
)
from ._gate_hints import (
    failed_hint,
    in_memory,
    is_unknown,
    memory_gone,
    outcome_notes,
    past_deadline,
    shown,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from .. import RunResult, WorkflowSpec
    from ..support import EdgeSpec, Record, RunView


SUMMARY_ROWS = 200  # the summary table's rows at most (see `Progress._table`)


@dataclass(slots=True)
class NodeStats:
    visits: set[int] = field(default_factory=set)
    duration_ms: float = 0.0
    tokens: int = 0
    status: str = "not run"
    # the decisions of the node's gate (an approval, a confirm: true node), per visit: a
    # decided gate's row shows them, not "completed" -- "rejected", or for a mapped
    # gate's items "3 approved, 2 rejected"
    decided: dict[int, Counter[str]] = field(default_factory=dict)
    mapped: bool = False

    def decided_status(self, visit: int) -> str | None:
        """What the row of a gate whose visit ``visit`` completed shows (None: completed
        -- no gate, or a confirm: true node approved, whose action then ran)."""
        counts = self.decided.get(visit)
        if not counts or set(counts) == {"confirmed"}:
            return None
        words: Counter[str] = Counter()
        for decision, n in counts.items():
            words["approved" if decision == "confirmed" else decision] += n
        if not self.mapped:
            return list(words)[-1]  # (the visit's decision)
        return ", ".join(f"{n} {d}" for d, n in sorted(words.items()))


class Progress:
    """The run's listener: prints the run id, a line per node event and per guarded edge
    decision (stderr), and collects what the summary table shows."""

    def __init__(self, run_id: str, *, live: bool, indent: str = "") -> None:
        self.run_id = run_id
        self.where = ""  # the options a printed follow-up command needs (--store, --server)
        self.remote = False  # a server's run (its follow-up commands go through it)
        self.live = live
        self.indent = indent  # a child run's lines: under its parent's node, marked "│"
        self.started = False
        self.t0 = time.perf_counter()
        self.stats: dict[str, NodeStats] = {}
        self.width = 0
        self._console: Console | None = None
        # A visit re-runs after a decision or a message (attempt N+1) as well as after a
        # failure: only a retry is shown as one, counted from the attempt that began
        # the series (``_first``: by node, visit, item); a conversation's node shows the
        # turn it answers (``_turn``: from the message gate it waited at)
        self._first: dict[tuple[str, int, int | None], int] = {}
        self._failed: set[tuple[str, int, int | None]] = set()
        self._turn: dict[str, int] = {}

    def __call__(self, rec: Record, view: RunView) -> None:
        try:
            self._on(rec, view)
        except BrokenPipeError:
            # the reader of stderr went away (`2>&1 | head`, a pager quit): the run goes
            # on, unprinted -- a listener's failure would stop it between two records
            self.live = False
            _to_devnull(sys.stderr)

    def _on(self, rec: Record, view: RunView) -> None:
        match rec["type"]:
            case "run.started":
                self._on_started(view.plan.spec)
            case "run.resumed":
                by = f" by {rec['by']}" if rec.get("by") else ""
                self._on_started(view.plan.spec, f"resumed{by}")
            case "run.forked":
                self._on_started(view.plan.spec, f"forked from {rec['parent_run']} at "
                                                 f"record {rec['parent_seq']}")
            case "node.started" | "node.completed" | "node.failed" | "node.retrying" \
                    | "node.visited":
                self._on_node(rec)
            case "edge.taken" | "edge.skipped":
                self._on_edge(rec, view.plan.spec.edges[rec["edge"]])
            case "approval.requested":
                self._on_waiting(rec)
            case "approval.decided":
                self._on_decided(rec)

    def child(self, run_id: str, workflow: str) -> Progress:
        """The listener of a child run (a sub-workflow node's): its records' lines, as
        they are committed, indented under the parent's; its nodes are not the parent's
        (the summary table is the parent's alone; `interlock trace` shows the child's)."""
        return Progress(run_id, live=self.live, indent=self.indent + "  │ ")

    def replay(self, records: list[Record]) -> None:
        """Count the node records of a run's earlier executions (printing nothing), so
        that the summary of a resumed or forked run covers the whole run."""
        live, self.live = self.live, False
        try:
            for rec in records:
                try:
                    if rec["type"] in ("node.started", "node.completed", "node.failed",
                                       "node.retrying", "node.visited"):
                        self._on_node(rec)
                    elif rec["type"] == "approval.requested":
                        self._on_waiting(rec)
                    elif rec["type"] == "approval.decided":
                        self._on_decided(rec)
                except (KeyError, TypeError, AttributeError):
                    # not a record the engine writes: a changed log, which the engine
                    # refuses to continue right after this; it is not counted
                    continue
        finally:
            self.live = live

    def _on_started(self, spec: WorkflowSpec, how: str = "") -> None:
        self.started = True
        self.t0 = time.perf_counter()
        self.stats = {name: self.stats.get(name, NodeStats()) for name in spec.nodes}
        self.width = max((len(n) for n in spec.nodes), default=0)
        verb = f"started ({how})" if how.startswith("forked") else how or "started"
        if self.indent:  # a child run
            self._emit([(f"child run {self.run_id} {verb}: workflow {spec.workflow}", "")])
        else:
            click.echo(f"run {self.run_id} {verb}: workflow {spec.workflow}", err=True)

    def _on_decided(self, rec: Record) -> None:
        node, decision = rec["node"], rec["decision"]
        st = self.stats.setdefault(node, NodeStats())
        item = rec.get("item")
        if item is None:  # (a map item's: the row waits for the others, then counts them)
            st.status = decision
        if rec.get("kind") in ("approval", "confirm"):  # the node's own gate
            mark = "confirmed" if rec["kind"] == "confirm" and decision == "approved" \
                else decision  # (a confirmed action runs: its completion says how it went)
            st.decided.setdefault(rec["visit"], Counter())[mark] += 1
            st.mapped = st.mapped or item is not None
        self._line(node if item is None else f"{node}[{item}]", decision,
                   _decision_detail(rec))

    def _on_node(self, rec: Record) -> None:
        node = rec["node"]
        st = self.stats.setdefault(node, NodeStats())
        st.tokens += rec.get("tokens") or 0
        status = "caught" if rec.get("caught") else rec["type"].removeprefix("node.")
        status = {"started": "running", "visited": "completed"}.get(status, status)
        if rec.get("caught"):  # failed, and an error edge took the run on
            status = "caught"
        item = rec.get("item")
        if item is not None:  # one item of a mapped node's visit: its line, not its row
            self._line(f"{node}[{item}]", status, self._detail(rec))
            return
        st.status = status
        if rec["type"] in ("node.started", "node.visited"):  # (visited: started, completed)
            st.visits.add(rec["visit"])
        elif rec["type"] == "node.completed":  # a decided gate's row: its decision
            st.status = st.decided_status(rec["visit"]) or status
        st.duration_ms += rec.get("duration_ms") or 0.0
        self._line(node, status, self._detail(rec))

    def _detail(self, rec: Record) -> str:
        """A node record's detail, with the attempt of a retry (not the visit's attempt
        count, which a decision or a conversation's message raises too)."""
        kind, node = rec["type"], rec["node"]
        key = (node, rec.get("visit", 1), rec.get("item"))
        if kind in ("node.failed", "node.retrying"):
            self._failed.add(key)
        if kind != "node.started":
            return _node_detail(rec)
        attempt = rec.get("attempt", 1)
        if key in self._failed:  # a retry, or a resume of a failed visit
            self._failed.discard(key)
            shown = attempt - self._first.get(key, 1) + 1
        else:
            self._first[key] = attempt
            shown = 1
        turn = self._turn.get(node)
        detail = _node_detail({**rec, "attempt": shown}) if attempt != shown else \
            _node_detail(rec)
        return f"turn {turn}  {detail}".rstrip() if turn is not None else detail

    def _on_waiting(self, rec: Record) -> None:
        node = rec["node"]
        self.stats.setdefault(node, NodeStats()).status = "waiting"
        if rec.get("kind") == "message":  # a conversation, between turns
            turn = (rec.get("show") or {}).get("turn")
            if isinstance(turn, int):  # (the turns answered so far)
                self._turn[node] = turn + 1
            self._line(node, "waiting", "for the next message")
            return
        item = rec.get("item")
        what = "OUTCOME UNKNOWN (approving runs it again): " if is_unknown(rec) \
            else "for approval: "
        self._line(node if item is None else f"{node}[{item}]", "waiting",
                   what + _short(_json(shown(rec)), 100))

    def _on_edge(self, rec: Record, edge: EdgeSpec) -> None:
        expr, reason = rec.get("expr"), rec.get("reason")
        if expr is None and reason is None:
            return  # an unconditional edge: nothing to explain
        taken = rec.get("to")
        route = f"{_sources(edge)} -> {', '.join(taken)}" if taken else edge.describe()
        parts = [route]
        if expr is not None:
            value = "" if expr == "otherwise" else f" = {_short(_json(rec.get('value')))}"
            parts.append(f"[{_short(expr)}{value}]")
        parts.append(("taken" if taken else "skipped") + (f" ({reason})" if reason else ""))
        if not taken and rec.get("reads"):
            parts.append(_short(_reads(rec["reads"]), 100))
        self._emit([("  " + "  ".join(parts), _STATUS_STYLE["taken" if taken else "skipped"])])

    def _line(self, node: str, status: str, detail: str) -> None:
        if not self.live:
            return
        parts = [("  ", ""), (node.ljust(self.width), "bold"), ("  ", ""),
                 (status, _STATUS_STYLE.get(status, ""))]
        if detail:
            parts.append((" " * (11 - len(status)) + detail, ""))
        self._emit(parts)

    def _text(self, text: str, status: str) -> Text:
        from rich.text import Text

        return Text(text, style=_STATUS_STYLE.get(status, ""))

    def _emit(self, parts: list[tuple[str, str]]) -> None:
        """One line on stderr, each ``(text, style)`` part in its style on a terminal.

        Written straight to the console's file: ``Console.print`` costs ~0.5 ms a line,
        which a 10,000-node run paid 20,000 times; a style's ANSI codes are Rich's own
        (`Style.render`), made once per style.
        """
        if not self.live:
            return
        if self.indent:
            parts = [(self.indent, "dim"), *parts]
        console = self._console
        if console is None:
            from rich.console import Console

            console = self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        if console.color_system is None:  # not a terminal, or NO_COLOR: the text alone
            line = "".join(text for text, _ in parts)
        else:
            line = "".join(_styled(text, style, console.color_system) if style else text
                           for text, style in parts)
        console.file.write(line + "\n")
        console.file.flush()

    def print_summary(self, result: RunResult) -> None:
        """The table of nodes and the final status, on stdout (a reader that went away
        changes nothing: the exit status stays the run's)."""
        try:
            self._print_summary(result)
        except BrokenPipeError:
            _to_devnull(sys.stdout)

    def _print_summary(self, result: RunResult) -> None:
        from rich.console import Console
        from rich.text import Text

        out = Console(highlight=False)
        # rich exits 1 on a closed pipe; here the exit status is the run's
        out.on_broken_pipe = functools.partial(_to_devnull, sys.stdout)  # type: ignore[method-assign]
        table, left_out = self._table()
        if table.row_count or not left_out:
            out.print(table)
        if left_out:
            out.print(left_out, soft_wrap=True, markup=False)
        elapsed = (time.perf_counter() - self.t0) * 1000
        head = Text()
        head.append(result.status, style=_STATUS_STYLE.get(result.status, ""))
        head.append(f"  run {result.run_id}, {_plural(result.steps, 'step')}, "
                    f"{_plural(result.tokens, 'token')}, {_duration(elapsed)}")
        out.print(head, soft_wrap=True)
        for line in _outcome_lines(result, self.where, self.remote):
            out.print(line, soft_wrap=True, markup=False)

    def _table(self) -> tuple[Table, str]:
        """The summary table, and what it leaves out: a workflow of more than
        `SUMMARY_ROWS` nodes gets a row for each node neither completed nor not run (the
        first `SUMMARY_ROWS` of them) and a line that counts them all by status --
        a table of 10,000 rows summarises nothing and takes Rich ~10 s to draw."""
        from collections import Counter

        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
        table.add_column("node")
        for name in ("visits", "duration", "tokens"):
            table.add_column(name, justify="right")
        table.add_column("status")
        rows, left_out = list(self.stats.items()), ""
        if len(rows) > SUMMARY_ROWS:
            counts = Counter(st.status for _, st in rows)
            rows = [(n, st) for n, st in rows if st.status not in ("completed", "not run")]
            shown = rows[:SUMMARY_ROWS]
            left_out = (f"{len(self.stats):,} nodes: "
                        + ", ".join(f"{c:,} {status}" for status, c in counts.most_common()))
            if shown:
                left_out += (f"; the table lists {len(shown):,} of the {len(rows):,} that "
                             "are neither completed nor not run")
            left_out += f" (interlock trace {self.run_id} shows every record)"
            rows = shown
        for node, st in rows:
            table.add_row(node, str(len(st.visits)), _duration(st.duration_ms) if st.visits
                          else "-", str(st.tokens), self._text(st.status, st.status))
        return table, left_out


def _outcome_lines(result: RunResult, where: str = "", remote: bool = False) -> list[str]:
    """What follows the summary table: the final state, the error (and what can be done
    about it, as `status` says it: the engine's message names no command, which would
    not know the store), and what the run waits for with the command that goes on --
    each command with ``where`` (the options that reach the same store or server)."""
    lines = []
    state = state_line(result, where)
    if state:
        lines.append(state)
    if result.error:
        node = result.error.get("node")
        at = f" at node {node!r}" if node else ""
        lines.append(f"error ({result.error.get('type')}){at}: {result.error.get('message')}")
        if result.status == "FAILED":
            lines.append(failed_hint(result.run_id, result.error, where, remote))
    rid = shlex.quote(result.run_id)
    lines += traceback_hint(result, where)  # (after the error's lines)
    if result.waiting and result.waiting.get("kind") == "message":  # a conversation
        # the turn's reply (or why the turn failed): a decision that let the turn go on
        # is answered here too, not only by `send`
        show = result.waiting.get("show") or {}
        if show.get("turn_error"):
            lines.append(f"the turn failed: {show['turn_error']}")
        elif isinstance(show.get("last_reply"), str):
            lines.append(f"reply: {show['last_reply']}")
        lines.append(f"waiting for the next message: interlock send {rid} TEXT{where}, or "
                     f"interlock chat FILE --session {rid}{where}")
    elif result.waiting:
        w = result.waiting
        lines.append(f"waiting for a decision at {w.get('node')!r}; shows {_json(shown(w))}")
        if not remote and in_memory(where):  # (no later command can decide it)
            return [*lines, memory_gone("decide it")]
        lines += outcome_notes(w)
        # the gate named: a repeated command (a retry, a double click) is then refused as
        # a second decision, instead of deciding whichever gate waits next
        from ..support import decide_command, decide_hint

        hint = decide_hint(result.run_id, w, where) if not is_unknown(w) else decide_command(
            result.run_id, w.get("node"),
            " | ".join(decision_flags(w, short=True)) + " [--by NAME] [--comment TEXT]", where)
        lines.append(past_deadline(result.run_id, w, where) or f"decide with: {hint}")
        others = [str(g.get("node")) + (" (OUTCOME UNKNOWN: approving runs it AGAIN; "
                                        "`interlock status` explains)" if is_unknown(g) else "")
                  for g in w.get("pending") or ()
                  if isinstance(g, dict) and g.get("node") != w.get("node")]
        if others:
            lines.append(f"also waiting, each decided on its own with --gate: "
                         f"{', '.join(others)}")
        lines += [line for g in w.get("pending") or () if isinstance(g, dict)
                  and g.get("node") != w.get("node")
                  for line in [past_deadline(result.run_id, g, where)] if line]
    return lines


@functools.cache
def _style_codes(style: str, color_system: str) -> tuple[str, str]:
    """The ANSI codes Rich writes before and after a text in ``style``."""
    from rich.console import COLOR_SYSTEMS
    from rich.style import Style

    marked = Style.parse(style).render("\0", color_system=COLOR_SYSTEMS[color_system])
    before, _, after = marked.partition("\0")
    return before, after


def _styled(text: str, style: str, color_system: str) -> str:
    before, after = _style_codes(style, color_system)
    return f"{before}{text}{after}"


def _to_devnull(stream: object) -> None:
    """Point a closed pipe's descriptor at /dev/null, so that nothing written to it later
    (Python's own flush at exit included) fails (the recipe of Python's `signal` docs)."""
    fileno = getattr(stream, "fileno", None)
    try:
        fd = fileno() if fileno is not None else -1
    except (OSError, ValueError):
        return
    if fd >= 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
