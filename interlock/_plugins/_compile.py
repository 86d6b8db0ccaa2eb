"""From a definition to a plan, with the node kinds interlock ships.

Validation (`_validate.check`) and the plan (`_plan.build_plan`) take node kinds
as arguments; this is where the shipped ones (``agent:``) are wired in, below both
the stored-run functions (`_runs`, which rebuild a run's plan from the definition it
stored) and the façade (`Workflow`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .._definition._checking import CheckResult
from .._definition._expr import compile_expression
from .._definition._model import WorkflowSpec
from .._definition._plan import Plan, build_plan
from .._definition._validate import check
from .._errors import Diagnostic, WorkflowError
from ..agents import KIND as AGENT_KIND
from ..agents._delegates import COMPILE as TOOL_COMPILE
from ._subflow import SubflowKind

SUBFLOW_KIND = SubflowKind()
#: the node kinds beyond a plain call that a workflow may use (`interlock._definition._kinds`)
NODE_KINDS = (AGENT_KIND, SUBFLOW_KIND)


def check_spec(spec: WorkflowSpec, callables: Mapping[str, Callable[..., object]]) -> CheckResult:
    """Every static check of ``spec`` (``callables``: functions given by the builder)."""
    return check(spec, dict(callables), kinds=NODE_KINDS)


def compile_spec(spec: WorkflowSpec, callables: Mapping[str, Callable[..., object]]
                 ) -> tuple[Plan, list[Diagnostic]]:
    """Validate and compile ``spec``: its plan and its warnings. Raises WorkflowError
    listing every error."""
    result = check_spec(spec, callables)
    if result.errors:
        raise WorkflowError(result.diagnostics)
    plan = build_plan(spec, callables=result.callables, expressions=result.expressions,
                      concurrency=result.concurrency, kinds=NODE_KINDS)
    return plan, result.warnings


def reading_plan(spec: WorkflowSpec) -> Plan:
    """The graph for reading stored runs: expressions compiled, nothing imported."""
    exprs = {src: compile_expression(src) for e in spec.edges
             for src in (e.when, e.switch, e.map) if src is not None}
    return build_plan(spec, callables={}, expressions=exprs, kinds=NODE_KINDS)


# a sub-workflow's child is checked and compiled with every kind (it may nest agents and
# sub-workflows of its own)
SUBFLOW_KIND.check_child = check_spec
SUBFLOW_KIND.compile_child = compile_spec
TOOL_COMPILE[:] = [compile_spec]  # a workflow tool's child, too
