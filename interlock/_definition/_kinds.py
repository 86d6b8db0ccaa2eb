"""Node kinds beyond a plain call: the protocol a plug-in (``agents/``) implements.

Validation and the plan know function nodes and gates; any other kind of node (an
``agent:`` block today) is *injected*: `check` and `build_plan` take the kinds to
use, and the façade (`Workflow`) passes the ones interlock ships. So the core
imports no kind, and a kind is free to import the core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from .._errors import Diagnostic, Severity
from ._model import NodeSpec, WorkflowSpec


class CheckResults(Protocol):
    callables: dict[str, Callable[..., object]]
    diagnostics: list[Diagnostic]


class Checker(Protocol):
    """What validation offers a kind's check: report a finding, resolve a call path."""

    spec: WorkflowSpec

    @property
    def provided(self) -> Mapping[str, Callable[..., object]]:
        """The functions a builder gave, by call path."""

    @property
    def result(self) -> CheckResults: ...

    def add(self, severity: Severity, message: str, path: tuple[object, ...], code: str
            ) -> None: ...

    def resolve(self, path: str, where: tuple[object, ...], what: str) -> None: ...


class NodeKind(Protocol):
    """A kind of node: which nodes it owns, how to check one, how to build its body."""

    name: str

    def owns(self, node: NodeSpec) -> bool:
        """Whether ``node`` is of this kind (e.g. it has an ``agent:`` block)."""

    def check(self, checker: Checker, name: str, node: NodeSpec) -> None:
        """Report every problem of node ``name`` through ``checker``."""

    def build(self, name: str, node: NodeSpec, *, callables: Mapping[str, Callable[..., object]],
              workflow: WorkflowSpec) -> Callable[..., object]:
        """The node's body: an async ``fn(state, ctx)``. Imports nothing until it runs."""
