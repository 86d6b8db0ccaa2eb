"""``interlock coverage``: which declared edges the stored runs took, and which never."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from ._common import EXIT_FAILED, CliError, call_engine, json_option_for, store_option, with_store
from ._format import _plural

if TYPE_CHECKING:
    from .. import Coverage, Store


@click.command(short_help="Which declared edges the stored runs took (and never took).")
@click.argument("workflow", metavar="[WORKFLOW]", required=False)
@click.option("--fail-under", "fail_under", type=click.FloatRange(0, 100), metavar="PCT",
              help="Exit 1 when less than PCT percent of the declared edges were ever taken.")
@json_option_for("the report (a list of them without WORKFLOW)")
@store_option
def coverage(workflow: str | None, fail_under: float | None, as_json: bool,
             store_url: str | None) -> None:
    """Across the stored runs of WORKFLOW (a workflow file, or the name of a workflow with
    runs in the store; default: every workflow with runs), every declared edge with how
    often it was taken and skipped, conditions never true or never false, switch cases
    never matched, nodes never reached and the gates' decisions: what the workflow
    declares but never executed.

    An edge is one declared (source, target) pair: each target of a fan-out, each switch
    case and the default, each target of a router or choose, a map edge once.
    """
    reports = call_engine(with_store(store_url, lambda st: _reports(workflow, st)))
    if as_json:
        data = [r.to_json() for r in reports]
        click.echo(json.dumps(data[0] if workflow is not None else data, ensure_ascii=False))
    else:
        for k, report in enumerate(reports):
            if k:
                click.echo()
            _print(report)
    if fail_under is not None and any(r.taken_share < fail_under for r in reports):
        low = [f"{r.workflow} {r.taken_share:.1f}%" for r in reports
               if r.taken_share < fail_under]
        click.echo(f"coverage under {fail_under:g}%: {', '.join(low)}", err=True)
        sys.exit(EXIT_FAILED)


async def _reports(workflow: str | None, st: Store) -> list[Coverage]:
    from .. import WorkflowError
    from .. import coverage as coverage_of
    from ..support import workflows_in

    if workflow is not None:
        try:
            return [await coverage_of(workflow, store=st)]
        except WorkflowError as exc:  # as validate says it
            raise CliError(f"{workflow}: {exc}") from None
    reports = [await coverage_of(spec, store=st) for spec in await workflows_in(st)]
    if not reports:
        from ..support import redact

        raise CliError(f"no runs in {redact(st.url)}: run a workflow first, or name the store "
                       "with --store")
    return reports


def _print(report: Coverage) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # no markup: conditions and names are the workflow's text ("[a, b]", "x[0] > 1")
    out = Console(highlight=False, soft_wrap=True, markup=False)
    taken = sum(1 for e in report.edges if e.taken)
    out.print(f"{report.workflow}: {_plural(report.runs, 'run')}"
              + (f" ({report.definitions} definitions)" if report.definitions > 1 else "")
              + f", {taken} of {_plural(len(report.edges), 'edge')} taken "
              f"({report.taken_share:.1f}%)")
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name, justify in (("edge", "left"), ("when", "left"), ("taken", "right"),
                          ("skipped", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for e in report.edges:
        style = "" if e.taken else "bold red"
        table.add_row(Text(f"{e.source} -> {e.target}"), Text(e.label), str(e.taken),
                      str(e.skipped), style=style)
    out.print(table)
    lines = []
    if report.never_reached:
        lines.append("nodes never reached: " + ", ".join(report.never_reached))
    if report.never_evaluated:
        lines.append("conditions never evaluated: " + "; ".join(report.never_evaluated))
    for value in ("true", "false"):
        never = report.never(value)
        if never:
            lines.append(f"conditions never {value}: " + "; ".join(never))
    if report.cases_unmatched:
        lines.append("switch cases never matched: " + "; ".join(report.cases_unmatched))
    for gate, decisions in report.gates.items():
        said = ", ".join(f"{d} {n}" for d, n in sorted(decisions.items())) or "never decided"
        lines.append(f"gate {gate}: {said}")
    for line in lines:
        out.print(line)
