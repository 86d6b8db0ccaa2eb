"""``interlock migrate RUN_ID --to FILE``: move a stored run onto another
definition, after a static check, on the record (``run.migrated``)."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import click

from ._common import (
    EXIT_USAGE,
    CliError,
    call_engine,
    json_option,
    load_workflow,
    store_option,
)
from ._format import where_options
from ._remote import server_options


@click.command(short_help="Move a waiting, failed or pending run onto another definition.",
               options_metavar="--to FILE [OPTIONS]")
@click.argument("run_id")
@click.option("--to", "path", required=True, metavar="FILE", type=click.Path(dir_okay=False),
              help="The workflow file the run moves onto (validated as `validate` does).")
@click.option("--at", "at_node", metavar="NODE",
              help="Where the run continues in the new graph (instead of the gate it waits "
                   "at, or the node that failed): that node becomes ready.")
@click.option("--by", metavar="NAME", help="Who migrates the run (recorded).")
@click.option("--comment", metavar="TEXT", help="Why (recorded).")
@click.option("--dry-run", is_flag=True,
              help="Check and print the differences; record nothing.")
@json_option
@store_option
@server_options
def migrate(run_id: str, path: str, at_node: str | None, by: str | None, comment: str | None,
            dry_run: bool, as_json: bool, store_url: str | None, server_url: str | None,
            token: str | None) -> None:
    """Move RUN_ID onto the definition in the workflow file --to FILE names. A run keeps
    the definition it started with; this changes it on purpose: the run must be waiting
    at a gate (or for a conversation's next message), failed, or pending, and the new
    graph must be able to continue it -- the gate it waits at (or --at NODE) exists,
    every state field the rest of the new graph reads is present or declared, and the
    reducers of its fields are unchanged.

    Prints every difference between the two definitions, then records run.migrated
    (from_hash, to_hash, by, comment, at_node) and exits 0 -- without executing: a
    waiting run now waits on the new definition (decide it with `resume`), a pending
    run is continued by a worker, a failed run with `resume`. Refused: every reason is
    printed, nothing is recorded, exit 2. --dry-run records nothing.

    --to the run's own file, unchanged, after its node modules changed (a deploy of
    code only): records the new code digests, which --strict-code continuations then
    compare against.

    With --server, the server checks and records it (POST /api/runs/RUN_ID/migrate, the
    operator role; with its --auth, `by` is the token's name)."""
    from ..support import Migration, migrate_run

    workflow = load_workflow(path)
    if server_url:
        from ._remote import Remote

        remote = Remote(server_url, token, store_url)
        body = {"definition": workflow.definition(), "at": at_node, "by": by,
                "comment": comment, "dry_run": dry_run}
        try:
            found = Migration(**remote.call("POST", f"/api/runs/{run_id}/migrate", json=body))
        except CliError as exc:  # refused: its findings printed as here
            refused = (exc.problem or {}).get("migration")
            if isinstance(refused, dict):
                if as_json:
                    click.echo(json.dumps(refused, ensure_ascii=False))
                else:
                    _differences(Migration(**refused))
            raise
        finally:
            remote.close()
        _show(found, path, as_json, where_options(None, server_url, token))
        return
    try:
        found = call_engine(_refusal_kept(migrate_run(
            run_id, workflow.spec, store=store_url, at=at_node, by=by, comment=comment,
            dry_run=dry_run)))
    except _Refused as exc:
        refused = exc.refused
        if as_json:
            click.echo(json.dumps(refused.migration.to_json(), ensure_ascii=False))
        else:
            _differences(refused.migration)
        click.echo(f"error: {refused}", err=True)
        sys.exit(EXIT_USAGE)
    _show(found, path, as_json, where_options(store_url))


def _show(found: Any, path: str, as_json: bool, where: str = "") -> None:
    """A migration done (or checked, with --dry-run): its differences, then what now."""
    run_id = found.run_id
    if as_json:
        click.echo(json.dumps(found.to_json(), ensure_ascii=False))
        return
    _differences(found)
    if found.dry_run:
        click.echo(f"dry run: run {run_id} can be migrated onto {path} "
                   f"({found.to_hash[:12]}); nothing was recorded", err=True)
    else:
        rid = shlex.quote(run_id)  # (`status` names the gate and its decide command)
        then = {"WAITING_APPROVAL": f"it waits on the new definition: `interlock status "
                                    f"{rid}{where}` shows its gate and how to decide it",
                "WAITING_INPUT": f"the conversation waits for its next message on the new "
                                 f"definition: `interlock send {rid} TEXT{where}`",
                "PENDING": "a worker (`interlock worker`) continues it",
                "FAILED": f"`interlock resume {rid}{where}` continues it"}.get(found.status, "")
        onto = (f"{found.from_hash[:12]} -> {found.to_hash[:12]}"
                if found.from_hash != found.to_hash else
                f"the same definition, {found.to_hash[:12]}, on the code as it is now")
        click.echo(f"migrated: run {run_id} is on {path} ({onto}, record "
                   f"{found.recorded}); {then}", err=True)


def _differences(found: Any) -> None:
    click.echo(f"run {found.run_id} ({found.workflow}, {found.status}): "
               f"{found.from_hash[:12]} -> {found.to_hash[:12]}")
    if not found.differences:
        click.echo("  (no difference in nodes, edges or state)")
    for line in found.differences:
        click.echo(f"  {line}")


class _Refused(Exception):
    def __init__(self, refused: Any) -> None:
        super().__init__(str(refused))
        self.refused = refused


async def _refusal_kept(coro: Any) -> Any:
    """The migration, with a refusal kept whole (its differences and reasons) rather
    than turned into a one-line usage error."""
    from ..support import MigrationRefused

    try:
        return await coro
    except MigrationRefused as exc:
        raise _Refused(exc) from None
