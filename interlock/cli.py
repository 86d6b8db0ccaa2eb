"""The ``interlock`` command line (SPEC §4).

Every command is a small Click function that parses its options, calls the
Python API, and turns the outcome into output and an exit code. Conventions
shared by all commands (keep them when adding one):

- results go to stdout; progress, run ids, warnings and errors go to stderr;
  ``--json`` prints exactly one JSON object on stdout and nothing else there;
- exit codes: 0 completed, 1 failed, 2 invalid usage / invalid workflow /
  refused, 3 waiting for approval, 4 rejected (`exit_code_for`);
- a mistake the user can fix raises `CliError` (exit 2, ``error: ...``);
- heavy modules (the engine, Rich) are imported inside the commands, so that
  ``interlock --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from . import RunResult, Workflow
    from ._errors import Diagnostic
    from ._fold import RunView
    from ._log import Record
    from ._model import EdgeSpec, WorkflowSpec
    from ._store import RunRow, Store

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

EXIT_COMPLETED, EXIT_FAILED, EXIT_USAGE, EXIT_WAITING, EXIT_REJECTED = 0, 1, 2, 3, 4

_STATUS_EXIT = {
    "COMPLETED": EXIT_COMPLETED,
    "FAILED": EXIT_FAILED,
    "CANCELLED": EXIT_FAILED,
    "WAITING_APPROVAL": EXIT_WAITING,
    "REJECTED": EXIT_REJECTED,
}


def exit_code_for(status: str) -> int:
    """The exit code of ``run``/``resume``/``status`` for a run in ``status``."""
    return _STATUS_EXIT.get(status, EXIT_FAILED)


class CliError(click.ClickException):
    """A mistake the user can fix: printed as ``error: <message>``, exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


# -- the command group and shared options --------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="interlock", prog_name="interlock")
def cli() -> None:
    """interlock: graph workflows that execute exactly what they declare.

    Exit codes: 0 completed, 1 failed, 2 invalid usage or workflow,
    3 waiting for approval, 4 rejected.
    """


def main(argv: list[str] | None = None) -> None:
    """The console script (``interlock``) and ``python -m interlock``."""
    try:
        cli.main(args=argv, prog_name="interlock", standalone_mode=True)
    except SystemExit as exc:
        _exit_now_if_threads_were_abandoned(exc.code)
        raise


def _exit_now_if_threads_were_abandoned(code: Any) -> None:
    """A sync node that timed out keeps its worker thread (it cannot be interrupted);
    the run has ended and said so, so the process does not wait for that thread."""
    guards = sys.modules.get("interlock._guards")
    if guards is not None and getattr(guards, "abandoned", None):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def store_option(fn: F) -> F:
    return click.option(
        "--store", "store_url", metavar="URL",
        help="Where runs live: sqlite:///rel.db, sqlite:////abs.db, postgresql://..., "
             "memory:// (default: $INTERLOCK_STORE, then sqlite:///./.interlock/runs.db).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True,
        help="Print the run as one JSON object on stdout (and nothing else there).",
    )(fn)


def set_option(fn: F) -> F:
    return click.option(
        "--set", "sets", multiple=True, metavar="K=V",
        help="Override config (a.b=V sets a nested key) or a limit (limits.steps=50). "
             "V is read as JSON (0.9, true, null, \"text\"); anything else is a string.",
    )(fn)


# -- shared helpers --------------------------------------------------------------------------


def echo_diagnostics(diagnostics: list[Diagnostic], *, err: bool) -> None:
    for d in diagnostics:
        click.echo(str(d), err=err)


def load_workflow(path: str) -> Workflow:
    """Load and validate ``path``; on errors print each diagnostic to stderr and exit 2."""
    from ._errors import WorkflowError
    from ._workflow import load

    try:
        return load(path)
    except WorkflowError as exc:
        echo_diagnostics(exc.diagnostics, err=True)
        raise SystemExit(EXIT_USAGE) from None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# -- run -----------------------------------------------------------------------------------


@cli.command(short_help="Run a workflow.")
@click.argument("workflow", metavar="WORKFLOW")
@click.option("--input", "input_json", metavar="JSON",
              help='The run\'s input as a JSON object, e.g. \'{"error_event": {...}}\'.')
@click.option("--input-file", metavar="PATH",
              help="Read the run's input (a JSON object) from PATH ('-' for stdin).")
