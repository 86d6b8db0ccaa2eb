"""interlock: graph workflows of AI agents and functions that execute exactly what they declare.

    import interlock

    wf = interlock.load("workflow.yaml")
    result = await wf.run({"error_event": {...}}, store="sqlite:///runs.db")
"""

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
from ._runs import RunResult, Verification, fork, list_runs, resume, status, trace, verify
from ._workflow import Workflow, load

__version__ = "0.1.0"

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
