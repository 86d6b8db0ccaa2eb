"""The ``interlock`` command line.

Every command is a small Click function that parses its options, calls the
Python API, and turns the outcome into output and an exit code. Conventions
shared by all commands (keep them when adding one):

- results go to stdout; progress, run ids, warnings and errors go to stderr;
  ``--json`` prints exactly one JSON object on stdout and nothing else there;
- exit codes: 0 completed, 1 failed or cancelled (or a run whose stored log is broken),
  2 invalid usage / invalid workflow / refused, 3 waiting for approval, 4 rejected
  (`exit_code_for`);
- a mistake the user can fix raises `CliError` (exit 2, ``error: ...``); a broken log
  (`interlock.LogError`) is `BrokenLog` (exit 1, ``error: ...`` saying what to do);
- heavy modules (the engine, Rich) are imported inside the commands, so that
  ``interlock --help`` stays fast.

The package: this module holds the command group and `main`; `_run` the commands that
execute or change a run (run, resume, fork, cancel), `_progress` their live output and
summary, `_inspect` the ones that only look (validate, graph, status, runs), `_verify`
verify and export, `_trace` trace, and a module for each other command (chat, send,
coverage, prune, serve, triggers, worker, migrate, mcp); `_common` what they share (exit
codes, `CliError`, options, --input / --set parsing), `_format` the wording of values and
records, `_remote` the client of a server (--server).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from ._chat import chat, send
from ._common import (
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_REJECTED,
    EXIT_USAGE,
    EXIT_WAITING,
    CliError,
    Exit,
    call_engine,
    config_overrides,
    exit_code_for,
    load_workflow,
    parse_sets,
    parse_value,
    read_input,
    with_store,
)
from ._coverage import coverage
from ._inspect import graph, runs, status, validate
from ._mcp import mcp
from ._migrate import migrate
from ._progress import Progress
from ._prune import prune
from ._run import cancel, fork, resume, run
from ._serve import serve
from ._trace import trace
from ._triggers import triggers
from ._verify import export, verify
from ._worker import worker

__all__ = [
    "EXIT_COMPLETED", "EXIT_FAILED", "EXIT_REJECTED", "EXIT_USAGE", "EXIT_WAITING",
    "CliError", "Progress", "call_engine", "cli", "config_overrides", "exit_code_for",
    "load_workflow", "main", "parse_sets", "parse_value", "read_input", "with_store",
]


# -- the command group -----------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="interlock", prog_name="interlock")
def cli() -> None:
    """interlock: graph workflows that execute exactly what they declare.

    Exit codes: 0 completed, 1 failed or cancelled, 2 invalid usage or workflow,
    3 waiting for approval (or a conversation's next message), 4 rejected.
    """
    log = logging.getLogger("interlock")
    if not any(isinstance(h, _Warnings) for h in log.handlers):
        log.addHandler(_Warnings(logging.WARNING))


class _Warnings(logging.Handler):
    """The library's warnings (``logging.getLogger("interlock")``) on stderr, as the
    CLI's own are: ``warning: ...``."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"{record.levelname.lower()}: {self.format(record)}", err=True)


def main(argv: list[str] | None = None) -> None:
    """The console script (``interlock``) and ``python -m interlock``."""
    sys.stdout = _PipeSafe(sys.stdout)
    sys.stderr = _PipeSafe(sys.stderr)
    try:
        cli.main(args=argv, prog_name="interlock", standalone_mode=True)
    except SystemExit as exc:
        _exit_now_if_threads_were_abandoned(exc.code)
        raise


class _PipeSafe:
    """A standard stream whose reader may go away (``interlock status RUN | head -1``):
    once a write finds the pipe closed, the stream's file is pointed at os.devnull (as
    Python's documentation of SIGPIPE advises), so that the command ends as it would
    have, with its own exit code, instead of a BrokenPipeError (Click's exit 1)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # (no file descriptor: a test's)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _exit_now_if_threads_were_abandoned(code: Any) -> None:
    """A sync node that timed out keeps its worker thread (it cannot be interrupted);
    the run has ended and said so, so the process does not wait for that thread."""
    if Exit.now:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))


for _command in (run, validate, graph, resume, status, runs, trace, verify, cancel, fork,
                 coverage, export, prune, serve, triggers, worker, migrate, send, chat,
                 mcp):
    cli.add_command(_command)
