"""``interlock prune``: delete finished runs older than a cut-off, and give the space back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from ._common import CliError, call_engine, json_option, store_option
from ._format import _plural

if TYPE_CHECKING:
    from ..support import Pruned

_STATUSES = ("completed", "failed", "rejected", "cancelled")


@click.command(short_help="Delete finished runs older than a cut-off.")
@click.option("--older-than", "older_than", required=True, metavar="AGE",
              help="Runs last updated longer ago than this: 30d, 12h, 90m, 45s.")
@click.option("--status", "statuses", multiple=True,
              type=click.Choice(_STATUSES, case_sensitive=False),
              help="Only runs that ended so (repeatable; default: every finished run).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@json_option
@store_option
def prune(older_than: str, statuses: tuple[str, ...], dry_run: bool, as_json: bool,
          store_url: str | None) -> None:
    """Delete finished runs (completed, failed, rejected, cancelled) last updated more
    than AGE ago, with their records, then reclaim the space (SQLite: VACUUM).

    A run that waits for a human, is pending or running is never deleted, nor a run
    whose parent run is kept (a fork, a sub-workflow's child). Prints what it removed
    and the bytes freed."""
    from ..support import parse_duration, prune_runs

    try:
        age = parse_duration(older_than)
    except ValueError:
        raise CliError(f"--older-than {older_than!r}: expected an age such as 30d, 12h, "
                       "90m or 45s") from None
    result = call_engine(prune_runs(older_than=age, statuses=statuses or None,
                                    dry_run=dry_run, store=store_url))
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
        return
    _print(result)


def _print(result: Pruned) -> None:
    verb = "would delete" if result.dry_run else "deleted"
    for row in result.runs:
        click.echo(f"{verb} {row.run_id}  {row.workflow}  {row.summary.status.lower()}")
    what = f"{_plural(len(result.runs), 'run')} ({_plural(result.records, 'record')})"
    line = f"{verb} {what}"
    if result.freed is not None:
        line += f", freed {_bytes(result.freed)}"
        if result.bytes_after is not None:
            line += f" (the store is now {_bytes(result.bytes_after)})"
    click.echo(line)
    if result.kept_children:
        click.echo(f"kept {_plural(len(result.kept_children), 'run')} whose parent run is "
                   f"kept: {', '.join(result.kept_children)}")


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"  # pragma: no cover
