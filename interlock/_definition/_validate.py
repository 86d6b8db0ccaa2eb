"""Static checks of a workflow: everything that can be known before a run starts.

`check(spec)` returns diagnostics (errors and warnings, each with its
``file:line:col``) together with what it resolved along the way -- imported
callables and compiled expressions -- so that the plan reuses them rather
than doing the work twice.

The checks are functions of one shared `_checking.CheckContext`, a module per family:
`_checks_nodes` (call targets, node kinds, approval gates), `_checks_triggers`,
`_checks_edges` (each edge: names, conditions, routing, maps), `_checks_state` (the
fields conditions read, reserved names) and `_checks_graph` (reachability, cycles,
concurrency). This module runs them in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._checking import CheckContext, CheckResult
from ._checks_edges import (
    check_edge_names,
    check_error_edges,
    check_expressions,
    check_maps,
    check_otherwise,
)
from ._checks_graph import adjacency, check_concurrency, check_cycles, check_reachability
from ._checks_nodes import check_nodes
from ._checks_state import check_fed, check_gate_data, check_reserved
from ._checks_triggers import check_triggers
from ._kinds import NodeKind
from ._model import WorkflowSpec


def run(checker: CheckContext) -> CheckResult:
    """Every family in a fixed order; the sort by position is stable, so diagnostics at
    one position stay in the order they were found."""
    check_nodes(checker)
    check_triggers(checker)
    check_reserved(checker)
    check_expressions(checker)
    if not check_edge_names(checker):
        return checker.result  # the graph checks below need known names
    check_error_edges(checker)
    check_otherwise(checker)
    check_gate_data(checker)
    adj = adjacency(checker)
    check_maps(checker)
    check_reachability(checker, adj)
    check_cycles(checker)
    check_fed(checker)
    check_concurrency(checker, adj)
    checker.result.diagnostics.sort(
        key=lambda d: (d.location.line or 0, d.location.col or 0, d.severity))
    return checker.result


def check(spec: WorkflowSpec, provided: dict[str, Callable[..., object]] | None = None, *,
          kinds: Sequence[NodeKind] = ()) -> CheckResult:
    """Run every static check on ``spec``; ``kinds`` check the nodes they own."""
    return run(CheckContext(spec, provided or {}, kinds))
