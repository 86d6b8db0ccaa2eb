"""Who calls an MCP tool (`Caller`, its roles) and where the tools' runs execute
(`Runs`: this process for ``interlock mcp``, a server's pool for ``/mcp``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mcp.server.context import ServerRequestContext

if TYPE_CHECKING:
    from interlock import Decision, Workflow

Progress = Callable[[Mapping[str, object]], Awaitable[None]]
"""Told each log record of the run a call follows (`progress_of` turns them into
notifications)."""


class Refused(Exception):
    """A call the caller may not make (its role), or a run it may not see: a tool error,
    and nothing is started or recorded."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls: recorded as a decision's ``by``. ``roles`` None: no auth, all allowed."""

    name: str
    roles: tuple[str, ...] | None = None

    def may(self, what: str) -> bool:
        if self.roles is None:
            return True
        needs = {"read": {"viewer", "operator", "approver", "admin"},
                 "operate": {"operator", "admin"}, "decide": {"approver", "admin"}}[what]
        return bool(needs & set(self.roles))

    def refuse(self, what: str, verb: str) -> None:
        if not self.may(what):
            needs = {"read": "any role", "operate": "operator or admin",
                     "decide": "approver or admin"}[what]
            raise Refused(f"{self.name} (roles: {', '.join(self.roles or ())}) may not "
                          f"{verb}: that needs the role {needs}")


class Runs(Protocol):
    """Where the tools' runs execute (this process, or a server's pool)."""

    workflows: Mapping[str, Workflow]
    public_url: str | None
    store_hint: str  # what `decide`'s CLI command adds (``--store URL``), or ""

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """Who this request is from (raises `Refused` for none)."""
        ...

    async def call(self, workflow: str, data: dict[str, Any], caller: Caller,
                   progress: Progress) -> dict[str, Any]:
        """Start a run and follow it until it stops: its run object then."""
        ...

    async def decide(self, run_id: str, decision: Decision, caller: Caller,
                     progress: Progress) -> dict[str, Any]:
        """Record a decision and follow the run until it stops again."""
        ...

    async def message(self, run_id: str, text: str, caller: Caller,
                      progress: Progress) -> dict[str, Any]:
        """Send a message to a conversation and follow its turn until it stops."""
        ...

    async def status(self, run_id: str, caller: Caller) -> dict[str, Any]:
        ...

    # a run as an MCP task: started and decided without following it

    async def start(self, workflow: str, data: dict[str, Any], caller: Caller
                    ) -> dict[str, Any]:
        """Start a run that executes on (here, or in the pool): its run object now."""
        ...

    async def decide_soon(self, run_id: str, decision: Decision, caller: Caller) -> None:
        """Record a decision (refusals raised here); the run goes on without us."""
        ...

    async def cancel(self, run_id: str, caller: Caller) -> None:
        """Cancel the run (asked through the store when it executes elsewhere)."""
        ...

    async def times(self, run_id: str) -> tuple[float, float]:
        """When the run was created, and last changed (epoch seconds)."""
        ...
