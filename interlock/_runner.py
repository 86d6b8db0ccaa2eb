"""The executor: drives one run -- starts ready nodes, makes edge decisions, commits records.

The loop, with what holds after each step::

    loop:
        decide every due edge         -> edge.taken / edge.skipped committed; view.due empty
        start every ready node        -> node.started committed; each visit has a task
        if nothing runs: finish       -> run.completed (or run.waiting)
        wait for one node to finish   -> node.completed + its edge decisions, one batch

Every change goes through ``_commit``: records are numbered and chained by
the `LogWriter`, stored (committed before anything that depends on them
starts), and only then applied to the `RunView` -- so the view never holds a
fact the store does not. Policies (timeouts, retries, process isolation)
wrap the node call in `_guards`; this loop knows none of them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import re
import time
import traceback
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import _expr
from . import _log as L
from . import _snapshot as snapshots
from ._context import Context, Goto, PauseRequested
from ._errors import (
    ExpressionError,
    InterlockError,
    InternalError,
    NodeError,
    NodeTimeout,
    NoRouteError,
    RouteError,
    RunError,
    StepLimitError,
    UsageError,
    WriteConflictError,
)
from ._expr import EvaluationError
from ._fold import Due, RunView, Scope
from ._guards import Budget, BudgetExceededError, bounded, call_body, timeout_error
from ._isolation import ChildContext, Effects, ProcessPool
from ._model import DEFAULT_STEPS, END, case_key
from ._plan import Plan, PlanEdge, PlanNode
from ._state import check_update, scoped
from ._store import Store, Summary

log = logging.getLogger("interlock")

YIELD_EVERY = 64  # inline visits between two turns given to the event loop


class Outcome(NamedTuple):
    """How one attempt of a visit ended. (A named tuple: one per node execution.)"""

    node: str
    visit: int
    attempt: int
    update: dict[str, Any] | None = None
    goto: str | None = None
    error: RunError | None = None
    duration_ms: float = 0.0
    tokens: int = 0
    pause: PauseRequested | None = None  # the node asked a human (ctx.confirm)


_new_outcome = functools.partial(tuple.__new__, Outcome)  # no Python-level __new__ call


class _Abort(Exception):
    """Raised inside the loop to end the run with ``error``."""

    def __init__(self, error: RunError) -> None:
        self.error = error


class _Raised(NamedTuple):
    """A router's exception, kept until its edge is decided."""

    exc: Exception


