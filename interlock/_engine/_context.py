"""The typed context a node receives as its second argument, and `goto`.

A `Context` talks to the run executing it through a `Port`: a small protocol the node
call implements (`_call.NodeCall`): charge tokens, look up and record an effect, append
a record, read a human's confirmation. It imports nothing of the scheduler. What an
attempt has spent is its `_budget.Tally`, which the budget writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from .._errors import UsageError
from .._json import JSON, JSONObject
from .._store import Claim
from ._budget import Tally
from ._records import decision_key


class ClaimGuard(Protocol):
    """The claim of the run whose nodes run in this context (`_watcher._Watcher`)."""

    @property
    def claim(self) -> Claim | None: ...

    async def confirm(self) -> None:
        """Return when the claim is still this process's (checked with the store);
        otherwise stop the node (`ClaimLost`)."""


# set by the executor in the context its nodes run in (a sub-workflow's child run sets
# its own inside); None outside a run, and in a node isolated in another process
CLAIM_GUARD: ContextVar[ClaimGuard | None] = ContextVar("interlock_claim_guard",
                                                        default=None)


class Port(Protocol):
    """What a node's `Context` needs of the run executing it."""

    @property
    def run_id(self) -> str: ...

    @property
    def config(self) -> Mapping[str, object]: ...

    def charge_tokens(self, ctx: Context, n: int) -> None:
        """Charge ``n`` tokens to ``ctx``'s visit and the run (raises over a budget)."""

    def recorded_effect(self, ctx: Context, key: str) -> tuple[bool, JSON]:
        """``(True, result)`` if the visit's effect ``key`` is in the log."""

    async def record_effect(self, ctx: Context, key: str, result: object) -> JSON:
        """Commit the effect's result (JSON data) and return it as the log holds it."""

    async def log_record(self, ctx: Context, rtype: str, fields: Mapping[str, object]) -> None:
        """Commit a record of the node's own (a type outside the engine's namespaces)."""

    async def engine_record(self, ctx: Context, rtype: str, fields: Mapping[str, object]
                            ) -> None:
        """Commit a record of the engine's own for the node (a sub-workflow node's
        ``child.started``): no type is refused; never reachable from a node's body."""

    def confirmation(self, ctx: Context, key: str) -> str | None:
        """A human's decision on the visit's confirmation ``key``, if one was made."""

    def effect_keys(self, node: str) -> Iterable[str]:
        """The keys of every effect ``node`` recorded in this run (every visit)."""

    def node_args(self, node: str) -> Mapping[str, object]:
        """The ``args:`` ``node`` declares (read-only; empty when it declares none)."""


class PauseRequested(BaseException):
    """Raised by `Context.confirm` to suspend the node until a human decides.

    A BaseException, so that a node's ``except Exception:`` cannot swallow the pause.
    """

    def __init__(self, key: str, show: Mapping[str, object],
                 edit: Mapping[str, object] | None = None, *, path: str | None = None,
                 decisions: list[str] | None = None, kind: str | None = None,
                 pending: list[JSONObject] | None = None) -> None:
        super().__init__(key)
        self.key = key
        self.show = dict(show)
        self.edit = dict(edit) if edit is not None else None  # the schema of a modify patch
        self.decisions = decisions if decisions is not None else \
            ["approve", "reject"] + (["modify"] if edit is not None else [])
        # a gate of a child run (a sub-workflow node): the path of nodes down to
        # it (``remediate/approval``), its decisions above; ``key`` is the child's run id
        self.path = path
        # and every gate the child waits at (its ``waiting.pending``), each named by its
        # path from the parent (`_subflow.child_gates`)
        self.pending = pending
        # what the gate is when not a tool's confirmation or a child's gate: "message", a
        # conversation waiting for its next message
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Goto:
    """Returned by a node whose edge is ``choose:``: go to ``node`` (with an optional update)."""

    node: str
    update: Mapping[str, object] | None = None


def goto(node: str, update: Mapping[str, object] | None = None) -> Goto:
    """Pick this node's successor among its ``choose:`` targets (``"END"`` too, when it
    is one of them: only declared targets are allowed)."""
    if not isinstance(node, str):
        raise TypeError(f"goto() takes a node name, got {type(node).__name__}")
    return Goto(node, update)