@set_option
@click.option("--run-id", metavar="ID", help="Use this run id instead of a generated one.")
@json_option
@store_option
def run(workflow: str, input_json: str | None, input_file: str | None, sets: tuple[str, ...],
        run_id: str | None, as_json: bool, store_url: str | None) -> None:
    """Run WORKFLOW (a .yaml/.json file) until it completes, fails or waits for approval."""
    data = read_input(input_json, input_file)
    config_sets, limits = parse_sets(sets)
    wf = load_workflow(workflow)
    for warning in wf.warnings:
        click.echo(str(warning), err=True)
    config = config_overrides(wf.spec.config, config_sets)
    from ._runs import make_run_id

    rid = run_id or make_run_id()
    progress = Progress(rid, live=not as_json)
    result = _execute(wf, data, store_url, rid, config, limits, progress)
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        progress.print_summary(result)
    sys.exit(exit_code_for(result.status))


def _execute(wf: Workflow, data: dict[str, Any], store_url: str | None, run_id: str,
             config: dict[str, Any], limits: dict[str, Any], progress: Progress) -> RunResult:
    """``wf.run`` with the engine's usage and store errors turned into `CliError`."""
    return call_engine(wf.run(data, store=store_url, run_id=run_id, config=config or None,
                              limits=limits or None, listener=progress), progress)


def call_engine(coro: Coroutine[Any, Any, T], progress: Progress | None = None) -> T:
    """Run ``coro`` to completion; the engine's usage errors (a refused decision, an
    unknown run, a claimed run, a bad store URL) become `CliError` (exit 2)."""
    import asyncio

    from pydantic import ValidationError

    from ._errors import UsageError
    from ._store import StoreError

    try:
        return asyncio.run(coro)
    except (UsageError, StoreError) as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:  # a --set limits.X value of the wrong type or range
        raise CliError(_limit_problems(exc)) from None
    except KeyboardInterrupt:
        if progress is not None and progress.started:
            click.echo(f"interrupted: run {progress.run_id} stopped; its completed nodes are "
                       "kept in the store (continue with `interlock resume "
                       f"{progress.run_id}`)", err=True)
        raise SystemExit(130) from None


