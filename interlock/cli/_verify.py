"""``verify`` (a stored run, an exported one, or a run of a server) and ``export``."""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING

import click

from ._common import EXIT_FAILED, CliError, call_engine, need_store, store_option
from ._format import _plural, where_options
from ._remote import Remote, server_options

if TYPE_CHECKING:
    from .. import Verification


@click.command(short_help="Check a run's log has not been tampered with.")
@click.argument("run_id", metavar="[RUN_ID]", required=False)
@click.option("--file", "path", metavar="PATH", type=click.Path(dir_okay=False),
              help="Verify a run exported with `interlock export` from this file ('-' for "
                   "stdin), with no store.")
@store_option
@server_options
def verify(run_id: str | None, path: str | None, store_url: str | None,
           server_url: str | None, token: str | None) -> None:
    """Check RUN_ID's hash chain, its stored definition, that every record follows
    from the ones before it, and that the log ends where the run's summary says.
    Exits 0 when intact; 1 when broken (naming the first bad record), or when it
    could not be checked ("not verified": a keyed log without its key, another key,
    or a key set for a log that is not keyed).

    With --file, the same checks for an exported run (`interlock export RUN_ID >
    run.jsonl`) with no store: a record changed, added, removed or cut off the end
    breaks it.

    With --server, the server checks the run in its own store, with its own
    INTERLOCK_LOG_KEY (yours is not used): "ok" is the server's word. A server with a
    key checks a log that is not keyed as a plain chain: "not verified as keyed" (exit
    1) when intact. For evidence that does not rest on the server, verify an export
    with --file where the key is at hand.

    A keyed log (a run started with INTERLOCK_LOG_KEY set) is checked with the key:
    then "ok" also proves the log was written by a holder of the key."""
    from .. import verify as run_verify

    where = ""  # the options that reach the server, for a printed command
    if path is not None:
        if run_id is not None or server_url:
            raise CliError("give RUN_ID (a stored run, or with --server a server's) or "
                           "--file PATH (an exported one), not both")
        v = _verify_file(path)
        run_id = v.run_id
    elif run_id is None:
        raise CliError("missing RUN_ID: `interlock verify RUN_ID`, or `interlock verify "
                       "--file run.jsonl` for an exported run")
    elif server_url:
        remote = Remote(server_url, token, store_url)
        try:
            v = remote.verification(run_id)
        finally:
            remote.close()
        where = where_options(None, server_url, token)
        server_url = remote.url
    else:
        need_store(store_url)
        v = call_engine(run_verify(run_id, store=store_url))
    _print_verification(run_id, v, path, server_url, where)


