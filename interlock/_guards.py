"""Guards: what wraps a node call. Each is small and knows one policy.

    retry( timeout( isolation( body ) ) )   with the budget charged from inside the body

- `Budget`   -- token budgets of the run (``limits.tokens``) and of a node
                (``tokens:``), shared safely by parallel branches;
- `call_body` -- the timeout, and where the body runs: the event loop (async),
                a worker thread (sync), or a separate process (``isolation: process``);
- retries live in `Runner._visit` (each attempt is a record), the effect journal
  in `Context.once`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ._errors import BudgetExceededError, NodeError, NodeTimeout
from ._steps import Steps

if TYPE_CHECKING:
    from ._context import Context
    from ._fold import RunView
    from ._plan import Plan, PlanNode


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
        self._inflight: dict[tuple[str, int], Context] = {}
        self._lock = threading.Lock()  # sync nodes charge from worker threads

    def enter(self, ctx: Context) -> None:
        self._inflight[(ctx.node, ctx.visit)] = ctx

    def leave(self, ctx: Context) -> None:
        self._inflight.pop((ctx.node, ctx.visit), None)

    def charge(self, ctx: Context, n: int) -> None:
        with self._lock:
            ctx._tokens += n
            ctx._unsaved += n
            ctx._over = self._exceeded(ctx)
        if ctx._over is not None:
            raise ctx._over

    def spent_already(self, ctx: Context) -> BudgetExceededError | None:
        """The budget error if the visit's own budget, or the run's, was crossed before this
        attempt (a resume that did not raise it): the attempt does not run, it would only
        spend more."""
        return self._exceeded(ctx)

    def _exceeded(self, ctx: Context) -> BudgetExceededError | None:
        node_limit = self._plan.nodes[ctx.node].spec.tokens
        # what the log has for this visit (earlier attempts, recorded effects) and the rest
        running = self._view.running.get((ctx.node, ctx.visit))
        used = (running.tokens if running is not None else 0) + ctx._unsaved
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
        total = self._view.tokens + sum(c._unsaved for c in self._inflight.values())
        if total > limit:
            return BudgetExceededError(
                f"the run used {total} tokens, over its budget of {limit} (limits.tokens), "
                f"when node {ctx.node!r} recorded its usage; continue it with "
                f"`interlock resume {self._run_id} --set limits.tokens=N`", node=ctx.node,
                used=total, limit=limit, scope="run")
        return None


def timeout_error(pn: PlanNode) -> NodeError:
    how = ""
    if not pn.is_async and pn.spec.isolation != "process":
        how = (" (a sync node cannot be interrupted in-process: its worker thread was "
               "abandoned and may still be running; use isolation: process to have it killed)")
    elif pn.spec.isolation == "process":
        how = " (its process was killed)"
    return NodeError(f"node {pn.name!r} timed out after {pn.timeout:g}s{how}", node=pn.name,
                     exception="TimeoutError")


# Sync node bodies run here rather than in the loop's default executor: that one has
# min(32, cpus + 4) threads (a 100-way fan-out of sync nodes would run 6 at a time),
# and ``asyncio.run`` waits for it at exit -- so a thread abandoned after a timeout
# would hold up the end of the run.
NODE_THREADS = ThreadPoolExecutor(max_workers=128, thread_name_prefix="interlock-node")
abandoned = 0  # threads left running after their node timed out (see cli.main)


async def call_body(pn: PlanNode, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run the body under the node's timeout, in the loop (async) or a worker thread (sync).

    Raises `NodeTimeout` past the timeout; anything the body raises propagates (a
    ``TimeoutError`` of its own too).
    """
    global abandoned
    if pn.is_async:
        return await bounded(fn(*args), pn.timeout)
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    future = asyncio.get_running_loop().run_in_executor(NODE_THREADS, call)
    scope = asyncio.timeout(pn.timeout)
    try:
        async with scope:
            return await future
    except TimeoutError:
        if not scope.expired():
            raise  # the body's own TimeoutError: its failure, and its thread is done
        abandoned += 1
        raise NodeTimeout() from None


async def bounded(coro: Coroutine[Any, Any, Any], timeout: float,
                  started: float | None = None) -> Any:
    """``await coro`` under ``timeout`` seconds, as ``asyncio.timeout`` would.

    A timeout can only interrupt a coroutine where it suspends, so the deadline is
    fixed now and the timer armed only when the body first suspends: a node that
    returns without waiting on anything (most transforms, every trivial node) never
    creates a timer. That timer costs about as much as the rest of a trivial node's
    bookkeeping, which is why this is not simply ``async with asyncio.timeout(...)``.
    Same task, same context, same exceptions either way. ``started``: the
    ``time.perf_counter()`` the timeout counts from (default: now).
    """
    if started is None:
        started = time.perf_counter()
    try:
        signal = coro.send(None)
    except StopIteration as done:
        return done.value
    scope = asyncio.timeout(timeout - (time.perf_counter() - started))
    try:
        async with scope:
            return await Steps(coro, first=signal)
    except TimeoutError:
        if scope.expired():
            raise NodeTimeout() from None
        raise  # the body's own TimeoutError


__all__ = ["NODE_THREADS", "Budget", "BudgetExceededError", "bounded", "call_body",
           "timeout_error"]
