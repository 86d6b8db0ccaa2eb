"""interlock: graph workflows of AI agents and functions that execute exactly what they declare.

    import interlock

    wf = interlock.load("workflow.yaml")
    result = await wf.run({"error_event": {...}}, store="sqlite:///runs.db")

The public names below are loaded on first use (PEP 562), so ``import interlock``
and ``interlock --help`` stay fast; ``from interlock import X`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._approvals import Decision, approve, modify, reject
    from ._context import Context, Goto, goto
    from ._errors import (
        Diagnostic,
        ExpressionError,
        InterlockError,
        Location,
        NodeError,
        NoRouteError,
        RouteError,
        RunError,
        UsageError,
        WorkflowError,
        WriteConflictError,
    )
    from ._model import END, START, WorkflowSpec
    from ._runs import (
        RunResult,
        Verification,
        cancel,
        fork,
        list_runs,
        resume,
        status,
        trace,
        verify,
    )
    from ._workflow import Workflow, load

__version__ = "0.1.0"

_WHERE = {
    "Decision": "_approvals", "approve": "_approvals", "modify": "_approvals",
    "reject": "_approvals",
    "Context": "_context", "Goto": "_context", "goto": "_context",
    "Diagnostic": "_errors", "ExpressionError": "_errors", "InterlockError": "_errors",
    "Location": "_errors", "NodeError": "_errors", "NoRouteError": "_errors",
    "RouteError": "_errors", "RunError": "_errors", "UsageError": "_errors",
    "WorkflowError": "_errors", "WriteConflictError": "_errors",
    "END": "_model", "START": "_model", "WorkflowSpec": "_model",
    "RunResult": "_runs", "Verification": "_runs", "cancel": "_runs", "fork": "_runs",
    "list_runs": "_runs",
    "resume": "_runs", "status": "_runs", "trace": "_runs", "verify": "_runs",
    "Workflow": "_workflow", "load": "_workflow",
}

__all__ = [
    "END",
    "START",
    "Context",
    "Decision",
    "Diagnostic",
    "ExpressionError",
    "Goto",
    "InterlockError",
    "Location",
    "NoRouteError",
    "NodeError",
    "RouteError",
    "RunError",
    "RunResult",
    "UsageError",
    "Verification",
    "Workflow",
    "WorkflowError",
    "WorkflowSpec",
    "WriteConflictError",
    "__version__",
    "approve",
    "cancel",
    "fork",
    "goto",
    "list_runs",
    "load",
    "modify",
    "reject",
    "resume",
    "status",
    "trace",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'interlock' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"interlock.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