class Context:
    """What a node knows about the run it is part of.

    ``idempotency_key`` is the same for every attempt of one visit of a node --
    retries and re-runs after a crash -- and differs between visits (loop
    iterations) and between the items of a mapped node (``item_index``): use it as the
    key of an external side effect.

    ``claim`` is the claim the run is executed under -- ``claim.owner`` and
    ``claim.generation``, which grows with every claim of the run -- for an outside
    system that wants to refuse a stale executor's writes itself (keep the highest
    generation seen per run; refuse a lower one).
    """

    __slots__ = ("_port", "attempt", "config", "idempotency_key", "item_index", "node",
                 "run_id", "spent", "visit")

    def __init__(self, port: Port, node: str, visit: int, attempt: int,
                 item_index: int | None = None) -> None:
        self._port = port
        self.run_id: str = port.run_id
        self.node = node
        self.visit = visit
        self.attempt = attempt
        # a mapped node's item (map): its index in the list, from 0; None otherwise
        self.item_index = item_index
        self.config: Mapping[str, object] = port.config
        self.idempotency_key = f"{port.run_id}:{node}:{visit}" if item_index is None \
            else f"{port.run_id}:{node}:{visit}:{item_index}"
        self.spent = Tally()  # what this attempt spent: the budget's to write

    @property
    def claim(self) -> Claim | None:
        """The run's current claim (`interlock.support.Claim`: ``owner``, ``generation``);
        None where the store does not fence appends, or in a node isolated in another
        process."""
        guard = CLAIM_GUARD.get()
        return None if guard is None else guard.claim

    @property
    def tokens(self) -> int:
        """Tokens this attempt has recorded so far."""
        return self.spent.tokens

    @property
    def args(self) -> Mapping[str, object]:
        """The node's ``args:`` (read-only; empty when it declares none): one function
        can serve several nodes, each with its own parameters."""
        return self._port.node_args(self.node)

    def record_tokens(self, n: int) -> None:
        """Charge ``n`` tokens (an LLM call's usage) to this node and to the run's budget.

        Raises ``BudgetExceededError`` when this crosses ``limits.tokens`` or the node's
        ``tokens:`` (which counts every attempt of this visit); the visit then fails
        even if the node catches it. Tokens charged inside `once` are committed with
        its result, so a crash after it does not lose them; the others are committed
        when the attempt ends.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise UsageError(f"record_tokens takes a non-negative int, got {n!r}")
        self._port.charge_tokens(self, n)

    def once(self, key: str, fn: Callable[..., object], *args: Any) -> Coroutine[Any, Any, Any]:
        """Run the side effect ``fn(*args)`` once for this visit and ``key``:
        ``await ctx.once(key, fn, *args)``, in an ``async def`` node.

        The result is committed to the run's log before it is returned; when this
        visit runs again (a retry, or a resume after a crash) the recorded result
        is returned and ``fn`` is not called. The result must be JSON data.

        Before ``fn`` runs, the run's claim is checked with the store (its lease renewed
        under its claim generation). If another owner has claimed the run since (a
        takeover after this process was paused past its lease, ``--force``), ``fn`` is
        not called and the node stops as a cancellation stops it (the run moved to that
        owner).
        """
        _awaitable_here("once")  # a sync node would get a coroutine it cannot await
        return self._once(key, fn, *args)

    async def _once(self, key: str, fn: Callable[..., object], *args: Any) -> Any:
        found, value = self._port.recorded_effect(self, key)
        if found:
            return value
        guard = CLAIM_GUARD.get()
        if guard is not None:
            await guard.confirm()  # never an effect under a claim that is gone
        result = fn(*args)
        if isinstance(result, Awaitable) or asyncio.iscoroutine(result):
            result = await result
        return await self._port.record_effect(self, key, result)

    def recorded(self, key: str) -> tuple[bool, Any]:
        """``(True, result)`` when this visit's `once` of ``key`` is in the log already."""
        return self._port.recorded_effect(self, key)

    def effect_keys(self) -> list[str]:
        """The keys of every `once` this node recorded in this run (all its visits)."""
        return list(self._port.effect_keys(self.node))

    def log(self, type: str, fields: Mapping[str, object] | None = None
            ) -> Coroutine[Any, Any, None]:
        """Append a record of the node's own to the run's log (``agent.request``,
        ``tool.called``, ...), tagged with this node, visit and attempt:
        ``await ctx.log(type, fields)``, in an ``async def`` node.

        ``type`` is a dotted name outside the engine's namespaces (``run.``, ``node.``,
        ``edge.``, ``effect.``, ``approval.``, ``state.``, ``child.``, ``snapshot.``,
        ``notify.``); ``fields`` must be JSON data.
        A re-run of the visit logs again: log from inside `once` to log only once.
        """
        _awaitable_here("log")
        return self._port.log_record(self, type, fields or {})

    async def _engine_log(self, type: str, fields: Mapping[str, object]) -> None:
        """A record of the engine's own for this node (`Port.engine_record`): for the
        engine's node kinds (a sub-workflow's ``child.started``), never a node's body."""
        await self._port.engine_record(self, type, fields)

    def confirm(self, key: str, show: Mapping[str, object], *,
                edit: Mapping[str, object] | None = None, kind: str = "tool") -> str:
        """Ask a human before doing something (a guarded tool call, a destructive step).

        Returns ``"approved"`` or ``"rejected"`` once someone has decided -- or
        ``"modified"`` when ``edit`` (a JSON Schema) let them send a patch, which the
        decision is checked against before it is recorded. Until then the visit is
        suspended: the run waits (WAITING_APPROVAL, ``waiting.show`` is ``show``), the
        process may exit, and after the decision the node runs again from the top -- so
        do the work before this point through `once`, which replays it instead of
        repeating it. `decision` gives the whole decision (its comment, its patch).
        ``kind="unknown_outcome"``: the question is whether an action that started and
        left no result in the log may run again; its decision may carry the
        outcome checked by hand (``decision(key)["data"]["result"]``).
        """
        decision = self._port.confirmation(self, key)
        if decision is not None:
            return decision
        raise PauseRequested(key, show, edit, kind=kind)

    def decision(self, key: str) -> dict[str, Any] | None:
        """The human's decision on confirmation ``key`` -- ``{decision, by, comment,
        patch}`` -- once one was made (None before, and for a run decided before
        interlock recorded them)."""
        found, value = self._port.recorded_effect(self, decision_key(key))
        return value if found and isinstance(value, dict) else None

    def __repr__(self) -> str:
        return f"<Context run={self.run_id} node={self.node} visit={self.visit} " \
               f"attempt={self.attempt}>"


def _awaitable_here(method: str) -> None:
    """``ctx.<method>`` returns a coroutine: refuse it where nothing can await it -- a
    sync node's body, which runs in a worker thread with no event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise UsageError(f"ctx.{method}() is a coroutine: call it as `await ctx.{method}(...)` "
                         "from an `async def` node (a sync node runs in a worker thread "
                         "and cannot await it)") from None
