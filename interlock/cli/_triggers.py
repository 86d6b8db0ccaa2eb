"""``interlock triggers WORKFLOW``: each trigger, its next fire time and its last run."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ._common import EXIT_USAGE, CliError, call_engine, echo_diagnostics, store_option
from ._format import _when


@click.command(short_help="List a workflow's triggers: next fire time, last run.")
@click.argument("workflow", metavar="WORKFLOW")
@click.option("--json", "as_json", is_flag=True,
              help="Print the triggers as one JSON list of objects on stdout.")
@store_option
def triggers(workflow: str, as_json: bool, store_url: str | None) -> None:
    """List WORKFLOW's triggers (its `triggers:`): what each is, when it fires next (UTC)
    and the last run it started in the store. `interlock worker` and `interlock serve`
    fire them."""
    from .. import WorkflowError, list_runs
    from ..support import describe_trigger, load_spec

    try:
        spec = load_spec(workflow)
    except WorkflowError as exc:
        echo_diagnostics(exc.diagnostics, err=True)
        raise SystemExit(EXIT_USAGE) from None
    now = time.time()
    shown = []
    for i, t in enumerate(spec.triggers):
        try:
            shown.append(describe_trigger(spec.workflow, t, now))
        except ValueError as exc:  # a schedule that is not a cron line (croniter's errors)
            raise CliError(
                f"{workflow}: trigger {i + 1}: schedule {t.schedule!r} is not a cron "
                f"expression: {exc} (five fields: minute hour day month weekday, in UTC; or "
                f"six with seconds first); `interlock validate {workflow}` checks the whole "
                "file") from None
    if shown:
        rows = call_engine(list_runs(store=store_url, workflow=spec.workflow, limit=10_000))
        for d in shown:
            last = next((r for r in rows if r.run_id.startswith(d["run_prefix"])), None)
            d["last_run"] = None if last is None else {
                "run_id": last.run_id, "status": last.summary.status,
                "created_at": last.created_at}
    if as_json:
        click.echo(json.dumps(shown, ensure_ascii=False))
        return
    if not shown:
        click.echo(f"workflow {spec.workflow} has no triggers")
        return
    for d in shown:
        click.echo(_line(d))


def _line(d: dict[str, Any]) -> str:
    last = d["last_run"]
    ran = "never fired" if last is None else (
        f"last run {last['run_id']} {last['status']} ({_when(last['created_at'])})")
    inputs = f", input {json.dumps(d['input'], ensure_ascii=False)}" if d["input"] else ""
    return (f"{d['id']}  {d['kind']} {d['what']}{inputs}: next {d['next_utc']} UTC; {ran}")
