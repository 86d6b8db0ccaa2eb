"""The node call: each node's guard stack (`_guards`), the checks of what a node
returned, and the port a node's `Context` talks to (tokens, the effect journal, its
own records, a human's confirmations).

`NodeCall` composes the guards for each kind of node once per run (`NodeCall.stacks`,
by `PlanNode.guards`); the scheduler runs an attempt with
``await calls.stack(pn)(calls.begin(pn, visit, attempt))`` and gets an `Outcome`.
Records go through the run's sink (`_records.Sink`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from time import perf_counter

from .. import _log as L
from .._definition._plan import ASYNC, CTX, GUARD_KINDS, ISOLATED, ON_RAY, RETRY, Plan, PlanNode
from .._definition._state import check_update, scoped
from .._errors import NodeError, RouteError, StoreError, UsageError, WriteConflictError
from .._json import JSON, JSONObject
from . import _records as R
from ._budget import Budget
from ._context import Context, Goto
from ._fold import RunView
from ._guards import (
    Attempt,
    Body,
    Budgeted,
    Call,
    InProcess,
    Outcome,
    Retry,
    Settle,
    in_loop,
    in_thread,
)
from ._isolation import Effects, ProcessPool
from ._journal import StoreOutage


class NodeCall:
    """Runs the attempts of a run's nodes; the `_guards.GuardPort` of their guards and
    the `_context.Port` of their contexts."""

    def __init__(self, plan: Plan, view: RunView, sink: R.Sink, run_id: str) -> None:
        self.plan = plan
        self.view = view
        self.sink = sink
        self._waits = getattr(sink, "started", None)  # (`Attempt.waits`)
        self.run_id = run_id
        self.budget = Budget(plan, view, run_id)
        # the port's ``charge_tokens`` (`_context.Port`) is the budget's own charge
        self.charge_tokens = self.budget.charge
        # visits (and mapped nodes' items) recorded as cancelled
        self.stopped: set[tuple[str, int, int | None]] = set()
        self._pool: ProcessPool | None = None  # started by the first isolation: process node
        # mapped visits whose items wait for people, by (node, visit): set when a
        # decision on one of them is folded in while the visit's task runs (`_mapped`)
        self.wakers: dict[tuple[str, int], asyncio.Event] = {}
        # a guard stack for each kind of node the plan has, by `PlanNode.guards`
        self.stacks: list[Call | None] = [None] * GUARD_KINDS
        for kind in plan.guard_kinds:
            self.stacks[kind] = self._compose(kind)

    # -- the guard stack ---------------------------------------------------------------

    def stack(self, pn: PlanNode) -> Call:
        """The guards a node's attempts go through."""
        stack = self.stacks[pn.guards]
        assert stack is not None, "a node of a kind its plan does not have"
        return stack

    def _compose(self, kind: int) -> Call:
        body: Body  # where the body runs, under its timeout
        if kind & ON_RAY:
            from ._ray import OnRay  # only a plan with a Ray node loads it

            body = OnRay()
        elif kind & ISOLATED:
            body = InProcess(self)
        else:
            body = in_loop if kind & ASYNC else in_thread
        # each guard's bound __call__, not the guard: calling a bound method is a fast
        # path of the interpreter, calling an instance of a class is not
        call: Call = Settle(body, self).__call__
        if kind & CTX:
            call = Budgeted(call, self.budget).__call__
        if kind & RETRY:
            call = Retry(call, self).__call__
        return call

    def begin(self, pn: PlanNode, visit: int, attempt: int, item: int | None = None
              ) -> Attempt:
        """An attempt, with the state the node reads as it is now (and, for an ``item``
        of a mapped node's visit, the item under the map's ``as``)."""
        state = dict(self.view.state) if pn.reads is None else scoped(self.view.state, pn.reads)
        # a context only for a body that can use it (tokens, effects, confirmations)
        ctx = Context(self, pn.name, visit, attempt, item) if pn.needs_ctx else None
        # `Attempt(pn, visit, attempt, state, ctx, perf_counter())` without its
        # ``__init__`` (a Python call per attempt): a bare instance, its slots stored here
        a = _new_attempt(Attempt)
        a.pn = pn
        a.visit = visit
        a.number = attempt
        a.state = state
        a.ctx = ctx
        a.item = item
        a.waits = self._waits
        if item is not None:
            assert pn.mapped is not None
            state[pn.mapped.spec.item_name] = self.view.maps[(pn.name, visit)].items[item]
        a.t0 = perf_counter()
        return a

    async def visit(self, pn: PlanNode, visit: int, attempt: int, *, rerun: bool) -> Outcome:
        """Run a visit (with its retries). ``rerun``: the visit was running when the run
        last stopped (or waited for a human): it starts again.

        The node's failures are its outcome's error; what raises is the run's, not the
        node's: the store refusing a record (a `StoreError` from the sink, or
        `StoreOutage` from inside the body), a cancellation, a bug."""
        if rerun:
            await self.sink.commit([R.node_started(pn.name, visit, attempt)])
        return await self.stack(pn)(self.begin(pn, visit, attempt))

    def waker(self, key: tuple[str, int]) -> asyncio.Event:
        """The event a mapped visit's task waits on for decisions on its items."""
        return self.wakers.setdefault(key, asyncio.Event())

    def wake(self, key: tuple[str, int]) -> None:
        """A decision on an item of visit ``key`` was folded in: its task looks again."""
        event = self.wakers.get(key)
        if event is not None:
            event.set()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    # -- the guards' port (`_guards.GuardPort`; `begin` above, `check_result` below) ---

    def failures(self, node: str, visit: int, item: int | None) -> int | None:
        if item is not None:
            running = self.view.maps[(node, visit)].running.get(item)
            return running.failures if running is not None else None
        running = self.view.running.get((node, visit))
        return running.failures if running is not None else None

    def process_pool(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool()
        return self._pool

    def effects(self, ctx: Context) -> Effects:
        return Effects.of(self, ctx)

    def attempt_stopped(self, a: Attempt) -> None:
        self.stop(a.pn.name, a.visit, a.number, a.ctx, a.item)

    def stop(self, node: str, visit: int, attempt: int | None, ctx: Context | None,
             item: int | None = None) -> None:
        """Stage ``node.failed`` (cancelled) for a visit (or an item of a mapped node's)
        the run stopped, with the tokens it had spent and not yet recorded; it runs again
        on resume."""
        if (node, visit, item) in self.stopped:
            return
        self.stopped.add((node, visit, item))
        tokens = ctx.tokens if ctx is not None else 0  # the attempt's, as a record has them
        self.sink.add(R.node_cancelled(node, visit, attempt, tokens, item))

    # -- what a node returned ------------------------------------------------------------

    def check_result(self, pn: PlanNode, result: object) -> tuple[JSONObject, str | None]:
        goto: str | None = None
        if isinstance(result, Goto):
            goto, result = result.node, result.update
            allowed = [t for e in pn.out if e.kind == "choose" for t in e.targets]
            if goto not in allowed:
                decl = ", ".join(allowed) if allowed else "none: the node has no 'choose' edge"
                raise RouteError(f"node {pn.name!r} returned goto({goto!r}); its declared "
                                 f"choose targets are: {decl}", node=pn.name)
        update, plain = check_update(pn.name, result, pn.writes, self.plan.reducers)
        if not plain:
            try:
                update = L.to_json_value(update)
            except TypeError as exc:
                raise NodeError(f"node {pn.name!r} returned a value that is not JSON data: "
                                f"{exc}", node=pn.name) from None
        return update, goto

    def write_conflict(self, out: Outcome, *, overlap: bool) -> WriteConflictError | None:
        """A field without a reducer that another node wrote, which ran concurrently with
        this one (``overlap``: completed while this visit ran) or could have by the graph
        (two nodes that *can* run concurrently) -- so that whether a run fails
        does not depend on which branch happened to be faster."""
        running = self.view.running.get((out.node, out.visit))
        if running is None or not out.update:
            return None
        conc = self.plan.concurrency if self.plan.nodes[out.node].branched else None
        if not overlap and conc is None:
            return None
        for key in out.update:
            if self.plan.reducers.get(key, "replace") != "replace":
                continue
            w = self.view.writers.get(key)
            if w is None or w.node == out.node:
                continue
            by_graph = conc is not None and conc.parallel(w.node, out.node)
            if by_graph or (overlap and w.completed_seq > running.started_seq):
                return WriteConflictError(
                    f"nodes {w.node!r} and {out.node!r} "
                    + ("can run concurrently (branches of one fork)" if by_graph
                       else "ran concurrently") + " and both wrote field "
                    f"{key!r}, which has no reducer: declare a reducer for it under state: "
                    f"(append, extend, merge, add) or make one node write another field",
                    node=out.node, field=key, nodes=[w.node, out.node])
        return None

    # -- the port of a node's context (`_context.Port`) -----------------------------------

    @property
    def config(self) -> JSONObject:
        return self.view.config

    def recorded_effect(self, ctx: Context, key: str) -> tuple[bool, JSON]:
        broken = getattr(self.sink, "broken", None)
        if broken is not None:  # the run's records cannot be stored: do not run an effect
            raise StoreOutage(broken)  # whose result would be lost (`_journal.Journal`)
        k = (ctx.node, ctx.visit, key if ctx.item_index is None else (ctx.item_index, key))
        if k in self.view.effects:
            return True, self.view.effects[k]
        return False, None

    async def record_effect(self, ctx: Context, key: str, result: object) -> JSON:
        value: JSON = L.to_json_value(result)
        # spent on it (and, unrecorded, before it in this attempt): committed with it
        tokens = ctx.spent.take_unsaved()
        steps, ctx.spent.steps = ctx.spent.steps, 0  # a child run's, counted here
        self.sink.stage([R.effect_recorded(ctx.node, ctx.visit, ctx.attempt, key, value,
                                           tokens, ctx.item_index, steps)])
        await self._flush_for_body()
        return value

    async def _flush_for_body(self) -> None:
        """Flush for a node's body (``ctx.once``, ``ctx.log``): a store that cannot take
        the records (after the journal's retries) is not the node's failure -- the body
        gets `StoreOutage`, which its ``except Exception:`` does not catch, nor its
        ``retry:`` or error edges; the run is given up with the store's error."""
        try:
            await self.sink.flush()
        except StoreError as exc:
            raise StoreOutage(exc) from exc

    async def log_record(self, ctx: Context, rtype: str, fields: Mapping[str, object]) -> None:
        if not _OWN_TYPE.match(rtype) or rtype.split(".")[0] in L.ENGINE_NAMESPACES:
            raise UsageError(f"ctx.log: {rtype!r} is not a record type a node may write "
                             f"(node {ctx.node!r}); use a dotted name such as 'agent.reply' "
                             "outside the engine's namespaces "
                             f"{', '.join(n + '.' for n in sorted(L.ENGINE_NAMESPACES))}")
        await self.engine_record(ctx, rtype, fields)

    async def engine_record(self, ctx: Context, rtype: str, fields: Mapping[str, object]
                            ) -> None:
        data = dict(L.to_json_value(dict(fields)))
        data.update(node=ctx.node, visit=ctx.visit, attempt=ctx.attempt)
        if ctx.item_index is not None:
            data["item"] = ctx.item_index
        self.sink.stage([(rtype, data)])
        await self._flush_for_body()

    def confirmation(self, ctx: Context, key: str) -> str | None:
        return self.view.confirmations.get((ctx.node, ctx.visit, key))

    def node_args(self, node: str) -> Mapping[str, object]:
        return self.plan.nodes[node].args

    def effect_keys(self, node: str) -> list[str]:
        return [key if isinstance(key, str) else key[1]
                for n, _, key in self.view.effects if n == node]


_new_attempt = object.__new__
_OWN_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


__all__ = ["NodeCall"]
