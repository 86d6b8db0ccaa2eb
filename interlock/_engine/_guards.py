"""Guards: what wraps a node call. Each is a small wrapper of the next call and knows
one policy; `_call.NodeCall` composes them, once per run and kind of node::

    Retry( Budgeted( Settle( in_loop | in_thread | InProcess ) ) )

An attempt goes in (`Attempt`: the node, its visit and attempt number, the state it
reads, its `Context`), an `Outcome` comes out. From the outside in:

- `Retry`     -- runs attempts until one succeeds, its error is not retryable, or the
                 node's ``retry.attempts`` failures are used; each retry is a
                 ``node.retrying`` and a ``node.started`` record (only for a node that
                 declares ``retry:``);
- `Budgeted`  -- the token budgets (`_budget.Budget`: ``limits.tokens`` and the node's
                 ``tokens:``): the attempt is in flight for the budget while it runs, does
                 not run once the budget is spent, and fails if it crossed the budget
                 even when the body swallowed the error (only for a node with a context);
- `Settle`    -- what the body did, as an `Outcome`: its checked update and goto, or
                 its error (an exception, a timeout, a result the check refuses), or its
                 request for a human (``ctx.confirm``); a cancellation of the run stops it;
- where the body runs, under the node's ``timeout:`` (enforced there, since how
                 depends on it): `in_loop` (``async def``; the timer is armed only when
                 the body first suspends), `in_thread` (sync, on interlock's own threads;
                 a timeout abandons the thread), `InProcess` (``isolation: process``; the
                 worker process is killed).

Inside the body ``ctx.record_tokens`` charges the `_budget.Budget` and ``ctx.once`` goes
through the run's effect journal (`_call.NodeCall`, the context's port).

What a guard needs from the run -- the next attempt, the failures the log holds, the
check of a result, the record of a stopped attempt, the process pool -- it asks of one
`GuardPort`, which `_call.NodeCall` implements (a test, a fake of its own).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .._errors import (
    BudgetExceededError,
    NodeError,
    NodeTimeout,
    RouteError,
    RunError,
    StepLimitError,
    WriteConflictError,
)
from .._json import JSONObject
from . import _records as R
from ._context import PauseRequested
from ._isolation import ChildContext
from ._origin import located, user_frame
from ._steps import Steps

if TYPE_CHECKING:
    from .._definition._plan import PlanNode
    from ._budget import Budget
    from ._context import Context
    from ._isolation import Effects, ProcessPool


class Attempt:
    """One attempt of one visit of a node: what the guards pass down to the body.

    (Slots, not a named tuple: the guards read its fields on every node's path, and a
    slot is read faster than a named tuple's field.)
    """

    __slots__ = ("ctx", "item", "number", "pn", "state", "t0", "visit", "waits")

    def __init__(self, pn: PlanNode, visit: int, number: int, state: JSONObject,
                 ctx: Context | None, t0: float, item: int | None = None) -> None:
        self.pn = pn
        self.visit = visit
        self.number = number
        self.state = state
        self.ctx = ctx  # only for a body that can use one (tokens, effects, confirmations)
        self.t0 = t0  # the duration and the timeout count from here (time.perf_counter())
        self.item = item  # a mapped node's: the index of the item in its visit's list
        # called when the body first waits (`in_loop`): the run's sink seals the visit's
        # deferred node.started then (`_staging.Staging.started`); None: nothing to say
        self.waits: Callable[[], object] | None = None


_perf_counter = time.perf_counter


def attempt_of(pn: PlanNode, visit: int, number: int, state: JSONObject,
               ctx: Context | None) -> Attempt:
    """An attempt starting now."""
    return Attempt(pn, visit, number, state, ctx, _perf_counter())


class Outcome(NamedTuple):
    """How one attempt of a visit ended. (A named tuple: one per node execution.)"""

    node: str
    visit: int
    attempt: int
    update: JSONObject | None = None
    goto: str | None = None
    error: RunError | None = None
    duration_ms: float = 0.0
    tokens: int = 0
    pause: PauseRequested | None = None  # the node asked a human (ctx.confirm)


new_outcome = functools.partial(tuple.__new__, Outcome)  # no Python-level __new__ call

Call = Callable[[Attempt], Awaitable[Outcome]]  # a guard at the outcome's level
Body = Callable[[Attempt], Awaitable[object]]  # the body where it runs (below `Settle`)
Check = Callable[["PlanNode", object], tuple[JSONObject, "str | None"]]


class GuardPort(Protocol):
    """What the guards ask of the run they guard (`_call.NodeCall` implements it). Each
    guard takes the bound methods it calls from the port once, when it is built: the
    node's path makes no extra lookup."""

    @property
    def sink(self) -> R.Sink:
        """Where `Retry` commits ``node.retrying`` and ``node.started``."""
        ...

    def begin(self, pn: PlanNode, visit: int, attempt: int, item: int | None = None
              ) -> Attempt:
        """The attempt ``attempt`` of a visit (of an ``item`` of a mapped node's), starting
        now: it reads the state as it is now (after its ``node.started`` is committed)."""
        ...

    def failures(self, node: str, visit: int, item: int | None) -> int | None:
        """The visit's (or the item's) failed attempts as the log has them; None when it
        has no running visit."""
        ...

    def check_result(self, pn: PlanNode, result: object) -> tuple[JSONObject, str | None]:
        """What a body returned, as its update and goto; raises a `RunError` if refused."""
        ...

    def attempt_stopped(self, a: Attempt) -> None:
        """The run stopped ``a`` (a cancellation asked for): stage its ``node.failed``."""
        ...

    def process_pool(self) -> ProcessPool:
        """The run's pool of worker processes (``isolation: process``), started now if it
        was not."""
        ...

    def effects(self, ctx: Context) -> Effects:
        """How ``ctx.once`` in a worker process reaches the run's effect journal."""
        ...


def failed(a: Attempt, error: RunError) -> Outcome:
    """The outcome of an attempt that failed with ``error`` before its body ran."""
    tokens = a.ctx.tokens if a.ctx is not None else 0
    duration = round((_perf_counter() - a.t0) * 1e6) / 1000
    return new_outcome((a.pn.name, a.visit, a.number, None, None, error, duration, tokens,
                        None))


# -- retry ---------------------------------------------------------------------------


class Retry:
    """Attempts until one succeeds, or its error is not retryable (`retryable`), or the
    visit has failed ``retry.attempts`` times; backs off between attempts.

    From its port: ``begin`` (the next attempt), ``failures`` (as the log counts them),
    ``sink`` (its records).
    """

    __slots__ = ("begin", "failures", "next", "sink")

    def __init__(self, next: Call, port: GuardPort) -> None:
        self.next = next
        self.begin, self.failures, self.sink = port.begin, port.failures, port.sink

    async def __call__(self, a: Attempt) -> Outcome:
        pn, visit, item = a.pn, a.visit, a.item
        retry = pn.spec.retry
        while True:
            out = await self.next(a)
            if out.error is None or retry is None or not retryable(out.error, retry.errors):
                return out
            # attempts that failed, this one included -- a re-run after a human's
            # confirmation or a crash is an attempt too, but not a failure
            failures = self.failures(pn.name, visit, item)
            if (failures if failures is not None else a.number - 1) + 1 >= retry.attempts:
                return out
            delay = backoff(retry.backoff, retry.max_backoff, retry.jitter, a.number)
            await self.sink.commit([R.node_retrying(
                pn.name, visit, a.number, out.error.to_json(), out.duration_ms, out.tokens,
                delay, item)])
            if delay:
                await asyncio.sleep(delay)
            await self.sink.commit([R.node_started(pn.name, visit, a.number + 1, item)])
            a = self.begin(pn, visit, a.number + 1, item)


def retryable(error: RunError, names: list[str]) -> bool:
    if isinstance(error, (RouteError, WriteConflictError, BudgetExceededError,
                          StepLimitError)):  # (a sub-workflow's child crossing the run's)
        return False
    if not names:
        return True
    exc_name = error.details.get("exception")
    mro = error.details.get("mro") or [exc_name]
    return any(n in names for n in mro if n)


def backoff(base: float, cap: float | None, jitter: bool, attempt: int) -> float:
    delay = base * (2 ** (attempt - 1))
    if cap is not None:
        delay = min(delay, cap)
    if jitter and delay:
        delay = random.uniform(0, delay)
    return float(delay)


# -- budget --------------------------------------------------------------------------


class Budgeted:
    """The token budgets around an attempt that has a context (`Budget`)."""

    __slots__ = ("budget", "next")

    def __init__(self, next: Call, budget: Budget) -> None:
        self.next, self.budget = next, budget

    async def __call__(self, a: Attempt) -> Outcome:
        ctx = a.ctx
        if ctx is None:
            return await self.next(a)
        budget = self.budget
        budget.enter(ctx)
        try:
            spent = budget.spent_already(ctx)
            if spent is not None:
                return failed(a, spent)  # the visit's own budget is gone (a resume after
                # it failed): it would only spend more
            out = await self.next(a)
        finally:
            budget.leave(ctx)
        over = ctx.spent.over
        if over is not None:  # crossed the budget, even if the node swallowed it
            return out._replace(error=over, update=None, goto=None)
        return out


# -- the outcome -----------------------------------------------------------------------


class Settle:
    """What the body did, as an `Outcome`. Never raises an Exception: a body's exception
    (``SystemExit`` too) is its error, and so is its own ``CancelledError``; a
    cancellation asked for (the run's, a sibling's failure, a caller's) is reported to
    the port (``attempt_stopped``) and propagates. The port's ``check_result`` turns the
    body's result into its update and goto (or raises a `RunError`)."""

    __slots__ = ("check", "next", "stopped")

    def __init__(self, next: Body, port: GuardPort) -> None:
        self.next = next
        self.check: Check = port.check_result
        self.stopped: Callable[[Attempt], None] = port.attempt_stopped

    async def __call__(self, a: Attempt) -> Outcome:
        pn = a.pn
        error: RunError | None = None
        update: JSONObject | None = None
        goto: str | None = None
        pause = None
        try:
            update, goto = self.check(pn, await self.next(a))
        except PauseRequested as exc:
            pause = exc
        except NodeTimeout as exc:
            error = timeout_error(pn, overran=exc.args == (OVERRAN,))
        except SystemExit as exc:  # sys.exit() in a body: its failure, not the process's exit
            error = node_error(pn, exc)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                self.stopped(a)  # the visit stopped, with what it had spent
                raise
            # raised by the body itself (a library cancelling its own work): its failure,
            # not the run's cancellation -- the run would otherwise stop as RUNNING
            error = node_error(pn, exc)
        except RunError as exc:
            error = exc
        except Exception as exc:  # the node's own failure: becomes its error record
            error = node_error(pn, exc)
        # milliseconds to the microsecond (round() to an int: round(x, 3) costs 10x more)
        duration = round((_perf_counter() - a.t0) * 1e6) / 1000
        ctx = a.ctx
        return new_outcome((pn.name, a.visit, a.number, update, goto, error, duration,
                            ctx.tokens if ctx is not None else 0, pause))


def node_error(pn: PlanNode, exc: BaseException) -> NodeError:
    text = str(exc)
    own = f"node {pn.name!r}: "
    if text.startswith(own):  # an error of interlock's own (an agent's) names the node too
        text = text[len(own):]
    at = user_frame(exc)  # the line of the user's code it came from, on the error's line
    details = {"at": at} if at else {}
    return NodeError(located(f"node {pn.name!r} raised {type(exc).__name__}: {text}", at),
                     node=pn.name, exception=type(exc).__name__,
                     mro=[c.__name__ for c in type(exc).__mro__], traceback=_short_tb(exc),
                     **details)


def _short_tb(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6)
    return "".join(lines)[-4000:]


# -- where the body runs, under its timeout ---------------------------------------------
#
# The timeout is enforced where the body runs, because how depends on it: a coroutine
# is interrupted at its next suspension, a thread cannot be (it is abandoned), a process
# is killed (by the pool). Each raises `NodeTimeout` for the engine's deadline and lets
# a body's own ``TimeoutError`` through.


async def in_loop(a: Attempt) -> object:
    """An ``async def`` body, in the event loop, in the task running the visit, under
    the node's timeout (counted from the attempt's start), as ``asyncio.timeout`` would.

    A timeout can only interrupt a coroutine where it suspends, so the deadline is
    also checked when the body returns: one that computed past it without yielding (the
    timer could not fire) is failed as timed out all the same, its result discarded --
    a declared timeout is never ignored. The deadline is
    fixed at the start and the timer armed only when the body first suspends: a node
    that returns without waiting on anything (most transforms, every trivial node) never
    creates a timer. That timer costs about as much as the rest of a trivial node's
    bookkeeping, which is why this is not simply ``async with asyncio.timeout(...)``.
    Same task, same context, same exceptions either way. (One coroutine, the body's
    driver too: one frame on the path of every node.)
    """
    pn = a.pn
    fn = pn.fn
    assert fn is not None, "approval and agent nodes are not dispatched here"
    coro = fn(a.state, a.ctx) if pn.wants_ctx else fn(a.state)
    try:
        signal = coro.send(None)
    except StopIteration as done:
        if _perf_counter() - a.t0 > pn.timeout:
            raise NodeTimeout(OVERRAN) from None  # it overran without ever suspending
        return done.value
    if a.waits is not None:  # it waits: a deferred node.started is sealed (shown) now
        a.waits()
    scope = asyncio.timeout(pn.timeout - (_perf_counter() - a.t0))
    try:
        async with scope:
            value = await Steps(coro, first=signal)
    except TimeoutError:
        if scope.expired():
            raise NodeTimeout() from None
        raise  # the body's own TimeoutError
    if _perf_counter() - a.t0 > pn.timeout:
        raise NodeTimeout(OVERRAN)  # overran after its last suspension: no timer could fire
    return value


async def in_thread(a: Attempt) -> object:
    """A sync body, on one of interlock's threads (in a copy of the visit's context). A
    timeout, or a cancellation (a stopping worker's), leaves the thread running: it is
    counted in `abandoned`."""
    global abandoned
    pn = a.pn
    assert pn.fn is not None, "approval and agent nodes are not dispatched here"
    args = (a.state, a.ctx) if pn.wants_ctx else (a.state,)
    call = functools.partial(contextvars.copy_context().run, pn.fn, *args)
    running = NODE_THREADS.submit(call)  # (what run_in_executor does, keeping the future)
    future = asyncio.wrap_future(running)
    scope = asyncio.timeout(pn.timeout)
    try:
        async with scope:
            return await future
    except TimeoutError:
        if not scope.expired():
            raise  # the body's own TimeoutError: its failure, and its thread is done
        abandoned += 1
        raise NodeTimeout() from None
    except asyncio.CancelledError:
        if running.running():  # (one not started yet was cancelled with the wait)
            abandoned += 1
        raise


class InProcess:
    """The body in a worker process (`_isolation`), which enforces the timeout (it kills
    the process); raises NodeTimeout, or NodeError for the body's or the process's
    failure. From its port: the run's pool (started on first use), and how ``ctx.once``
    in the worker reaches the run's effect journal."""

    __slots__ = ("effects", "pool")

    def __init__(self, port: GuardPort) -> None:
        self.pool: Callable[[], ProcessPool] = port.process_pool
        self.effects: Callable[[Context], Effects] = port.effects

    async def __call__(self, a: Attempt) -> object:
        pn, ctx = a.pn, a.ctx
        assert pn.spec.call is not None and ctx is not None
        res = await self.pool().call(pn.spec.call, a.state, ChildContext.of(ctx),
                                     timeout=pn.timeout, memory=pn.spec.memory,
                                     on_tokens=ctx.record_tokens, effects=self.effects(ctx))
        return res.value(pn.name)


OVERRAN = "overran"  # a NodeTimeout's argument: the body returned after its deadline


def timeout_error(pn: PlanNode, *, overran: bool = False) -> NodeError:
    how = ""
    if overran and pn.is_async:
        how = (" (it computed past its deadline without awaiting, so it could not be "
               "interrupted: it was failed when it returned and its result discarded; an "
               "async def body that computes or calls a blocking client holds up every "
               "run on its event loop -- make it a sync def, which runs on a thread, or "
               "await the slow calls)")
    elif pn.spec.executor == "ray":
        how = " (its Ray task was cancelled)"
    elif not pn.is_async and pn.spec.isolation != "process":
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
abandoned = 0  # threads left running after their node timed out or was stopped (cli.main)


__all__ = [
    "NODE_THREADS",
    "Attempt",
    "Body",
    "BudgetExceededError",
    "Budgeted",
    "Call",
    "GuardPort",
    "InProcess",
    "Outcome",
    "Retry",
    "Settle",
    "attempt_of",
    "backoff",
    "failed",
    "in_loop",
    "in_thread",
    "new_outcome",
    "node_error",
    "retryable",
    "timeout_error",
]
