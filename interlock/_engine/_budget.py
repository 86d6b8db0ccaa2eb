"""Token accounting: what one attempt has spent (`Tally`) and the budgets that charge it
(`Budget`: the run's ``limits.tokens`` and a node's ``tokens:``).

A node's ``ctx.record_tokens(n)`` goes to its run's `Budget.charge` (the run's node call,
`_call.NodeCall`, hands the context that bound method as its port's ``charge_tokens``),
which adds ``n`` to the context's `Tally` and refuses the charge that crosses a limit.
The `_guards.Budgeted` guard enters and leaves each attempt here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from .._errors import BudgetExceededError, RunError

if TYPE_CHECKING:
    from .._definition._plan import Plan
    from ._fold import RunView


class Tally:
    """What one attempt has spent: written by the budget that charges it
    (`Budget.charge`), read by the context and the node call."""

    __slots__ = ("over", "steps", "tokens", "unsaved")

    def __init__(self) -> None:
        self.tokens = 0
        self.unsaved = 0  # of those, not yet in a record (an effect's, or the attempt's end)
        self.over: RunError | None = None  # set when this visit crossed a budget
        self.steps = 0  # a child run's steps, to count with the next effect

    def add(self, n: int) -> None:
        self.tokens += n
        self.unsaved += n

    def take_unsaved(self) -> int:
        """The tokens not yet in a record, now counted as recorded (an effect's)."""
        n, self.unsaved = self.unsaved, 0
        return n


class Context(Protocol):
    """What the budget reads of a node's context (`_context.Context`): the visit it
    charges and that visit's `Tally`."""

    @property
    def node(self) -> str: ...

    @property
    def visit(self) -> int: ...

    @property
    def item_index(self) -> int | None: ...

    @property
    def spent(self) -> Tally: ...


class Budget:
    """Token accounting across concurrent visits.

    The run's total is what the log has (completed and failed visits) plus what the
    visits in flight have recorded so far; a charge that crosses a limit is refused
    -- the call that crossed it is counted (the tokens were spent), nothing after it.
    """

    def __init__(self, plan: Plan, view: RunView, run_id: str) -> None:
        self._plan = plan
        self._view = view
        self._run_id = run_id
        self._inflight: dict[tuple[str, int, int | None], Context] = {}
        self._lock = threading.Lock()  # sync nodes charge from worker threads

    # Every access to ``_inflight`` (and to the tallies `_exceeded` sums) holds ``_lock``:
    # `charge` runs on a sync node's thread while the loop's `enter`/`leave` change it.

    def enter(self, ctx: Context) -> None:
        with self._lock:
            self._inflight[(ctx.node, ctx.visit, ctx.item_index)] = ctx

    def leave(self, ctx: Context) -> None:
        with self._lock:
            self._inflight.pop((ctx.node, ctx.visit, ctx.item_index), None)

    def charge(self, ctx: Context, n: int) -> None:
        spent = ctx.spent
        with self._lock:
            spent.add(n)
            spent.over = over = self._exceeded(ctx)
        if over is not None:
            raise over

    def spent_already(self, ctx: Context) -> BudgetExceededError | None:
        """The budget error if the visit's own budget, or the run's, was crossed before this
        attempt (a resume that did not raise it): the attempt does not run, it would only
        spend more."""
        with self._lock:
            return self._exceeded(ctx)

    def _exceeded(self, ctx: Context) -> BudgetExceededError | None:
        node_limit = self._plan.nodes[ctx.node].spec.tokens
        # what the log has for this visit (earlier attempts, recorded effects) and the rest
        running = self._view.running.get((ctx.node, ctx.visit))
        used = (running.tokens if running is not None else 0) + ctx.spent.unsaved
        if node_limit is not None and used > node_limit:
            return BudgetExceededError(
                f"node {ctx.node!r} used {used} tokens in this visit (all its attempts); its "
                f"budget is {node_limit} "
                "(tokens: on the node, in the workflow the run keeps: a resume runs the node "
                "again under the same budget; raise it in the file and start a new run)",
                node=ctx.node, used=used, limit=node_limit, scope="node")
        limit = self._view.limits.get("tokens")
        if limit is None:
            return None
        total = self._view.tokens + sum(c.spent.unsaved for c in self._inflight.values())
        if total > limit:
            return BudgetExceededError(
                f"the run used {total} tokens, over its budget of {limit} (limits.tokens), "
                f"when node {ctx.node!r} recorded its usage; a resume that raises the limit "
                "(--set limits.tokens=N) continues it", node=ctx.node,
                used=total, limit=limit, scope="run")
        return None


__all__ = ["Budget", "Tally"]