async def with_store(store_url: str | None, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store at ``store_url`` (None: the default), call ``fn`` with it, close it."""
    from ._store import open_store

    st = open_store(store_url)
    try:
        return await fn(st)
    finally:
        await st.close()


def _limit_problems(exc: Any) -> str:
    problems = [f"limits.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return "invalid --set " + "; ".join(problems)


def read_input(input_json: str | None, input_file: str | None) -> dict[str, Any]:
    """The run's input from ``--input`` or ``--input-file`` (at most one), as a dict."""
    if input_json is not None and input_file is not None:
        raise CliError("use either --input or --input-file, not both")
    if input_file is not None:
        return _parse_input(_read_text(input_file), f"--input-file {input_file}")
    if input_json is not None:
        return _parse_input(input_json, "--input")
    return {}


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise CliError(f"cannot read --input-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"--input-file {path} is not UTF-8 text: {exc.reason}") from None


def _parse_input(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                       f"{exc.colno}; expected an object such as '{{\"field\": 1}}'") from None
    if not isinstance(value, dict):
        raise CliError(f"{where} must be a JSON object of input fields (such as "
                       f"'{{\"field\": 1}}'), got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


# -- --set K=V -------------------------------------------------------------------------------

ConfigSet = tuple[tuple[str, ...], Any]


def parse_sets(sets: tuple[str, ...]) -> tuple[list[ConfigSet], dict[str, Any]]:
    """Split ``--set`` pairs into config assignments (key path, value) and limits."""
    config: list[ConfigSet] = []
    limits: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        path = tuple(key.strip().split("."))
        if not sep or not all(path):
            raise CliError(f"--set {item!r}: expected KEY=VALUE, such as --set threshold=0.8, "
                           "--set model.name=gpt-4o or --set limits.steps=50")
        value = parse_value(raw)
        if path[0] == "limits":
            if len(path) != 2:
                raise CliError(f"--set {item!r}: a limit is set as limits.NAME=VALUE "
                               "(limits.tokens, limits.steps, limits.timeout)")
            limits[path[1]] = value
        else:
            config.append((path, value))
    return config, limits


def _no_constants(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity are not JSON: keep them as text


def parse_value(raw: str) -> Any:
    """``raw`` read as JSON (``0.9``, ``true``, ``null``, ``"x"``), else the text itself."""
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except ValueError:
        return raw


def config_overrides(base: dict[str, Any], sets: list[ConfigSet]) -> dict[str, Any]:
    """The top-level ``config`` overrides for ``sets``; a nested key keeps its siblings."""
    import copy

    out: dict[str, Any] = {}
    for path, value in sets:
        top = path[0]
        if len(path) == 1:
            out[top] = value
            continue
        if top not in out:
            out[top] = copy.deepcopy(base.get(top, {}))
        _set_nested(out, path, value)
    return out


def _set_nested(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = config
    for depth, key in enumerate(path[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            where = ".".join(path[:depth + 1])
            raise CliError(f"--set {'.'.join(path)}: config.{where} is {child!r}, not a "
                           f"mapping, so it has no key {path[depth + 1]!r}")
        node = child
    node[path[-1]] = value


# -- live progress and the summary -----------------------------------------------------------

_STATUS_STYLE = {
    "running": "cyan", "completed": "green", "failed": "bold red", "retrying": "yellow",
    "waiting": "magenta", "taken": "cyan", "skipped": "dim", "not run": "dim",
    "COMPLETED": "bold green", "FAILED": "bold red", "CANCELLED": "bold red",
    "WAITING_APPROVAL": "bold magenta", "REJECTED": "bold yellow",
    "approved": "green", "rejected": "yellow", "modified": "cyan", "timed_out": "yellow",
    "PENDING": "dim", "RUNNING": "cyan", "RETRYING": "yellow",
}


@dataclass(slots=True)
class NodeStats:
    visits: set[int] = field(default_factory=set)
    duration_ms: float = 0.0
    tokens: int = 0
    status: str = "not run"


class Progress:
    """The run's listener: prints the run id, a line per node event and per guarded edge
    decision (stderr), and collects what the summary table shows."""

    def __init__(self, run_id: str, *, live: bool) -> None:
        self.run_id = run_id
        self.live = live
        self.started = False
        self.t0 = time.perf_counter()
        self.stats: dict[str, NodeStats] = {}
        self.width = 0
        self._console: Console | None = None

    def __call__(self, rec: Record, view: RunView) -> None:
        match rec["type"]:
            case "run.started":
                self._on_started(view.plan.spec)
            case "run.resumed":
                by = f" by {rec['by']}" if rec.get("by") else ""
                self._on_started(view.plan.spec, f"resumed{by}")
            case "run.forked":
                self._on_started(view.plan.spec, f"forked from {rec['parent_run']} at "
                                                 f"record {rec['parent_seq']}")
            case "node.started" | "node.completed" | "node.failed" | "node.retrying":
                self._on_node(rec)
            case "edge.taken" | "edge.skipped":
                self._on_edge(rec, view.plan.spec.edges[rec["edge"]])
            case "approval.requested":
                self._on_waiting(rec)
            case "approval.decided":
                self._on_decided(rec)

    def replay(self, records: list[Record]) -> None:
        """Count the node records of a run's earlier executions (printing nothing), so
        that the summary of a resumed or forked run covers the whole run."""
        live, self.live = self.live, False
        try:
            for rec in records:
                if rec["type"] in ("node.started", "node.completed", "node.failed",
                                   "node.retrying"):
                    self._on_node(rec)
                elif rec["type"] == "approval.requested":
                    self._on_waiting(rec)
        finally:
            self.live = live

    def _on_started(self, spec: WorkflowSpec, how: str = "") -> None:
        self.started = True
        self.t0 = time.perf_counter()
        self.stats = {name: self.stats.get(name, NodeStats()) for name in spec.nodes}
        self.width = max((len(n) for n in spec.nodes), default=0)
        verb = f"started ({how})" if how.startswith("forked") else how or "started"
        click.echo(f"run {self.run_id} {verb}: workflow {spec.workflow}", err=True)

    def _on_decided(self, rec: Record) -> None:
        node, decision = rec["node"], rec["decision"]
        self.stats.setdefault(node, NodeStats()).status = decision
        self._line(node, decision, _decision_detail(rec))

    def _on_node(self, rec: Record) -> None:
        node = rec["node"]
        st = self.stats.setdefault(node, NodeStats())
        st.status = rec["type"].removeprefix("node.")
        if st.status == "started":
            st.status = "running"
            st.visits.add(rec["visit"])
        st.duration_ms += rec.get("duration_ms") or 0.0
        st.tokens += rec.get("tokens") or 0
        self._line(node, st.status, _node_detail(rec))

    def _on_waiting(self, rec: Record) -> None:
        node = rec["node"]
        self.stats.setdefault(node, NodeStats()).status = "waiting"
        self._line(node, "waiting", "for approval: " + _short(_json(rec.get("show")), 100))

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
        self._emit(self._text("  " + "  ".join(parts), "taken" if taken else "skipped"))

    def _line(self, node: str, status: str, detail: str) -> None:
        from rich.text import Text

        line = Text("  ")
        line.append(node.ljust(self.width), style="bold")
        line.append("  ")
        line.append(status, style=_STATUS_STYLE.get(status, ""))
        if detail:
            line.append(" " * (11 - len(status)) + detail)
        self._emit(line)

    def _text(self, text: str, status: str) -> Text:
        from rich.text import Text

        return Text(text, style=_STATUS_STYLE.get(status, ""))

    def _emit(self, line: Text) -> None:
        if not self.live:
            return
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        self._console.print(line)

    def print_summary(self, result: RunResult) -> None:
        """The table of nodes and the final status, on stdout."""
        from rich.console import Console
        from rich.text import Text

        out = Console(highlight=False)
        out.print(self._table())
        elapsed = (time.perf_counter() - self.t0) * 1000
        head = Text()
        head.append(result.status, style=_STATUS_STYLE.get(result.status, ""))
        head.append(f"  run {result.run_id}, {_plural(result.steps, 'step')}, "
                    f"{_plural(result.tokens, 'token')}, {_duration(elapsed)}")
        out.print(head, soft_wrap=True)
        for line in _outcome_lines(result):
            out.print(line, soft_wrap=True, markup=False)

    def _table(self) -> Table:
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
        table.add_column("node")
        for name in ("visits", "duration", "tokens"):
            table.add_column(name, justify="right")
        table.add_column("status")
        for node, st in self.stats.items():
            table.add_row(node, str(len(st.visits)), _duration(st.duration_ms) if st.visits
                          else "-", str(st.tokens), self._text(st.status, st.status))
        return table


def _sources(edge: EdgeSpec) -> str:
    return edge.source[0] if len(edge.source) == 1 else "[" + ", ".join(edge.source) + "]"


def _node_detail(rec: Record) -> str:
    parts = []
    if rec["type"] == "node.started" and rec.get("attempt", 1) > 1:
        parts.append(f"attempt {rec['attempt']}")
    if rec.get("duration_ms") is not None:
        parts.append(_duration(rec["duration_ms"]))
    if rec.get("tokens"):
        parts.append(_plural(rec["tokens"], "token"))
    error = rec.get("error")
    if error:
        parts.append(_short(str(error.get("message", "")).splitlines()[0], 200))
    if rec["type"] == "node.retrying" and rec.get("delay_ms") is not None:
        parts.append(f"retry in {_duration(rec['delay_ms'])}")
    return "  ".join(parts)


def _outcome_lines(result: RunResult) -> list[str]:
    lines = []
    if result.error:
        node = result.error.get("node")
        where = f" at node {node!r}" if node else ""
        lines.append(f"error ({result.error.get('type')}){where}: {result.error.get('message')}")
    if result.waiting:
        w = result.waiting
        lines.append(f"waiting for a decision at {w.get('node')!r}; shows {_json(w.get('show'))}")
        flags = {"approve": "--approve", "reject": "--reject",
                 "modify": "--modify PATCH_JSON [--at NODE]"}
        choices = " | ".join(flags[d] for d in w.get("decisions", []) if d in flags)
        lines.append(f"decide with: interlock resume {result.run_id} {choices}  "
                     "[--by NAME] [--comment TEXT]")
    return lines


def _decision_detail(rec: Record) -> str:
    """'by alice: looks fine; patch {...}; re-enter at a' for an approval.decided record."""
    text = f"by {rec['by']}" if rec.get("by") else "by an anonymous decider"
    if rec.get("comment"):
        text += f": {_short(str(rec['comment']), 100)}"
    if rec.get("patch"):
        text += f"; patch {_short(_json(rec['patch']), 100)}"
    if rec.get("reenter"):
        text += f"; re-enter at {rec['reenter']}"
    if rec.get("timed_out"):
        text += " (deadline passed)"
    return text


def _duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.1f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{int(minutes)}m {seconds:04.1f}s"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _reads(reads: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={_json(v)}" for k, v in reads.items()) + ")"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- validate --------------------------------------------------------------------------------


@cli.command(short_help="Check a workflow without running it.")
@click.argument("workflow", metavar="WORKFLOW")
def validate(workflow: str) -> None:
    """Check WORKFLOW without running it: print every problem as file:line:col.

    Exits 2 when there is any error, 0 otherwise (warnings alone do not fail).
    """
    from ._errors import WorkflowError
    from ._workflow import load

    try:
        wf = load(workflow)
    except WorkflowError as exc:
        _report_invalid(workflow, exc.diagnostics)
    spec = wf.spec
    click.echo(f"ok: {workflow} ({_plural(len(spec.nodes), 'node')}, "
               f"{_plural(len(spec.edges), 'edge')})")
    echo_diagnostics(wf.warnings, err=False)


def _report_invalid(workflow: str, diagnostics: list[Diagnostic]) -> NoReturn:
    echo_diagnostics(diagnostics, err=False)
    errors = sum(1 for d in diagnostics if d.severity == "error")
    warnings = len(diagnostics) - errors
    click.echo(f"invalid: {workflow} ({_plural(errors, 'error')}, "
               f"{_plural(warnings, 'warning')})")
    raise SystemExit(EXIT_USAGE)


# -- graph -----------------------------------------------------------------------------------


@cli.command(short_help="Print a workflow's graph (Mermaid or DOT).")
@click.argument("workflow", metavar="WORKFLOW")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid",
              show_default=True, help="Mermaid flowchart or Graphviz DOT.")
def graph(workflow: str, fmt: str) -> None:
    """Print WORKFLOW's graph: nodes, joins, and the condition on every edge.

    Only the file is read (node modules are not imported), so a workflow can be
    drawn while it is still being written; `interlock validate` checks it.
    """
    from ._errors import WorkflowError
    from ._render import to_dot, to_mermaid
    from ._spec import load_spec

    try:
        spec = load_spec(workflow)
    except WorkflowError as exc:
        echo_diagnostics(exc.diagnostics, err=True)
        raise SystemExit(EXIT_USAGE) from None
    click.echo(to_mermaid(spec) if fmt == "mermaid" else to_dot(spec), nl=False)


# -- resume ----------------------------------------------------------------------------------


@cli.command(short_help="Continue a run, or decide a waiting one.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--approve", "kind", flag_value="approve", help="Approve the waiting gate.")
@click.option("--reject", "kind", flag_value="reject", help="Reject the waiting gate.")
@click.option("--modify", "patch_json", metavar="PATCH_JSON",
              help='Correct state fields (a JSON object, e.g. \'{"severity": "low"}\') and '
                   "re-run from a node of the gate's approval.on_modify list.")
@click.option("--at", "at_node", metavar="NODE",
              help="With --modify: the node to re-enter at (default: the first of "
                   "approval.on_modify).")
@click.option("--by", metavar="NAME",
              help="Who decides; recorded in the log and checked against the gate's "
                   "approvers:. Not taken from $USER: without it the decision is anonymous.")
@click.option("--comment", metavar="TEXT", help="A note recorded with the decision.")
@set_option
@click.option("--force", is_flag=True,
              help="Take the run over even though another process holds its lease. Only "
                   "when that process is really gone (e.g. on another machine that died): "
                   "two processes executing one run would both run its nodes.")
@json_option
@store_option
def resume(run_id: str, kind: str | None, patch_json: str | None, at_node: str | None,
           by: str | None, comment: str | None, sets: tuple[str, ...], force: bool,
           as_json: bool, store_url: str | None) -> None:
    """Continue RUN_ID from its log, or decide the approval it is waiting for.

    A crashed or failed run continues where it stopped: nodes that completed are
    not run again, the interrupted (or failed) ones are. A run waiting for
    approval needs exactly one of --approve, --reject or --modify. The run
    executes the workflow definition it started with, not the file as it is now.

    Exits like `run`: 0 completed, 1 failed, 2 refused (the reason is printed),
    3 waiting again, 4 rejected.
    """
    decision = _decision(kind, patch_json, at_node, by, comment)
    config_sets, limits = parse_sets(sets)
    config = config_overrides({}, config_sets) if config_sets else {}
    if any(len(path) > 1 for path, _ in config_sets):
        config = _resume_config(run_id, store_url, config_sets)
    progress = Progress(run_id, live=not as_json)

    async def go(st: Store) -> RunResult:
        from ._runs import resume as resume_run
        from ._runs import trace

        progress.replay(await trace(run_id, store=st))
        return await resume_run(run_id, decision, store=st, config=config or None,
                                limits=limits or None, force=force, listener=progress)

    result = call_engine(with_store(store_url, go), progress)
    _finish(result, progress, as_json)


def _decision(kind: str | None, patch_json: str | None, at_node: str | None,
              by: str | None, comment: str | None) -> Any:
    """The `Decision` the options ask for, or None to just continue the run."""
    from ._approvals import approve, modify, reject
    from ._errors import UsageError

    if kind is not None and patch_json is not None:
        raise CliError(f"use one of --approve, --reject or --modify, not --{kind} and --modify")
    if at_node is not None and patch_json is None:
        raise CliError("--at NODE goes with --modify: it names where the corrected run "
                       "re-enters the graph")
    if patch_json is not None:
        patch = _parse_object(patch_json, "--modify", "state fields to replace")
        try:
            return modify(patch, at_node, by=by, comment=comment)
        except UsageError as exc:
            raise CliError(f"--modify: {exc}") from None
    if kind is None:
        if by is not None or comment is not None:
            raise CliError("--by and --comment go with a decision (--approve, --reject or "
                           "--modify)")
        return None
    return (approve if kind == "approve" else reject)(by, comment)


def _resume_config(run_id: str, store_url: str | None,
                   config_sets: list[ConfigSet]) -> dict[str, Any]:
    """Config overrides for a resume: a nested ``--set a.b=V`` keeps the siblings of the
    config the run has now (its file's config with the overrides it was given)."""

    async def current(st: Store) -> dict[str, Any]:
        from ._runs import load_run

        return dict((await load_run(st, run_id)).view.config)

    return config_overrides(call_engine(with_store(store_url, current)), config_sets)


def _finish(result: RunResult, progress: Progress, as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        progress.print_summary(result)
    sys.exit(exit_code_for(result.status))


def _parse_object(text: str, where: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                       f"{exc.colno}; expected an object of {what}, such as "
                       "'{\"field\": 1}'") from None
    if not isinstance(value, dict):
        raise CliError(f"{where} must be a JSON object of {what} (such as '{{\"field\": 1}}'), "
                       f"got {_json_type(value)}")
    return value


# -- status ----------------------------------------------------------------------------------


@cli.command(short_help="Show where a run stands.")
@click.argument("run_id", metavar="RUN_ID")
@json_option
@store_option
def status(run_id: str, as_json: bool, store_url: str | None) -> None:
    """Show RUN_ID's status, counts and error; for a run waiting for approval, the gate,
    what it shows and how to decide.

    Exits like `run`: 0 completed, 1 failed (or not finished), 3 waiting, 4 rejected.
    """
    from ._runs import status as run_status

    async def go(st: Store) -> tuple[RunResult, RunRow]:
        return await run_status(run_id, store=st), await st.get_run(run_id)

    result, row = call_engine(with_store(store_url, go))
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        _print_status(result, row, store_url)
    sys.exit(exit_code_for(result.status))


def _print_status(result: RunResult, row: RunRow, store_url: str | None) -> None:
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
        where = f" at node {e.get('node')!r}" if e.get("node") else ""
        lines.append(f"error ({e.get('type')}){where}: {e.get('message')}")
    store = f" --store {store_url}" if store_url else ""
    if result.waiting:
        lines += _waiting_lines(result.run_id, result.waiting, store)
    elif result.status in ("RUNNING", "RETRYING", "PENDING"):
        if row.owner and row.lease_until and row.lease_until > time.time():
            lines.append(f"being executed by {row.owner}")
        else:
            lines.append(f"interrupted: no process is executing it; continue with "
                         f"`interlock resume {result.run_id}{store}`")
    elif result.status == "FAILED":
        lines.append(f"run the failed node again with `interlock resume {result.run_id}{store}`")
    for line in lines:
        out.print(line, markup=False)


def _waiting_lines(run_id: str, w: dict[str, Any], store: str) -> list[str]:
    gate = w.get("node")
    since = ""
    if w.get("requested_at"):
        since = f" for {_age(time.time() - w['requested_at'])}"
    lines = [f"waiting for a decision at {gate!r}{since}"]
    if w.get("deadline"):
        left = w["deadline"] - time.time()
        due = f"in {_age(left)}" if left > 0 else f"passed {_age(-left)} ago"
        lines.append(f"deadline: {_when(w['deadline'])} ({due})")
    show = w.get("show") or {}
    if show:
        lines.append("shows:")
        lines += [f"  {field_} = {_json(value)}" for field_, value in show.items()]
    decisions = list(w.get("decisions") or [])
    lines.append(f"decisions: {', '.join(decisions)}")
    lines.append("decide with:")
    flags = {"approve": "--approve", "reject": "--reject",
             "modify": "--modify '{\"field\": value}' [--at NODE]"}
    for d in decisions:
        if d in flags:
            lines.append(f"  interlock resume {run_id} {flags[d]} --by NAME "
                         f"[--comment TEXT]{store}")
    return lines


# -- runs ------------------------------------------------------------------------------------

STATUSES = ["PENDING", "RUNNING", "RETRYING", "WAITING_APPROVAL", "COMPLETED", "FAILED",
            "REJECTED", "CANCELLED"]


@cli.command(short_help="List runs, newest first.")
@click.option("--status", "status_", type=click.Choice(STATUSES, case_sensitive=False),
              help="Only runs in this status.")
@click.option("--workflow", metavar="NAME", help="Only runs of this workflow.")
@click.option("--waiting", is_flag=True,
              help="Only runs waiting for approval, with the gate, how long it has waited "
                   "and its deadline.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="At most this many runs.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the runs as one JSON list of objects on stdout.")
@store_option
def runs(status_: str | None, workflow: str | None, waiting: bool, limit: int, as_json: bool,
         store_url: str | None) -> None:
    """List the runs in the store, newest first."""
    from ._runs import list_runs

    if status_ is not None:
        status_ = status_.upper()
    if waiting:
        if status_ not in (None, "WAITING_APPROVAL"):
            raise CliError(f"--waiting lists WAITING_APPROVAL runs; it cannot be combined "
                           f"with --status {status_}")
        status_ = "WAITING_APPROVAL"
    rows = call_engine(list_runs(store=store_url, status=status_, workflow=workflow,
                                 limit=limit))
    if as_json:
        click.echo(json.dumps([_run_json(r) for r in rows], ensure_ascii=False))
        return
    if not rows:
        click.echo("no runs waiting for approval" if waiting else "no runs")
    elif waiting:
        _print_waiting(rows)
    else:
        _print_runs(rows)
    if len(rows) == limit:
        click.echo(f"(the newest {limit}; see more with --limit)", err=True)


def _run_json(row: RunRow) -> dict[str, Any]:
    s = row.summary
    return {"run_id": row.run_id, "workflow": row.workflow, "status": s.status,
            "steps": s.steps, "tokens": s.tokens, "created_at": row.created_at,
            "updated_at": s.updated_at, "parent_run": row.parent_run,
            "parent_seq": row.parent_seq, "error": s.error, "waiting": s.waiting}


def _print_runs(rows: list[RunRow]) -> None:
    header = ["run id", "workflow", "status", "steps", "tokens", "created", "updated", "parent"]
    body = [[r.run_id, r.workflow, r.summary.status, str(r.summary.steps),
             str(r.summary.tokens), _when(r.created_at), _ago(r.summary.updated_at),
             f"{r.parent_run}@{r.parent_seq}" if r.parent_run else "-"] for r in rows]
    _print_columns(header, body, right={3, 4}, status_col=2)


def _print_waiting(rows: list[RunRow]) -> None:
    header = ["run id", "workflow", "gate", "waiting", "deadline", "shows"]
    now = time.time()
    body = []
    for r in rows:
        w = r.summary.waiting or {}
        requested = w.get("requested_at")
        deadline = w.get("deadline")
        if deadline is None:
            due = "-"
        elif deadline > now:
            due = f"{_when(deadline)} (in {_age(deadline - now)})"
        else:
            due = f"{_when(deadline)} (passed)"
        body.append([r.run_id, r.workflow, str(w.get("node", "?")),
                     _age(now - requested) if requested else "?", due,
                     _short(_json(w.get("show") or {}), 60)])
    _print_columns(header, body, right={3})
    click.echo("decide with: interlock resume RUN_ID --approve | --reject | --modify "
               "PATCH_JSON --by NAME", err=True)


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


def _when(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _ago(ts: float) -> str:
    return f"{_age(time.time() - ts)} ago"


def _age(seconds: float) -> str:
    """'45s', '3m 10s', '2h 05m', '3d 4h'."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


# -- trace -----------------------------------------------------------------------------------


@cli.command(short_help="Show a run's log as a timeline.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--json", "as_json", is_flag=True,
              help="Print the log records as one JSON list on stdout.")
@store_option
def trace(run_id: str, as_json: bool, store_url: str | None) -> None:
    """Print RUN_ID's log, one line per record: when, what, which node, how long, how
    many tokens, and for every edge decision the expression, its value and the values
    it read -- why the run went where it went."""
    from ._runs import trace as run_trace

    async def go(st: Store) -> tuple[list[Record], WorkflowSpec | None]:
        records = await run_trace(run_id, store=st)
        return records, _stored_spec(await st.get_run(run_id))

    records, spec = call_engine(with_store(store_url, go))
    if as_json:
        click.echo(json.dumps(records, ensure_ascii=False, default=str))
        return
    _print_trace(records, spec)


def _stored_spec(row: RunRow) -> WorkflowSpec | None:
    """The definition the run executes (to name its edges), if it still parses."""
    from ._errors import InterlockError
    from ._spec import parse

    try:
        return parse(row.definition)
    except (InterlockError, ValueError):
        return None


def _print_trace(records: list[Record], spec: WorkflowSpec | None) -> None:
    from rich.console import Console
    from rich.text import Text

    out = Console(highlight=False, soft_wrap=True)
    t0 = records[0]["at"] if records else 0.0
    seq_w = len(str(records[-1]["seq"])) if records else 1
    type_w = max((len(r["type"]) for r in records), default=0)
    node_w = max((len(r.get("node") or "") for r in records), default=0)
    for rec in records:
        rtype = rec["type"]
        line = Text(f"{rec['seq']:>{seq_w}}  {'+' + _duration((rec['at'] - t0) * 1000):>11}  ")
        line.append(rtype.ljust(type_w), style=_record_style(rec))
        if node_w:
            line.append("  ")
            line.append((rec.get("node") or "").ljust(node_w), style="bold")
        detail = _record_detail(rec, spec)
        if detail:
            line.append("  " + detail)
        line.rstrip()
        out.print(line)


def _record_style(rec: Record) -> str:
    rtype: str = rec["type"]
    if rtype in ("edge.taken", "edge.skipped"):
        return _STATUS_STYLE["taken" if rtype == "edge.taken" else "skipped"]
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
        parts = [f"visit {rec['visit']}" if (rec.get("visit") or 1) > 1 else "",
                 f"attempt {rec['attempt']}" if rec.get("attempt") is not None else "",
                 _node_detail(rec)]
        if rtype == "node.completed" and rec.get("update"):
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


def _requested_detail(rec: Record) -> str:
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


_RECORD_DETAIL: dict[str, Callable[[Record], str]] = {
    "approval.requested": _requested_detail,
    "approval.decided": lambda rec: f"{rec.get('decision')} {_decision_detail(rec)}",
    "run.started": _started_detail,
    "run.resumed": _continued_detail,
    "run.forked": _continued_detail,
    "state.patched": lambda rec: "patch " + _short(_json(rec.get("patch")), 100),
    "effect.recorded": lambda rec: f"effect {rec.get('key')!r}",
    "run.waiting": lambda rec: f"for a decision at {(rec.get('waiting') or {}).get('node')!r}",
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
    return "  ".join(parts)


# -- verify ----------------------------------------------------------------------------------


@cli.command(short_help="Check a run's log has not been tampered with.")
@click.argument("run_id", metavar="RUN_ID")
@store_option
def verify(run_id: str, store_url: str | None) -> None:
    """Check RUN_ID's hash chain, its stored definition, and that every record follows
    from the ones before it. Exits 0 when intact, 1 naming the first bad record."""
    from ._runs import verify as run_verify

    v = call_engine(run_verify(run_id, store=store_url))
    if v.ok:
        click.echo(f"ok: {run_id} ({_plural(v.records, 'record')}, chain and fold verified)")
        return
    click.echo(f"broken: {run_id} at record {v.seq} of {v.records}: {v.message}")
    sys.exit(EXIT_FAILED)


# -- cancel ----------------------------------------------------------------------------------


@cli.command(short_help="Cancel a running or waiting run.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--by", "by", metavar="NAME", help="Who cancels (recorded in the log).")
@click.option("--wait", "wait", type=click.FloatRange(min=0), default=10.0, show_default=True,
              metavar="SECONDS",
              help="How long to wait for the process executing the run to stop it.")
@store_option
def cancel(run_id: str, by: str | None, wait: float, store_url: str | None) -> None:
    """Cancel RUN_ID. A run waiting for a human, failed, or whose process died is
    cancelled at once; a run being executed by another process is asked to stop (its
    nodes in flight are cancelled, isolated processes killed). Exits 0 once the run is
    CANCELLED, 1 if the executing process did not stop it within --wait seconds."""
    from ._runs import cancel as run_cancel

    result = call_engine(run_cancel(run_id, by=by, store=store_url, wait=wait))
    if result.status == "CANCELLED":
        click.echo(f"cancelled: {run_id}" + (f" by {by}" if by else ""))
        return
    click.echo(f"not yet cancelled: {run_id} is {result.status}; the process executing it "
               "has been asked to stop (check with `interlock status`)")
    sys.exit(EXIT_FAILED)


# -- fork ------------------------------------------------------------------------------------


@cli.command(short_help="Start a new run from a point in an old one.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--at", "at_seq", type=click.IntRange(min=1), required=True, metavar="SEQ",
              help="The record to fork at (see `interlock trace`): the new run starts from "
                   "the state after it.")
@set_option
@click.option("--patch", "patch_json", metavar="JSON",
              help='Replace state fields in the new run, e.g. \'{"severity": "low"}\'.')
@click.option("--run-id", "new_run_id", metavar="ID",
              help="The new run's id instead of a generated one.")
@json_option
@store_option
def fork(run_id: str, at_seq: int, sets: tuple[str, ...], patch_json: str | None,
         new_run_id: str | None, as_json: bool, store_url: str | None) -> None:
    """Start a new run from RUN_ID's state at record SEQ, with changed config (--set)
    or state (--patch), and drive it like `run`. RUN_ID itself is not touched.

    Exits like `run`: 0 completed, 1 failed, 2 invalid usage, 3 waiting, 4 rejected.
    """
    patch = _parse_object(patch_json, "--patch", "state fields") if patch_json else None
    config_sets, limits = parse_sets(sets)
    if limits:
        raise CliError("a fork keeps the limits of the run it forks; --set limits.X is "
                       "for `run` and `resume`")
    config = config_overrides({}, config_sets) if config_sets else {}
    if any(len(path) > 1 for path, _ in config_sets):
        config = _resume_config(run_id, store_url, config_sets)
    from ._runs import make_run_id

    rid = new_run_id or make_run_id()
    progress = Progress(rid, live=not as_json)

    async def go(st: Store) -> RunResult:
        from ._runs import fork as fork_run
        from ._runs import trace

        progress.replay([r for r in await trace(run_id, store=st) if r["seq"] <= at_seq])
        return await fork_run(run_id, at_seq, store=st, config=config or None, patch=patch,
                              new_run_id=rid, listener=progress)

    result = call_engine(with_store(store_url, go), progress)
    _finish(result, progress, as_json)
