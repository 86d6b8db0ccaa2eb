"""``interlock worker``: execute the runnable runs of a store, any number of
processes on one store (`interlock.support.Worker`)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._common import CliError, note_abandoned_threads, store_option

if TYPE_CHECKING:
    from .. import Store


@click.command(short_help="Execute detached, decided and abandoned runs from a store.")
@store_option
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs this worker executes at a time.")
@click.option("--workflows", "workflows", multiple=True, metavar="PATH",
              help="Take only runs of these workflows: a file, or a folder of "
                   "*.yaml/*.json (repeatable), each known by its workflow: name. Without "
                   "it, any run, from the definition it stored.")
@click.option("--poll", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="Seconds between looks for work while idle (one small query each).")
@click.option("--lease", type=click.FloatRange(min=0.5), default=15.0, show_default=True,
              help="Seconds a claim lasts without a heartbeat (renewed every third of "
                   "it); a run of a worker that died is taken over after it.")
@click.option("--drain", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="On SIGTERM or Ctrl-C, seconds to let the nodes running finish before "
                   "stopping them.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="Where node bodies run: in this process, or as Ray tasks on the cluster "
                   "at RAY_ADDRESS (every call node that names no executor or isolation).")
@click.option("--strict-code", is_flag=True,
              help="Refuse (exit 2, nothing recorded) to continue a run whose nodes' code "
                   "changed since it started, instead of warning and recording "
                   "run.code_changed.")
def worker(store_url: str | None, concurrency: int, workflows: tuple[str, ...], poll: float,
           lease: float, drain: float, executor: str, strict_code: bool) -> None:
    """Claim runnable runs -- detached (`run --detach`), decided or resumed for a worker
    (`resume --detach`, `serve --workers 0`), abandoned by a process that died (its
    lease ran out), or waiting at a gate whose timeout passed -- and execute them, each
    by one worker at a time, until SIGTERM or Ctrl-C. Then claim nothing more, let the
    nodes running finish (at most --drain seconds), release the runs unfinished for the
    next worker, and exit 0.

    Logs one line per run claimed and per run finished on stderr."""
    import asyncio

    from .. import StoreError, UsageError
    from ..support import load_workflows, set_strict_code

    set_strict_code(True if strict_code else None)  # (None: as $INTERLOCK_STRICT_CODE says)
    try:
        known = load_workflows(workflows) if workflows else None
    except UsageError as exc:
        raise CliError(str(exc)) from None
    if known is not None and not known:
        raise CliError(f"--workflows {' '.join(workflows)}: no workflow files there "
                       "(*.yaml, *.yml, *.json); this worker would take no run")
    if executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            from ..support import install_hint

            raise CliError("--executor ray runs node bodies on Ray, which is not installed "
                           f"here: {install_hint('ray')}")
    _log_lines()
    try:
        asyncio.run(_work(store_url, concurrency, known, poll, lease, drain,
                          None if executor == "local" else "ray"))
    except (UsageError, StoreError) as exc:
        raise CliError(str(exc)) from None
    finally:
        note_abandoned_threads()  # a sync node stopped after --drain: exit without it


async def _work(store_url: str | None, concurrency: int, known: dict[str, Any] | None,
                poll: float, lease: float, drain: float, executor: Any) -> None:
    import asyncio

    from .. import open_store
    from ..support import Worker, redact, store_file_note, unkeyed

    st = open_store(store_url)
    try:
        await _check_store(st)
        w = Worker(st, concurrency=concurrency, workflows=known, poll=poll, lease=lease,
                   drain=drain, executor=executor)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stopper(w, sig))
        took = "any workflow" if known is None else "workflows " + ", ".join(sorted(known))
        log = logging.getLogger("interlock.worker")
        where = "; node bodies on Ray" if executor == "ray" else ""
        log.info("worker started: store %s%s, %d at a time, %s; looking for work every "
                 "%gs%s", redact(st.url), store_file_note(st.url, True), concurrency, took,
                 poll, where)
        for name, wf in sorted((known or {}).items()):  # what `run` refuses: said, as serve does
            for warning in unkeyed(wf.warnings):
                log.warning("workflow %r: %s; a run of it this worker takes fails at that "
                            "node: set the variable where the worker runs", name,
                            warning.message)
        try:
            await w.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        log.info("worker stopped: %d execution(s); no run left claimed", w.executed)
    finally:
        await st.close()


def _stopper(w: Any, sig: signal.Signals) -> Any:
    def stop() -> None:
        if not w.stopping:
            logging.getLogger("interlock.worker").info(
                "%s: claiming nothing more; the runs in hand stop after their nodes "
                "running finish (at most %gs)", sig.name, w.drain)
        w.stop()
    return stop


async def _check_store(st: Store) -> None:
    """A store the worker cannot use is an error now, not an idle loop: a SQLite file in
    a folder that does not exist (or that is not interlock's), a database it cannot
    reach."""
    from .. import StoreError

    path = getattr(st, "path", None)
    if isinstance(path, Path):
        if not path.parent.is_dir():
            raise StoreError(f"--store {st.url}: the folder {path.parent} does not exist; "
                             "give the store the runs were recorded in (`interlock run "
                             "--detach --store URL`)")
        if not path.exists():
            from ..support import store_absolute_hint

            also = store_absolute_hint(st.url)
            logging.getLogger("interlock.worker").warning(
                "%s does not exist yet: waiting for the first run recorded there%s",
                path.absolute(), also and f" ({also})")
            return
    await st.list_runs(limit=1)  # opens it: refuses a file that is not a store, a bad URL


class _Lines(logging.Handler):
    """The worker's progress on stderr, one line each (``interlock worker: ...``)."""

    def emit(self, record: logging.LogRecord) -> None:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        click.echo(f"interlock worker: {level}{self.format(record)}", err=True)


def _log_lines() -> None:
    log = logging.getLogger("interlock.worker")
    log.setLevel(logging.INFO)
    log.propagate = False  # (the CLI's own handler would print its warnings twice)
    if not any(isinstance(h, _Lines) for h in log.handlers):
        log.addHandler(_Lines())