class _Rejected(Exception):
    """Raised inside the loop when a human rejection ends the run (status REJECTED)."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        self.message = message


class Runner:
    def __init__(self, plan: Plan, store: Store, run_id: str, view: RunView,
                 writer: L.LogWriter, listener: Any = None) -> None:
        self.plan = plan
        self.store = store
        self.run_id = run_id
        self.view = view
        self.writer = writer
        self.listener = listener
        self._done: asyncio.Queue[Outcome] | None = None  # outcomes of visits run as tasks
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._staged: list[L.Entry] = []
        self._snapshot_seq = writer.seq  # records since then are not in a snapshot
        self._snapshot_every = snapshots.EVERY
        self.budget = Budget(plan, view, run_id)
        self.cancelled_by: dict[str, Any] | None = None  # set by drive()'s cancel watcher
        self._pool: ProcessPool | None = None  # started by the first isolation: process node
        self._scope = Scope(view)  # what conditions see (state, config, run), looked up lazily
        self._stopped: set[tuple[str, int]] = set()  # visits recorded as cancelled
        # the answers of async routers, awaited by the loop before their edge is decided
        self._routed: dict[tuple[int, str], Any] = {}

    # -- committing ------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        return self.view.config

    def stage(self, items: list[tuple[str, dict[str, Any]]]) -> list[L.Record]:
        """Number and chain records and fold them into the view; `flush` stores them.

        Nothing that depends on a staged record may start before the flush returns:
        the loop only starts nodes after flushing.
        """
        return [self.stage1(rtype, {k: v for k, v in fields.items() if v is not None})
                for rtype, fields in items]

    def stage1(self, rtype: str, fields: dict[str, Any]) -> L.Record:
        """`stage` for one record whose fields have no None values (``fields`` becomes
        the record)."""
        rec, entry = self.writer.seal(rtype, fields)
        self.view.apply(rec)
        self._staged.append(entry)
        if self.listener is not None:
            self.listener(rec, self.view)
        return rec

    def _seal(self, rtype: str, fields: dict[str, Any]) -> L.Entry:
        """A record sealed and folded now, outside the staged batch (the caller stores it)."""
        rec, entry = self.writer.seal(rtype, fields)
        self.view.apply(rec)
        if self.listener is not None:
            self.listener(rec, self.view)
        return entry

    async def flush(self) -> None:
        """Commit every staged record (one transaction); now and then, a snapshot.

        Flushes are serialised: one that finds another in flight waits for it, so when
        this returns, what was staged before it is stored.
        """
        lock = self._lock
        await lock.acquire()  # (not ``async with``: two calls less, once per step)
        try:
            if not self._staged:
                return
            entries, self._staged = self._staged, []
            # the view matches the log up to entries[-1] right now, before any await
            snap = None
            if entries[-1].seq - self._snapshot_seq >= self._snapshot_every \
                    and entries[-1].type not in L.TERMINAL_TYPES:
                at = entries[-1].seq
                snap = snapshots.dump(self.view, entries[-1].hash)
                # bound to the chain: its digest rides in this batch, the row follows it
                entries.append(self._seal(*snapshots.taken(at, snap)))
            await self.store.append(self.run_id, entries, self.summary())
            if snap is not None:
                await self.store.save_snapshot(self.run_id, at, snap)
                self._snapshot_seq = at
                self._snapshot_every = snapshots.interval(len(snap))
        finally:
            lock.release()

    async def commit(self, items: list[tuple[str, dict[str, Any]]]) -> list[L.Record]:
        recs = self.stage(items)
        await self.flush()
        return recs

    def summary(self) -> Summary:
        v = self.view
        # positional: one is made per commit (status, last_seq, last_hash, steps, tokens,
        # error, waiting, updated_at)
        return Summary(v.status, self.writer.seq, self.writer.hash, v.steps, v.tokens, v.error,
                       v.waiting, time.time())

    # -- the loop --------------------------------------------------------------------

    async def execute(self) -> None:
        try:
            try:
                await self._loop()
            finally:
                await self._stop_tasks()
                if self._pool is not None:
                    await self._pool.close()
        except _Abort as abort:
            err = abort.error
            self.stage([(L.RUN_FAILED, {"error": err.to_json(), "node": err.node})])
        except _Rejected as rej:
            self.stage([(L.RUN_REJECTED, {"node": rej.node, "error": {
                "type": "rejected", "message": rej.message, "node": rej.node}})])
        except InterlockError:
            raise  # the store's (or a misuse): the caller's to see, as it was
        except Exception as exc:  # a bug (ours, or a plug-in's): the run fails, recorded
            log.error("run %s stopped on an unexpected error", self.run_id, exc_info=True)
            bug = InternalError(f"the run stopped on an unexpected {type(exc).__name__}: {exc}")
            self.stage([(L.RUN_FAILED, {"error": {"type": "internal_error", "node": None,
                                                  "message": str(bug)}})])
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.cancelled_by is None or task is None:
                raise  # not ours: the caller is being cancelled
            task.uncancel()
            by = self.cancelled_by.get("by")
            self.stage([(L.RUN_CANCELLED, {"by": by, "error": {
                "type": "cancelled", "node": None,
                "message": f"the run was cancelled by {by or 'an anonymous request'}"}})])
        await self.flush()

    async def _loop(self) -> None:
        view = self.view
        # visits that were running when the previous process stopped run again; a
        # gate still waiting for its human stays waiting; a confirmed node's body starts
        for key, v in list(view.running.items()):
            gate = view.gates.get(key)
            if gate is not None and gate.decision is None:
                continue
            first_body = gate is not None and gate.kind == "confirm" and not gate.body_started
            self._start_task(v.node, v.visit, 1 if first_body else v.attempt + 1, rerun=True)
        inline_steps = 0
        heavy_seen = _expr.heavy
        while True:
            if view.due:
                while (waiting := self._decide_due()) is not None:
                    await self._call_async_router(waiting)  # then decide on
                await self.flush()
            if view.ready:
                inline = self._start_ready()
                if inline is not None:
                    # one node and nothing else in flight: await it here, no task needed
                    pn, visit = inline
                    outcome = await (self._attempt(pn, visit, 1) if pn.spec.retry is None
                                     else self._visit(pn, visit, 1, rerun=False))
                    if outcome.error is None and outcome.pause is None and not pn.branched:
                        self._complete(outcome)  # (the common case, without a coroutine)
                    else:
                        await self._finish(outcome, alone=True)
                    await self.flush()
                    inline_steps += 1
                    if inline_steps % YIELD_EVERY == 0 or _expr.heavy != heavy_seen:
                        heavy_seen = _expr.heavy  # a costly condition (up to ~100 ms) ran:
                        # nodes that never wait (and a store that never waits) would
                        # otherwise hold the event loop for the whole run
                        await asyncio.sleep(0)
                    continue
            if not self._tasks:
                if view.idle:
                    await self.commit([(L.RUN_COMPLETED, {})])
                    return
                pending = view.pending_gates()
                if pending and not view.ready and not view.due:
                    await self.commit([(L.RUN_WAITING, {"waiting": pending[0].waiting(),
                                                        "node": pending[0].node})])
                    return
                raise _Abort(RunError("the run stopped with work left over -- this is a bug "
                                      "in interlock, please report it with the trace"))
            # wait for a visit to finish; take every other one that has finished too (a
            # fan-out's branches often end together) and commit them in one batch
            done = self._done
            assert done is not None
            outcome = await done.get()
            while True:
                self._tasks.pop((outcome.node, outcome.visit), None)
                await self._finish(outcome)
                if done.empty():
                    break
                outcome = done.get_nowait()
            await self.flush()

    def _start_ready(self) -> tuple[PlanNode, int] | None:
        """Start every ready node; return the one to run inline when it is alone."""
        view = self.view
        if len(view.ready) == 1 and not self._tasks:
            # the common step of a chain or a loop: one node, nothing else in flight
            node = view.ready[0]
            pn = self.plan.nodes[node]
            if not pn.gate:
                limit = view.limits.get("steps")
                if limit is not None and view.steps >= limit:
                    raise _Abort(_step_limit(limit, node))
                visit = view.started.get(node, 0) + 1
                self.stage1(L.NODE_STARTED, {"node": node, "visit": visit, "attempt": 1})
                return pn, visit
        items: list[tuple[str, int]] = []
        handed: Counter[str] = Counter()
        steps_limit = self.view.limits.get("steps")
        view = self.view
        count = view.steps
        for node in list(view.ready):
            if steps_limit is not None and count >= steps_limit:
                raise _Abort(_step_limit(steps_limit, node))
            count += 1
            handed[node] += 1
            items.append((node, view.started[node] + handed[node]))
        recs = self.stage([
            (L.NODE_STARTED, {"node": n, "visit": vis, "attempt": 1}) for n, vis in items])
        gates = [rec for rec in recs if self._is_gate(rec["node"])]
        if gates:
            self.stage([self._request(rec["node"], rec["visit"]) for rec in gates])
        # node.started is not flushed on its own: it goes with the next commit (a
        # completion, an effect, a retry). A crash before that loses only the fact
        # that the visit had started, so it starts again -- with the same visit
        # number and idempotency key -- which is what a resume does anyway.
        bodies = [rec for rec in recs if not self._is_gate(rec["node"])]
        if len(bodies) == 1 and not self._tasks:
            return self.plan.nodes[bodies[0]["node"]], bodies[0]["visit"]
        for rec in bodies:
            self._start_task(rec["node"], rec["visit"], 1, rerun=False)
        return None

    def _is_gate(self, node: str) -> bool:
        return self.plan.nodes[node].gate

    def _request(self, node: str, visit: int) -> tuple[str, dict[str, Any]]:
        """``approval.requested`` for an approval node or a node declared ``confirm: true``."""
        ns = self.plan.nodes[node].spec
        state = self.view.state
        if ns.approval is not None:
            kind = "approval"
            show = {f: state.get(f) for f in ns.approval.show}
            decisions = ["approve", "reject"] + (["modify"] if ns.approval.on_modify else [])
            timeout = ns.approval.timeout
        else:
            kind = "confirm"
            reads = ns.reads or []
            show = {f: state.get(f) for f in reads}
            decisions = ["approve", "reject"]
            timeout = None
        deadline = round(time.time() + timeout, 6) if timeout else None
        return (L.APPROVAL_REQUESTED, {"node": node, "visit": visit, "kind": kind,
                                       "show": L.to_json_value(show), "decisions": decisions,
                                       "approvers": _approvers(ns), "deadline": deadline})

    def _start_task(self, node: str, visit: int, attempt: int, *, rerun: bool) -> None:
        if self._done is None:
            self._done = asyncio.Queue()
        pn = self.plan.nodes[node]
        task = asyncio.get_running_loop().create_task(
            self._run_visit(pn, visit, attempt, rerun), name=f"interlock:{node}:{visit}")
        self._tasks[(node, visit)] = task

    async def _stop_tasks(self) -> None:
        """Cancel visits still in flight (a sibling failed, the run was cancelled).

        Their tokens were spent: each gets a ``node.failed`` record saying so, and
        runs again on resume.
        """
        running = self.view.running
        tasks = list(self._tasks.items())
        for _, t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        self._tasks.clear()
        for key, _ in tasks:  # those not stopped inside their body (a retry's backoff, ...)
            if key not in self._stopped:
                visit = running.get(key)
                self._stopped_visit(key[0], key[1], visit.attempt if visit else None, None)

    def _stopped_visit(self, node: str, visit: int, attempt: int | None,
                       ctx: Context | None) -> None:
        """Stage ``node.failed`` (cancelled) for a visit the run stopped, with the tokens it
        had spent and not yet recorded; it runs again on resume."""
        if (node, visit) in self._stopped:
            return
        self._stopped.add((node, visit))
        tokens = ctx.tokens if ctx is not None else 0  # the attempt's, as a record has them
        self.stage([(L.NODE_FAILED, {
            "node": node, "visit": visit, "attempt": attempt, "tokens": tokens or None,
            "error": {"type": "cancelled", "node": node,
                      "message": f"node {node!r} was cancelled: the run stopped"}})])

    # -- one visit of a node -----------------------------------------------------------

    async def _run_visit(self, pn: PlanNode, visit: int, attempt: int, rerun: bool) -> None:
        """A visit as a task: run it and report the outcome to the loop."""
        outcome = await self._visit(pn, visit, attempt, rerun=rerun)
        assert self._done is not None
        self._done.put_nowait(outcome)

    async def _visit(self, pn: PlanNode, visit: int, attempt: int, *, rerun: bool) -> Outcome:
        """Run a visit (with its retries). Never raises Exception."""
        retry = pn.spec.retry
        if retry is None and not rerun:
            return await self._attempt(pn, visit, attempt)
        if rerun:
            await self.commit([(L.NODE_STARTED, {"node": pn.name, "visit": visit,
                                                 "attempt": attempt})])
        while True:
            outcome = await self._attempt(pn, visit, attempt)
            if outcome.error is None or retry is None \
                    or not _retryable(outcome.error, retry.errors):
                break
            # attempts that failed, this one included -- a re-run after a human's
            # confirmation or a crash is an attempt too, but not a failure
            running = self.view.running.get((pn.name, visit))
            if (running.failures if running is not None else attempt - 1) + 1 \
                    >= retry.attempts:
                break
            delay = _backoff(retry.backoff, retry.max_backoff, retry.jitter, attempt)
            await self.commit([(L.NODE_RETRYING, {
                "node": pn.name, "visit": visit, "attempt": attempt,
                "error": outcome.error.to_json(), "duration_ms": outcome.duration_ms,
                "tokens": outcome.tokens or None, "delay_ms": round(delay * 1000, 3)})])
            if delay:
                await asyncio.sleep(delay)
            attempt += 1
            await self.commit([(L.NODE_STARTED, {"node": pn.name, "visit": visit,
                                                 "attempt": attempt})])
        return outcome

    async def _attempt(self, pn: PlanNode, visit: int, attempt: int) -> Outcome:
        fn = pn.fn
        assert fn is not None, "approval and agent nodes are not dispatched here"
        state = dict(self.view.state) if pn.reads is None else scoped(self.view.state, pn.reads)
        # a context only for a body that can use it (tokens, effects, confirmations)
        ctx = Context(self, pn.name, visit, attempt) if pn.needs_ctx else None
        t0 = time.perf_counter()
        error: RunError | None = None
        update: dict[str, Any] | None = None
        goto: str | None = None
        pause = None
        if ctx is not None:
            self.budget.enter(ctx)
        try:
            spent = self.budget.spent_already(ctx) if ctx is not None else None
            if spent is not None:
                raise spent  # the visit's own budget is gone (a resume after it failed)
            if pn.isolated:
                assert ctx is not None
                result = await self._isolated(pn, ctx, state)
            elif pn.is_async:
                result = await bounded(fn(state, ctx) if pn.wants_ctx else fn(state),
                                       pn.timeout, t0)
            else:
                result = await call_body(pn, fn, (state, ctx) if pn.wants_ctx else (state,))
            update, goto = self._check_result(pn, result)
        except PauseRequested as exc:
            pause = exc
        except NodeTimeout:
            error = timeout_error(pn)
        except SystemExit as exc:  # sys.exit() in a body: its failure, not the process's exit
            error = _node_error(pn, exc)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                # a cancellation asked for (the run's, a sibling's failure, a caller's): the
                # visit stopped, with what it had spent
                self._stopped_visit(pn.name, visit, attempt, ctx)
                raise
            # raised by the body itself (a library cancelling its own work): its failure,
            # not the run's cancellation -- the run would otherwise stop as RUNNING
            error = _node_error(pn, exc)
        except RunError as exc:
            error = exc
        except Exception as exc:  # the node's own failure: becomes its error record
            error = _node_error(pn, exc)
        finally:
            if ctx is not None:
                self.budget.leave(ctx)
        # milliseconds to the microsecond (round() to an int: round(x, 3) costs 10x more)
        duration = round((time.perf_counter() - t0) * 1e6) / 1000
        if ctx is None:
            return _new_outcome((pn.name, visit, attempt, update, goto, error, duration, 0,
                                 pause))
        if ctx._over is not None:  # crossed the budget, even if the node swallowed it
            error, update, goto = ctx._over, None, None
        return _new_outcome((pn.name, visit, attempt, update, goto, error, duration, ctx.tokens,
                             pause))

    async def _isolated(self, pn: PlanNode, ctx: Context, state: dict[str, Any]) -> Any:
        """The body in a worker process (`_isolation`), which enforces the timeout itself;
        raises TimeoutError, or NodeError for the body's or the process's failure."""
        assert pn.spec.call is not None
        if self._pool is None:
            self._pool = ProcessPool()
        res = await self._pool.call(pn.spec.call, state, ChildContext.of(ctx),
                                    timeout=pn.timeout, memory=pn.spec.memory,
                                    on_tokens=ctx.record_tokens, effects=Effects.of(self, ctx))
        return res.value(pn.name)

    def _check_result(self, pn: PlanNode, result: Any) -> tuple[dict[str, Any], str | None]:
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

    async def _finish(self, out: Outcome, *, alone: bool = False) -> None:
        """Stage a visit's outcome and decide its edges; the caller flushes them (one
        transaction, before any successor starts). A failure is committed at once and
        ends the run. ``alone``: nothing else ran while it did (so only a node that could
        have, by the graph, can conflict with its writes)."""
        if out.pause is not None:
            # the visit stays running; it is re-run once a human has decided
            await self.commit([(L.APPROVAL_REQUESTED, {
                "node": out.node, "visit": out.visit, "attempt": out.attempt, "kind": "tool",
                "key": out.pause.key, "show": L.to_json_value(out.pause.show),
                "decisions": ["approve", "reject"], "tokens": out.tokens or None,
                "approvers": _approvers(self.plan.nodes[out.node].spec)})])
            return
        if out.error is not None:
            await self.commit([(L.NODE_FAILED, {
                "node": out.node, "visit": out.visit, "attempt": out.attempt,
                "error": out.error.to_json(), "duration_ms": out.duration_ms,
                "tokens": out.tokens or None})])
            raise _Abort(out.error)
        conflict = self._write_conflict(out, overlap=not alone)
        if conflict is not None:
            await self.commit([(L.NODE_FAILED, {
                "node": out.node, "visit": out.visit, "attempt": out.attempt,
                "error": conflict.to_json(), "duration_ms": out.duration_ms})])
            raise _Abort(conflict)
        self._complete(out)

    def _complete(self, out: Outcome) -> None:
        """`_finish` for a visit that completed (no error, no pause, no write conflict)."""
        fields: dict[str, Any] = {"node": out.node, "visit": out.visit, "attempt": out.attempt,
                                  "duration_ms": out.duration_ms}
        if out.update:
            fields["update"] = out.update
        if out.goto is not None:
            fields["goto"] = out.goto
        if out.tokens:
            fields["tokens"] = out.tokens
        self.stage1(L.NODE_COMPLETED, fields)
        # decide this node's edges in the same batch: its completion and where the run
        # goes next are committed together
        self._decide_due()

    def _write_conflict(self, out: Outcome, *, overlap: bool) -> WriteConflictError | None:
        """A field without a reducer that another node wrote, which ran concurrently with
        this one (``overlap``: completed while this visit ran) or could have by the graph
        (SPEC §1: two nodes that *can* run concurrently) -- so that whether a run fails
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

    # -- edge decisions ----------------------------------------------------------------

    def _decide_due(self) -> Due | None:
        """Decide everything due, staging the edge records, until nothing is due.

        A completed node's edges are decided together (``otherwise`` needs its
        siblings); a settled join is decided on its own. Deciding may settle joins
        downstream, which makes them due in turn. Stops at a group with an ``async def``
        router whose answer is not in yet, and returns its due: the loop awaits the router
        (`_call_async_router`) and decides on.
        """
        due = self.view.due
        always_taken = self.plan.always_taken
        while due:
            first = next(iter(due.values()))
            source = first.source
            if source == "*" or len(due) == 1:
                group = [first]
            else:
                group = [d for d in due.values() if d.source == source]
            if source in always_taken:  # what `_decide_group` would find, without the work
                for d in group:
                    self.stage1(L.EDGE_TAKEN, {"edge": d.edge.index, "from": source,
                                               "to": list(d.edge.targets)})
                continue
            if self.plan.async_routers:
                for d in group:
                    if d.edge.router_async and (d.edge.index, d.source) not in self._routed:
                        return d
            for rtype, fields in self._decide_group(source, group):
                self.stage1(rtype, fields)
        return None

    def _decide_group(self, source: str, dues: list[Due]) -> list[tuple[str, dict[str, Any]]]:
        """Decide the edges of one completed node (or one settled join), in declaration order:
        ``when`` edges and the rest first, then ``otherwise`` edges."""
        scope = self._scope  # the names conditions read, looked up when read
        items: list[tuple[str, dict[str, Any]]] = []
        taken_any = False
        when_taken = False
        rejected = source in self.plan.approvals and self._rejected_gate(source)
        if len(dues) > 1 and source not in self.plan.in_decision_order:
            dues = sorted(dues, key=_decision_order)
        for due in dues:
            e = due.edge
            if rejected and not _reads_decision(e, source):
                # after a rejection only edges that read <gate>.decision are followed
                rec = self._edge_record(e, due.source, [], reason="rejected")
            elif e.otherwise:
                rec = self._edge_record(e, due.source, [] if when_taken else list(e.targets),
                                        expr="otherwise", value=not when_taken)
            else:
                rec = self._decide_edge(e, due, scope)
            taken = rec[0] == L.EDGE_TAKEN
            if taken and e.cond is not None:
                when_taken = True
            taken_any = taken_any or taken
            items.append(rec)
        if rejected and not taken_any:
            self.stage(items)
            gate = self.view.state.get(source) or {}
            raise _Rejected(source, f"approval {source!r} was rejected by "
                            f"{gate.get('by') or 'an anonymous decider'}"
                            + (f": {gate['comment']}" if gate.get("comment") else ""))
        stranded = [] if taken_any else self._stranded(source, dues)
        if stranded:
            explain = [_explain(d.edge, fields) for d, (_, fields) in zip(dues, items,
                                                                          strict=True)]
            where = "none of its outgoing edges was taken" if source != "*" else \
                f"the join {dues[0].edge.name()}, its last way on, was not taken"
            raise _Abort(NoRouteError(
                f"no route from {', '.join(map(repr, stranded))}: {where} -- "
                + "; ".join(explain)
                + f". Add an 'otherwise: true' edge from {stranded[0]!r} (or a switch "
                "default) to say where the run goes in that case",
                node=None if stranded == ["START"] else stranded[0], edges=explain))
        return items

    def _stranded(self, source: str, dues: list[Due]) -> list[str]:
        """Nodes this decision leaves with nowhere to go (no silent dead ends).

        A node's routes are its own edges, decided when it completes, and the joins it
        arrives at, decided when they settle. The last of these to be decided without
        any taken strands it. Checked before the decision is recorded, so a resume
        decides again (after a --set, say) rather than following a dead end.
        """
        view = self.view
        if not dues:
            return []
        if source != "*":
            if source == "START" or (view.route_wait[source] <= 0
                                     and not view.routed.get(source, False)):
                return [source]
            return []
        return [s for s in dues[0].arrived
                if view.route_wait[s] == 1 and not view.routed.get(s, False)
                and not any(k[1] == s for k in view.due)]

    def _rejected_gate(self, source: str) -> bool:
        pn = self.plan.nodes.get(source)
        if pn is None or not pn.gate or pn.spec.approval is None:
            return False
        record = self.view.state.get(source)
        return isinstance(record, dict) and record.get("decision") in ("rejected", "timed_out") \
            and record.get("reenter") is None

    def _decide_edge(self, e: PlanEdge, due: Due, scope: Scope) -> tuple[str, dict[str, Any]]:
        targets: list[str]
        expr: str | None = None
        value: Any = None
        reads: dict[str, Any] | None = None
        reason = None
        if e.kind == "plain":
            targets = list(e.targets)
            if e.cond is not None:
                expr = e.cond.source
                value, reads = self._eval(e, e.cond, scope)
                if not isinstance(value, bool):
                    raise _Abort(ExpressionError(
                        f"{_edge_location(self.plan, e)}edge {e.name()}: condition {expr!r} "
                        f"gave {value!r} "
                        f"({type(value).__name__}), not a boolean", node=_edge_node(e),
                        edge=e.index, expr=expr))
                if not value:
                    targets = []
        elif e.kind == "switch":
            assert e.switch is not None and e.spec.cases is not None
            expr = e.switch.source
            value, reads = self._eval(e, e.switch, scope)
            chosen = e.spec.cases.get(case_key(value), e.spec.default)
            targets = [chosen] if chosen is not None else []
        elif e.kind == "router":
            expr = e.spec.router
            value = self._route(e, due)
            targets = value
        else:  # choose
            expr = "goto"
            value = due.goto
            targets = [due.goto] if due.goto is not None else []
        if targets and e.max is not None and self.view.takes.get(e.index, 0) >= e.max:
            reason = f"max {e.max} reached"
            targets = []
        return self._edge_record(e, due.source, targets, expr=expr, value=value, reads=reads,
                                 reason=reason, arrived=due.arrived)

    def _edge_record(self, e: PlanEdge, source: str, targets: list[str], *,
                     expr: str | None = None, value: Any = None,
                     reads: dict[str, Any] | None = None, reason: str | None = None,
                     arrived: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
        # only the fields that have a value (the log writer would drop the others)
        fields: dict[str, Any] = {"edge": e.index, "from": source}
        if targets:
            fields["to"] = targets
        if expr is not None:
            fields["expr"] = expr
        if value is not None:
            fields["value"] = value if type(value) in _PLAIN_VALUES \
                or not (e.kind in ("switch", "router", "choose") or e.otherwise) \
                else L.to_json_value(value)
        if reads is not None:
            fields["reads"] = reads
        if reason is not None:
            fields["reason"] = reason
        if arrived:
            fields["arrived"] = list(arrived)
        return (L.EDGE_TAKEN if targets else L.EDGE_SKIPPED), fields

    def _eval(self, e: PlanEdge, expr: Any, scope: Scope) -> tuple[Any, dict[str, Any]]:
        """The expression's value and the values it read."""
        try:
            # an expression reading state fields alone takes the state itself: no lookups
            # through the scope
            return expr.decide(  # type: ignore[no-any-return]
                self.view.state if expr.state_only else scope)
        except EvaluationError as exc:
            loc = _edge_location(self.plan, e)
            raise _Abort(ExpressionError(
                f"{loc}edge {e.name()}: cannot evaluate {expr.source!r}: {exc}",
                node=_edge_node(e), edge=e.index, expr=expr.source)) from None

    async def _call_async_router(self, due: Due) -> None:
        """Await an ``async def`` router; `_route` takes its answer (or its exception)."""
        e = due.edge
        assert e.router is not None
        answer: Any
        try:
            answer = await e.router(dict(self.view.state))
        except Exception as exc:
            answer = _Raised(exc)
        self._routed[(e.index, due.source)] = answer

    def _route(self, e: PlanEdge, due: Due) -> list[str]:
        assert e.router is not None
        result: Any
        if e.router_async:
            result = self._routed.pop((e.index, due.source))
        else:
            try:
                result = e.router(dict(self.view.state))
            except Exception as exc:
                result = _Raised(exc)
        if isinstance(result, _Raised):
            raised = result.exc
            raise _Abort(RouteError(f"router {e.spec.router} of edge {e.name()} raised "
                                    f"{type(raised).__name__}: {raised}", node=_edge_node(e),
                                    edge=e.index))
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise _Abort(RouteError(
                f"router {e.spec.router} of edge {e.name()} returned an awaitable, not its "
                "targets: make it an `async def` function (interlock awaits those) or a "
                "plain function that returns the targets", node=_edge_node(e), edge=e.index))
        if not isinstance(result, str | list | tuple | set | frozenset) and result is not None:
            raise _Abort(RouteError(
                f"router {e.spec.router} returned {result!r} "
                f"({type(result).__name__}); edge {e.name()} declares to: "
                f"[{', '.join(e.targets)}] -- return one of those names (or END), or a list "
                "of them", node=_edge_node(e), edge=e.index))
        chosen = [result] if isinstance(result, str) else list(result or [])
        # SPEC §1: a router returns declared targets, or END (declared or not)
        bad = [c for c in chosen if c not in e.targets and c != END]
        if bad or any(not isinstance(c, str) for c in chosen):
            raise _Abort(RouteError(
                f"router {e.spec.router} returned {result!r}; edge {e.name()} declares "
                f"to: [{', '.join(e.targets)}] -- return one or more of those (or END), or "
                "add the target to the edge", node=_edge_node(e), edge=e.index))
        return list(dict.fromkeys(chosen))

    # -- effects and tokens (called from Context) ---------------------------------------

    def recorded_effect(self, ctx: Context, key: str) -> tuple[bool, Any]:
        k = (ctx.node, ctx.visit, key)
        if k in self.view.effects:
            return True, self.view.effects[k]
        return False, None

    async def record_effect(self, ctx: Context, key: str, result: Any) -> Any:
        value = L.to_json_value(result)
        # spent on it (and, unrecorded, before it in this attempt): committed with it
        tokens, ctx._unsaved = ctx._unsaved, 0
        await self.commit([(L.EFFECT_RECORDED, {"node": ctx.node, "visit": ctx.visit,
                                                "attempt": ctx.attempt, "key": key,
                                                "result": value, "tokens": tokens or None})])
        return value

    async def log_record(self, ctx: Context, rtype: str, fields: Mapping[str, Any]) -> None:
        if not _OWN_TYPE.match(rtype) or rtype.split(".")[0] in _ENGINE_NAMESPACES:
            raise UsageError(f"ctx.log: {rtype!r} is not a record type a node may write; use "
                             "a dotted name such as 'agent.reply' outside "
                             f"{', '.join(sorted(_ENGINE_NAMESPACES))}")
        data = dict(L.to_json_value(dict(fields)))
        data.update(node=ctx.node, visit=ctx.visit, attempt=ctx.attempt)
        await self.commit([(rtype, data)])

    def charge_tokens(self, ctx: Context, n: int) -> None:
        self.budget.charge(ctx, n)

    def confirmation(self, ctx: Context, key: str) -> str | None:
        return self.view.confirmations.get((ctx.node, ctx.visit, key))

    def effect_keys(self, node: str) -> list[str]:
        return [key for n, _, key in self.view.effects if n == node]


_PLAIN_VALUES = frozenset({bool, str, float})  # an edge's value JSON keeps as it is
_OWN_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_ENGINE_NAMESPACES = frozenset({"run", "node", "edge", "effect", "approval", "state"})


def _reads_decision(e: PlanEdge, gate: str) -> bool:
    exprs = [x for x in (e.cond, e.switch) if x is not None]
    return any(f"{gate}.decision" in x.paths for x in exprs)


def _edge_node(e: PlanEdge) -> str | None:
    """The node an edge's fault is reported at: its source (none for START or a join)."""
    return e.sources[0] if len(e.sources) == 1 and e.sources[0] != "START" else None


def _decision_order(due: Due) -> tuple[bool, int]:
    return due.edge.otherwise, due.edge.index


def _step_limit(limit: int, node: str) -> StepLimitError:
    why = "" if limit != DEFAULT_STEPS else (" (interlock's default when none is "
                                             "declared: declare limits: {steps: N} in the "
                                             "workflow)")
    return StepLimitError(
        f"the run reached limits.steps={limit} node executions{why} before {node!r} could "
        "start; raise the limit (--set limits.steps=N) if the loop is expected to run "
        "longer", node=node)


def _approvers(ns: Any) -> list[str] | None:
    return list(ns.approval.approvers) if ns.approval is not None and ns.approval.approvers \
        else None


def _explain(e: PlanEdge, fields: dict[str, Any]) -> str:
    what = fields.get("expr")
    value = fields.get("value")
    reason = fields.get("reason")
    s = f"{e.name()}"
    if what:  # the value as the log and the trace show it (true, not True)
        s += f" [{what} = {L.dumps(value).decode()}]"
    if reason:
        s += f" ({reason})"
    return s


def _edge_location(plan: Plan, e: PlanEdge) -> str:
    from ._spec import locate

    loc = locate(plan.spec, ("edges", e.index))
    return f"{loc}: " if loc.line is not None else ""


def _retryable(error: RunError, names: list[str]) -> bool:
    if isinstance(error, (RouteError, WriteConflictError, BudgetExceededError)):
        return False
    if not names:
        return True
    exc_name = error.details.get("exception")
    mro = error.details.get("mro") or [exc_name]
    return any(n in names for n in mro if n)


def _backoff(base: float, cap: float | None, jitter: bool, attempt: int) -> float:
    delay = base * (2 ** (attempt - 1))
    if cap is not None:
        delay = min(delay, cap)
    if jitter and delay:
        delay = random.uniform(0, delay)
    return float(delay)


def _node_error(pn: PlanNode, exc: BaseException) -> NodeError:
    text = str(exc)
    own = f"node {pn.name!r}: "
    if text.startswith(own):  # an error of interlock's own (an agent's) names the node too
        text = text[len(own):]
    return NodeError(f"node {pn.name!r} raised {type(exc).__name__}: {text}", node=pn.name,
                     exception=type(exc).__name__, mro=[c.__name__ for c in type(exc).__mro__],
                     traceback=_short_tb(exc))


def _short_tb(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6)
    return "".join(lines)[-4000:]


__all__ = ["InterlockError", "Runner"]
