"""The public surface changes only on purpose."""

from __future__ import annotations

import subprocess
import sys

import interlock

PUBLIC = {
    "END", "START", "Context", "Decision", "Diagnostic", "ExpressionError", "Goto",
    "InterlockError", "Location", "NoRouteError", "NodeError", "RouteError", "RunError",
    "RunResult", "UsageError", "Verification", "Workflow", "WorkflowError", "WorkflowSpec",
    "WriteConflictError", "__version__", "approve", "cancel", "fork", "goto", "list_runs", "load",
    "modify", "reject", "resume", "status", "trace", "verify",
}


def test_public_names_are_pinned() -> None:
    assert set(interlock.__all__) == PUBLIC


def test_every_public_name_resolves() -> None:
    for name in interlock.__all__:
        assert getattr(interlock, name) is not None
    from interlock import Workflow, load

    assert Workflow is interlock.Workflow and load is interlock.load


def test_import_does_not_load_the_engine() -> None:
    code = ("import sys, interlock; "
            "print(any(m.startswith(('pydantic', 'interlock._')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
