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
    from ._definition._model import END, START, WorkflowSpec
    from ._engine._approvals import Decision, approve, modify, reject
    from ._engine._context import Context, Goto, goto
    from ._engine._fold import RunResult
    from ._errors import (
        AgentError,
        BudgetExceededError,
        ChildRunError,
        ClaimError,
        ClaimLost,
        ConflictError,
        Diagnostic,
        Draining,
        ExpressionError,
        InterlockError,
        InternalError,
        Location,
        LogError,
        NodeError,
        NoRouteError,
        RouteError,
        RunError,
        RunExists,
        RunNotFound,
        StepLimitError,
        StoreError,
        UnknownOutcome,
        UsageError,
        WorkflowError,
        WriteConflictError,
    )
    from ._observe._coverage import Coverage, coverage
    from ._ops._cancel import cancel
    from ._ops._claims import make_run_id
    from ._ops._load import status
    from ._ops._messages import send
    from ._ops._runs import fork, list_runs, resume, trace
    from ._ops._verify import Verification, verify
    from ._store import Store, open_store
    from ._workflow import Workflow, load

__version__ = "0.1.0"

_WHERE = {
    "Decision": "_engine._approvals", "approve": "_engine._approvals",
    "modify": "_engine._approvals",
    "reject": "_engine._approvals",
    "Context": "_engine._context", "Goto": "_engine._context", "goto": "_engine._context",
    "Coverage": "_observe._coverage", "coverage": "_observe._coverage",
    **dict.fromkeys([
        "AgentError", "BudgetExceededError", "ChildRunError", "ClaimError", "ClaimLost",
        "ConflictError", "Diagnostic", "Draining", "ExpressionError", "InterlockError",
        "InternalError", "Location", "LogError", "NodeError",
        "NoRouteError", "RouteError", "RunError", "RunExists", "RunNotFound",
        "StepLimitError", "StoreError", "UnknownOutcome", "UsageError", "WorkflowError",
        "WriteConflictError",
    ], "_errors"),
    "END": "_definition._model", "START": "_definition._model",
    "WorkflowSpec": "_definition._model",
    "RunResult": "_engine._fold", "Verification": "_ops._verify", "cancel": "_ops._cancel",
    "fork": "_ops._runs",
    "list_runs": "_ops._runs", "make_run_id": "_ops._claims",
    "Store": "_store", "open_store": "_store",
    "resume": "_ops._runs", "status": "_ops._load", "trace": "_ops._runs",
    "send": "_ops._messages",
    "verify": "_ops._verify",
    "Workflow": "_workflow", "load": "_workflow",
}

__all__ = [
    "END",
    "START",
    "AgentError",
    "BudgetExceededError",
    "ChildRunError",
    "ClaimError",
    "ClaimLost",
    "ConflictError",
    "Context",
    "Coverage",
    "Decision",
    "Diagnostic",
    "Draining",
    "ExpressionError",
    "Goto",
    "InterlockError",
    "InternalError",
    "Location",
    "LogError",
    "NoRouteError",
    "NodeError",
    "RouteError",
    "RunError",
    "RunExists",
    "RunNotFound",
    "RunResult",
    "StepLimitError",
    "Store",
    "StoreError",
    "UnknownOutcome",
    "UsageError",
    "Verification",
    "Workflow",
    "WorkflowError",
    "WorkflowSpec",
    "WriteConflictError",
    "__version__",
    "approve",
    "cancel",
    "coverage",
    "fork",
    "goto",
    "list_runs",
    "load",
    "make_run_id",
    "modify",
    "open_store",
    "reject",
    "resume",
    "send",
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