def _print_verification(run_id: str, v: Verification, path: str | None,
                        server_url: str | None, where: str = "") -> None:
    for note in v.notes:
        click.echo(f"warning: {note}", err=True)
    by = f"; checked by the server at {server_url}" if server_url else ""
    # the client's own key plays no part in a server's check: said, lest "ok" read as
    # "your key matches"
    unused = ("your INTERLOCK_LOG_KEY was not used: the server checked with its own"
              if server_url and os.environ.get("INTERLOCK_LOG_KEY") else None)
    if v.ok:
        how = ("keyed chain (HMAC-SHA-256) and fold verified: written by a holder of "
               "INTERLOCK_LOG_KEY" if v.keyed else "chain and fold verified")
        children = (f"; child runs verified too: {', '.join(v.children)}" if v.children
                    else "")
        click.echo(f"ok: {run_id} ({_plural(v.records, 'record')}, {how}"
                   f"{_migrations(v)}{children}{by})")
        if unused:
            click.echo(unused)
        return
    which = run_id if v.run_id == run_id else f"{v.run_id} (a child run of {run_id})"
    if v.plain:  # a server's check of a log that is not keyed, with its key set
        click.echo(f"not verified as keyed: {which} ({_plural(v.records, 'record')}): "
                   f"{v.message}{by}")
        if unused:
            click.echo(unused)
        rid, out = shlex.quote(v.run_id), shlex.quote(f"{v.run_id}.jsonl")
        click.echo(f"to check it here, with no key (the log is not keyed): `interlock export "
                   f"{rid}{where} > {out} && interlock verify --file {out}`"
                   + (" with INTERLOCK_LOG_KEY unset" if unused else ""))
    elif v.seq is None:  # it could not be checked at all (a keyed log, without its key)
        click.echo(f"not verified: {which}: {v.message}")
        if server_url:
            click.echo(f"the server at {server_url} checks with its own key: "
                       "INTERLOCK_LOG_KEY where `interlock serve` runs"
                       + ("; your INTERLOCK_LOG_KEY was not used" if unused else ""))
        click.echo("its records were not checked: this says nothing of whether they were "
                   "changed")
    else:
        at = f"at record {v.seq} of {v.records}" if v.located else \
            f"({_plural(v.records, 'record')})"
        click.echo(f"broken: {which} {at}: {v.message}{by}")
        if unused:
            click.echo(unused)
        if path is not None:  # an export: the run itself may be intact in its store
            click.echo("this export is not evidence of the run: export the run again from "
                       f"its store once `interlock verify {v.run_id}` says ok there")
        else:
            click.echo("a broken log is never continued: restore the run from a backup or "
                       "an export (`interlock verify --file` checks an export first)")
    sys.exit(EXIT_FAILED)


def _migrations(v: Verification) -> str:
    """``; 2 definitions: migrated at record 8 by ops`` for a migrated run."""
    moves = list(v.migrations)
    if not moves:
        return ""
    defs = 1 + sum(1 for m in moves if m.get("from_hash") != m.get("to_hash"))
    said = [("migrated" if m.get("from_hash") != m.get("to_hash") else "moved onto new code")
            + f" at record {m.get('seq')}" + (f" by {m['by']}" if m.get("by") else "")
            for m in moves]
    return f"; {_plural(defs, 'definition')}, each segment under its own: {', '.join(said)}"


def _verify_file(path: str) -> Verification:
    from .. import UsageError
    from ..support import verify_export

    try:
        if path == "-":
            return verify_export(sys.stdin.buffer, source="stdin")
        with open(path, "rb") as f:
            return verify_export(f, source=path)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UsageError as exc:
        raise CliError(str(exc)) from None


@click.command(short_help="Write a run's log as JSON lines (for `verify --file`).")
@click.argument("run_id", metavar="RUN_ID")
@store_option
@server_options
def export(run_id: str, store_url: str | None, server_url: str | None,
           token: str | None) -> None:
    """Write RUN_ID to stdout as JSON lines: a first line with the run's definition and
    summary (its last seq and chain hash), then every record exactly as stored. An
    auditor checks it with no store: `interlock verify --file run.jsonl`.

    With --server, the server's export of a run in its store: the same lines.

    A log that does not verify is written all the same (it is what the store holds, and
    the evidence of what changed), with a warning on stderr, and the command exits 1."""
    from .. import verify as run_verify
    from ..support import export_run

    async def write() -> Verification:
        out = sys.stdout.buffer
        async for line in export_run(run_id, store=store_url):
            out.write(line)
        out.flush()
        return await run_verify(run_id, store=store_url)

    if server_url:
        remote = Remote(server_url, token, store_url)
        try:
            remote.export(run_id, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            v = remote.verification(run_id)  # (the server's word, with its key)
        finally:
            remote.close()
    else:
        need_store(store_url)
        v = call_engine(write())
    if v.ok or v.seq is None:  # intact, or a keyed log this process has no key for
        return
    which = run_id if v.run_id == run_id else f"{v.run_id} (a child run of {run_id})"
    click.echo(f"warning: the exported log of {which} does not verify at record {v.seq}: "
               f"{v.message}. `interlock verify --file` on the export shows the same",
               err=True)
    sys.exit(EXIT_FAILED)
