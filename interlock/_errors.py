"""The error hierarchy, sorted by phase and audience. Every class a user catches is
exported by ``interlock``; where a builtin fits, it is a base too.

    InterlockError
    ├── WorkflowError          the definition is wrong (bad file, bad graph): fix the workflow;
    │                          carries diagnostics with file:line:col
    ├── RunError               a run went wrong at run time; its ``type`` is the run's
    │   │                      ``error.type`` in the log and in ``--json``
    │   ├── NodeError          a node body raised, timed out, or returned what it may not
    │   │   └── ChildRunError  a sub-workflow node's child run failed, was cancelled or rejected
    │   ├── ExpressionError    a condition could not be evaluated (or would cost too much)
    │   ├── NoRouteError       a node had outgoing edges and none was taken
    │   ├── RouteError         a router / goto picked a target that is not declared
    │   ├── WriteConflictError two concurrent nodes wrote the same field without a reducer
    │   ├── StepLimitError     limits.steps was reached
    │   └── BudgetExceededError a token budget (limits.tokens, a node's tokens:) was crossed
    ├── StoreError             the store cannot be opened or used (bad URL, corrupt file)
    │   ├── RunNotFound        no such run (also a LookupError)
    │   ├── RunExists          a run with that id exists already
    │   ├── ConflictError      another writer appended to the run first (a race: read
    │   │                      the run again and retry)
    │   ├── ClaimError         another process is executing the run
    │   │   └── ClaimLost      this process's claim was taken over: it stopped executing
    │   └── LogError           the run's stored log is broken (a record changed, removed
    │                          or forged) or its definition no longer matches its hash:
    │                          nothing continues it; `interlock verify RUN_ID` says where
    ├── AgentError             an agent node failed (its subclasses: interlock.agents)
    ├── Draining               the server or worker is shutting down: try again later
    ├── UsageError             the API or CLI was called wrongly: bad input JSON, an unknown
    │                          run, a refused decision (also a ValueError)
    └── InternalError          a bug in interlock: please report it

`NodeTimeout` (a TimeoutError) is the engine's own signal that a body's deadline
passed; it never leaves the engine (the run's error is then a NodeError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Location:
    """Where something is in a workflow file (1-based line and column). ``workflow``:
    the workflow's name, shown when there is no file (one built in Python)."""

    file: str | None
    line: int | None = None
    col: int | None = None
    workflow: str | None = None

    def __str__(self) -> str:
        parts = [self.file or (f"workflow {self.workflow!r}" if self.workflow
                               else "<workflow>")]
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


class UsageError(InterlockError, ValueError):
    """The API or the command line was used wrongly."""


class StoreError(InterlockError):
    """The store cannot be opened or used (bad URL, corrupt or foreign database)."""


class RunNotFound(StoreError, LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r} in this store (list runs with `interlock runs`)")
        self.run_id = run_id


class RunExists(StoreError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"a run with id {run_id!r} already exists; choose another --run-id")
        self.run_id = run_id


class ConflictError(StoreError):
    """Another writer appended to this run first (seq already taken)."""


class LogError(StoreError):
    """The run's stored log cannot be trusted: its hash chain is broken, its end
    disagrees with the run's summary, a record does not follow from the ones before it,
    or the stored definition no longer matches the hash recorded when the run started.
    Not a mistake of the caller: the store's data was changed. Nothing continues such a
    run; ``interlock verify RUN_ID`` shows the first bad record."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class ClaimError(StoreError):
    """The run is being executed by another owner whose lease is still valid."""

    def __init__(self, run_id: str, owner: str, seconds_left: float) -> None:
        super().__init__(
            f"run {run_id!r} is being executed by {owner} (lease valid for another "
            f"{seconds_left:.1f}s); wait for it, or take it over with --force if that "
            "process is really gone"
        )
        self.owner = owner


class ClaimLost(ClaimError):
    """This process's claim on a run is no longer current: another owner claimed the run
    since (its lease ran out while this process was paused or could not renew it, or it
    was taken with ``--force``). The store refused what this process tried to write
    under the old claim, and this process stopped executing the run."""

    def __init__(self, run_id: str, owner: str | None, generation: int | None,
                 held: int | None) -> None:
        now = f"owner {owner}" if owner else "another owner (since released)"
        was = f"generation {held}" if held is not None else "an older claim"
        StoreError.__init__(
            self,
            f"run {run_id!r} moved to {now} (claim generation {generation}) while this "
            f"process held {was}; this process stopped executing it and stored nothing "
            f"more -- see `interlock status {run_id}`")
        self.run_id = run_id
        self.owner = owner or ""
        self.generation = generation
        self.held = held


class Draining(InterlockError):
    """The pool is shutting down (a server or worker stopping): no new execution
    starts; try again on its next start."""


class AgentError(InterlockError):
    """Base class of agent node failures (the subclasses are in `interlock.agents`)."""


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


class UnknownOutcome(NodeError):
    """A destructive action (a ``confirm: true`` node) was approved and started, but the
    process died before its outcome was recorded; a person said it was not done.
    Caught by ``on_error: true`` or ``on_error: [UnknownOutcome]``."""

    type = "unknown_outcome"


class ExpressionError(RunError):
    type = "expression_error"


class NoRouteError(RunError):
    type = "no_route"


class RouteError(RunError):
    type = "invalid_route"


class WriteConflictError(RunError):
    type = "write_conflict"


class ChildRunError(NodeError):
    """A sub-workflow node's child run failed, was cancelled or was rejected."""

    type = "child_failed"


class StepLimitError(RunError):
    type = "step_limit"


class BudgetExceededError(RunError):
    """A token budget was crossed. Raised into the node that crossed it, and checked again
    when the node returns (a node that swallows it still fails)."""

    type = "budget_exceeded"
