"""What every command shares: exit codes, `CliError`, the common options, loading a
workflow, calling the engine, and reading ``--input``, ``--patch`` and ``--set`` values."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from .. import Diagnostic, Store, Workflow
    from ._progress import Progress

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

EXIT_COMPLETED, EXIT_FAILED, EXIT_USAGE, EXIT_WAITING, EXIT_REJECTED = 0, 1, 2, 3, 4


_STATUS_EXIT = {
    "COMPLETED": EXIT_COMPLETED,
    "FAILED": EXIT_FAILED,
    "CANCELLED": EXIT_FAILED,
    "WAITING_APPROVAL": EXIT_WAITING,
    "WAITING_INPUT": EXIT_WAITING,  # a conversation waiting for its next message
    "REJECTED": EXIT_REJECTED,
}


def exit_code_for(status: str) -> int:
    """The exit code of ``run``/``resume``/``status`` for a run in ``status``."""
    return _STATUS_EXIT.get(status, EXIT_FAILED)


class Exit:
    """How the process ends. ``now``: without waiting for its threads -- set by a
    command after a run that left a timed-out sync node's thread running (it cannot be
    interrupted; the run has ended and said so). Read by ``interlock.cli.main``."""

    now = False


def note_abandoned_threads() -> None:
    """Set `Exit.now` if a run of this process left threads running (see `Exit`)."""
    from ..support import abandoned_threads

    if abandoned_threads():
        Exit.now = True


class CliError(click.ClickException):
    """A mistake the user can fix: printed as ``error: <message>``, exit code 2."""

    exit_code = EXIT_USAGE
    problem: dict[str, Any] | None = None  # the server's problem+json, when it answered one

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class BrokenLog(CliError):
    """The run's stored log is broken or its definition changed (`interlock.LogError`):
    printed as ``error: <message>`` (which says what to do), exit code 1, as ``verify``
    exits on a broken chain -- it is not a usage mistake (2)."""

    exit_code = EXIT_FAILED


# -- shared options ---------------------------------------------------------------------------


def store_option(fn: F) -> F:
    return click.option(
        "--store", "store_url", metavar="URL",
        help="Where runs live: sqlite:///rel.db, sqlite:////abs.db, postgresql://..., "
             "memory:// (default: $INTERLOCK_STORE, then sqlite:///./.interlock/runs.db).",
    )(fn)


def json_option(fn: F) -> F:
    return json_option_for("the run")(fn)


def json_option_for(what: str) -> Callable[[F], F]:
    """``--json``, printing ``what`` as JSON on stdout."""
    def add(fn: F) -> F:
        return click.option(
            "--json", "as_json", is_flag=True,
            help=f"Print {what} as JSON on stdout (and nothing else there).",
        )(fn)
    return add


def set_option(fn: F) -> F:
    return click.option(
        "--set", "sets", multiple=True, metavar="K=V",
        help="Override config (a.b=V sets a nested key) or a limit (limits.steps=50). "
             "V is read as JSON (0.9, true, null, \"text\"); anything else is a string.",
    )(fn)


# -- loading a workflow, calling the engine ---------------------------------------------------


def echo_diagnostics(diagnostics: list[Diagnostic], *, err: bool) -> None:
    for d in diagnostics:
        click.echo(str(d), err=err)


def load_workflow(path: str) -> Workflow:
    """Load and validate ``path``; on errors print each diagnostic to stderr and exit 2."""
    from .. import WorkflowError, load

    try:
        return load(path)
    except WorkflowError as exc:
        echo_diagnostics(exc.diagnostics, err=True)
        raise SystemExit(EXIT_USAGE) from None


def missing_keys(keys: list[Diagnostic], instead: str) -> str:
    """Why a command that executes a run here refuses to start it: each agent whose API
    key variable, or MCP server header's ``${VAR}``, is unset in this process (validate's
    ``api-key`` warnings), and ``instead``, how to have another process execute it."""
    from ..support import key_refusal

    return key_refusal(keys, f"set the variable and try again, or {instead}")


def call_engine(coro: Coroutine[Any, Any, T], progress: Progress | None = None) -> T:
    """Run ``coro`` to completion; the engine's usage errors (a refused decision, an
    unknown run, a claimed run, a bad store URL) become `CliError` (exit 2)."""
    import asyncio

    from pydantic import ValidationError

    from .. import LogError, StoreError, UsageError

    try:
        return asyncio.run(_stopped_by_sigterm(coro))
    except _Terminated:
        if progress is not None and progress.started:
            click.echo(f"terminated: run {progress.run_id} stopped; its completed nodes are "
                       f"kept in the store (continue with `{_resume(progress)}`)", err=True)
        raise SystemExit(128 + signal.SIGTERM) from None
    except LogError as exc:  # the stored log was changed: not a mistake of the caller
        raise BrokenLog(str(exc)) from None
    except StoreError as exc:  # a run stopped by its store: the command that continues it
        after = f"; continue with `{_resume(progress)}`" if progress is not None \
            and progress.started else ""
        raise CliError(f"{exc}{after}") from None
    except UsageError as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:  # a --set limits.X value of the wrong type or range
        raise CliError(_limit_problems(exc)) from None
    except KeyboardInterrupt:
        if progress is not None and progress.started:
            click.echo(f"interrupted: run {progress.run_id} stopped; its completed nodes are "
                       f"kept in the store (continue with `{_resume(progress)}`)", err=True)
        raise SystemExit(130) from None


def _resume(progress: Progress) -> str:
    """``interlock resume RUN`` with the options that reach the same store or server."""
    import shlex

    return f"interlock resume {shlex.quote(progress.run_id)}{progress.where}"


class _Terminated(Exception):
    """The process got SIGTERM (a service manager, a container runtime stopping it)."""


async def _stopped_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, stopped on SIGTERM as on Ctrl-C: the run's task is cancelled, so its
    nodes in flight are stopped and recorded as such and its lease is released -- the
    run can be resumed at once -- instead of the process dying in the middle."""
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_sigterm() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError, ValueError):
        # the loop cannot take signals (Windows, or not the main thread -- the CLI called
        # from an embedding program): SIGTERM keeps its default action there
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def with_store(store_url: str | None, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store at ``store_url`` (None: the default), call ``fn`` with it, close it."""
    from .. import open_store

    st = open_store(store_url)
    try:
        return await fn(st)
    finally:
        await st.close()


def missing_store(store_url: str | None) -> str | None:
    """Why a command that only reads has nothing to read: the SQLite store it names is
    not there (a mistyped --store, or a directory other than the project's). None when
    there is one, or the store is not a file. Nothing is created either way."""
    import os

    from ..support import default_store_url

    url = store_url or default_store_url()
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").partition("?")[0]
    if not path or os.path.exists(path):
        return None
    shown = path if path.startswith(("/", ".")) else f"./{path}"
    given = "--store" if store_url else "$INTERLOCK_STORE" if \
        os.environ.get("INTERLOCK_STORE") else None
    if given is None:  # the default, relative to the working directory
        return (f"no store at {shown} (in {os.getcwd()}): no run was stored from this "
                "directory; run the command where `interlock run` ran, or name the store "
                "with --store or $INTERLOCK_STORE")
    return (f"no store at {shown}: there is no such file, so no run is stored there; check "
            f"{given} (nothing was created)")


def need_store(store_url: str | None, *, listing: bool = False) -> str | None:
    """`missing_store` as `CliError` (exit 2) -- but for a ``listing`` of the default
    store, which a new project has not made yet, returned as a note: no runs yet."""
    import os

    why = missing_store(store_url)
    if why is not None and not (listing and not store_url
                                and not os.environ.get("INTERLOCK_STORE")):
        raise CliError(why)
    return why


def _limit_problems(exc: Any) -> str:
    problems = [f"limits.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return "invalid --set " + "; ".join(problems)


# -- --input, --patch: JSON objects -----------------------------------------------------------


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
    """``path`` ('-': stdin) as text, reading no more than INPUT_BYTES (and one byte)."""
    from ..support import limits as _limits
    from ..support import read_at_most, too_big

    limit = _limits.INPUT_BYTES
    where = "--input-file -" if path == "-" else f"--input-file {path}"
    try:
        if path == "-":
            stdin = sys.stdin
            buffer = getattr(stdin, "buffer", None)
            if buffer is None:  # a text-only stream: characters are at least a byte each
                text = stdin.read(limit.get() + 1)
                if len(text) > limit.get() or len(text.encode("utf-8")) > limit.get():
                    raise CliError(too_big(where, limit))
                return text
            raw = read_at_most(buffer, limit.get())
        else:
            with open(path, "rb") as f:
                raw = read_at_most(f, limit.get())
    except OSError as exc:
        raise CliError(f"cannot read --input-file {path}: {exc.strerror or exc}") from None
    if raw is None:
        raise CliError(too_big(where, limit))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"--input-file {path} is not UTF-8 text: {exc.reason}") from None


def _load_json(text: str, where: str, what: str) -> Any:
    """``text`` as JSON, within INPUT_BYTES and INPUT_DEPTH (else `CliError`)."""
    from ..support import limits as _limits
    from ..support import too_big, too_deep, too_deep_at

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > _limits.INPUT_BYTES.get():
        raise CliError(too_big(where, _limits.INPUT_BYTES, size))
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                       f"{exc.colno}; expected {what}, such as '{{\"field\": 1}}'") from None
    except RecursionError:  # nested deeper than the JSON reader goes
        raise CliError(too_deep(where, None)) from None
    deep = too_deep_at(value, _limits.INPUT_DEPTH.get())
    if deep is not None:
        raise CliError(too_deep(where, deep))
    return value


def _parse_input(text: str, where: str) -> dict[str, Any]:
    value = _load_json(text, where, "an object")
    if not isinstance(value, dict):
        raise CliError(f"{where} must be a JSON object of input fields (such as "
                       f"'{{\"field\": 1}}'), got {_json_type(value)}")
    return value


def _parse_object(text: str, where: str, what: str) -> dict[str, Any]:
    value = _load_json(text, where, f"an object of {what}")
    if not isinstance(value, dict):
        raise CliError(f"{where} must be a JSON object of {what} (such as '{{\"field\": 1}}'), "
                       f"got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


# -- --set K=V --------------------------------------------------------------------------------


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
        value = parse_value(raw, f"--set {key.strip()}")
        if path[0] == "limits":
            if len(path) != 2:
                raise CliError(f"--set {item!r}: a limit is set as limits.NAME=VALUE "
                               "(limits.tokens, limits.steps, limits.timeout)")
            limits[path[1]] = value
        else:
            config.append((path, value))
    return config, limits


def warn_undeclared(config_sets: list[ConfigSet], declared: Iterable[str], where: str) -> None:
    """Warn about ``--set`` keys the workflow's ``config:`` does not declare: a typo would
    otherwise add a key nothing reads. The value still applies (a node may read it)."""
    keys = set(declared)
    for path, _ in config_sets:
        if path[0] not in keys:
            listed = ", ".join(sorted(keys)) or "none"
            click.echo(f"warning: --set {'.'.join(path)}: {where} declares no config key "
                       f"{path[0]!r} (declared: {listed}); it is added to this run's config",
                       err=True)


def _no_constants(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity are not JSON: keep them as text


def parse_value(raw: str, where: str = "--set") -> Any:
    """``raw`` read as JSON (``0.9``, ``true``, ``null``, ``"x"``), else the text itself;
    within INPUT_BYTES and INPUT_DEPTH (else `CliError`)."""
    from ..support import limits as _limits
    from ..support import too_big, too_deep, too_deep_at

    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > _limits.INPUT_BYTES.get():
        raise CliError(too_big(where, _limits.INPUT_BYTES, size))
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except ValueError:
        return raw
    except RecursionError:
        raise CliError(too_deep(where, None)) from None
    deep = too_deep_at(value, _limits.INPUT_DEPTH.get())
    if deep is not None:
        raise CliError(too_deep(where, deep))
    return value


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
