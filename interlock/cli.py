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
import sys
import time
import uuid
from collections.abc import Callable
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

F = TypeVar("F", bound=Callable[..., Any])

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
    cli.main(args=argv, prog_name="interlock")


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
    rid = run_id or uuid.uuid4().hex[:20]
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
    import asyncio

    from pydantic import ValidationError

    from ._errors import UsageError
    from ._store import StoreError

    try:
        return asyncio.run(wf.run(data, store=store_url, run_id=run_id, config=config or None,
                                  limits=limits or None, listener=progress))
    except (UsageError, StoreError) as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:  # a --set limits.X value of the wrong type or range
        raise CliError(_limit_problems(exc)) from None
    except KeyboardInterrupt:
        if progress.started:
            click.echo(f"interrupted: run {run_id} stopped; its completed nodes are kept "
                       f"in the store", err=True)
        raise SystemExit(130) from None


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
            case "node.started" | "node.completed" | "node.failed" | "node.retrying":
                self._on_node(rec)
            case "edge.taken" | "edge.skipped":
                self._on_edge(rec, view.plan.spec.edges[rec["edge"]])
            case "approval.requested":
                self._on_waiting(rec)

    def _on_started(self, spec: WorkflowSpec) -> None:
        self.started = True
        self.t0 = time.perf_counter()
        self.stats = {name: NodeStats() for name in spec.nodes}
        self.width = max((len(n) for n in spec.nodes), default=0)
        click.echo(f"run {self.run_id} started: workflow {spec.workflow}", err=True)

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
        lines.append(f"decide with: interlock resume {result.run_id} --approve | --reject | "
                     "--modify PATCH_JSON")
    return lines


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
