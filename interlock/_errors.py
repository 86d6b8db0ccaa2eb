"""The error hierarchy, sorted by phase and audience.

    InterlockError
    ├── WorkflowError          the definition is wrong (bad file, bad graph): fix the workflow
    │                          carries diagnostics with file:line:col
    ├── RunError               a run went wrong at run time: a node failed, no route, a budget
    │   ├── NodeError          a node body raised, or returned something it may not
    │   ├── ExpressionError    a condition could not be evaluated
    │   ├── NoRouteError       a node had outgoing edges and none was taken
    │   ├── RouteError         a router / goto picked a target that is not declared
    │   └── WriteConflictError two concurrent nodes wrote the same field without a reducer
    ├── UsageError             the API or CLI was called wrongly (bad input JSON, unknown run)
    └── InternalError          a bug in interlock: please report it
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Location:
    """Where something is in a workflow file (1-based line and column)."""

    file: str | None
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        parts = [self.file or "<workflow>"]
        if self.line is not None:
            parts.append(str(self.line))
            parts.append(str(self.col if self.col is not None else 1))
        return ":".join(parts)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding about a workflow definition."""

    severity: Severity
    message: str
    location: Location = field(default_factory=lambda: Location(None))
    code: str = ""

    def __str__(self) -> str:
        return f"{self.location}: {self.severity}: {self.message}"


class InterlockError(Exception):
    """Base class of every error interlock raises on purpose."""


class WorkflowError(InterlockError):
    """The workflow definition is invalid. ``diagnostics`` lists every problem found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        errors = [d for d in diagnostics if d.severity == "error"]
        shown = errors or diagnostics
        lines = [str(d) for d in shown]
        super().__init__("invalid workflow:\n  " + "\n  ".join(lines))


class UsageError(InterlockError):
    """The API or the command line was used wrongly."""


class NodeTimeout(TimeoutError):
    """The engine's deadline for a node body passed (`_guards`, `_isolation`): the node
    *timed out*. A ``TimeoutError`` the body raises itself is the body's own error."""


class InternalError(InterlockError):
    """A bug in interlock itself."""

    def __init__(self, message: str) -> None:
        super().__init__(
            f"{message} -- this is a bug in interlock, please report it with the run's trace"
        )


class RunError(InterlockError):
    """Something went wrong while a run executed. Serialisable into the run's log."""

    type: str = "run_error"

    def __init__(self, message: str, *, node: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.node = node
        self.details = details

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "message": self.message, "node": self.node}
        if self.details:
            out["details"] = self.details
        return out


class NodeError(RunError):
    type = "node_error"


class ExpressionError(RunError):
    type = "expression_error"


class NoRouteError(RunError):
    type = "no_route"


class RouteError(RunError):
    type = "invalid_route"


class WriteConflictError(RunError):
    type = "write_conflict"


class StepLimitError(RunError):
    type = "step_limit"


def error_from_json(data: dict[str, Any]) -> RunError:
    """Rebuild a run error read back from a log record."""
    classes: dict[str, type[RunError]] = {
        c.type: c
        for c in (NodeError, ExpressionError, NoRouteError, RouteError, WriteConflictError,
                  StepLimitError)
    }
    cls = classes.get(str(data.get("type")), RunError)
    err = cls(str(data.get("message", "")), node=data.get("node"), **data.get("details", {}))
    err.type = str(data.get("type", cls.type))
    return err
