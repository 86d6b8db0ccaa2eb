"""The scheduler: drives one run -- starts ready nodes, has their edges decided, and
hands every record to its sink (`_records.Sink`; the `_journal.Journal` stores them).
It never touches the store; the node call (`_call`, with the guards of `_guards`) and
the edge decisions (`_decide`) are modules of their own.

A visit of a node goes through these states (each arrow a record)::

    ready --node.started--> started --(its task runs, or it runs inline)--> running attempt
    running attempt --node.completed--> completed      (its edges decided in the same batch)
                    --node.failed-----> failed         (the run fails: run.failed)
                    --node.retrying---> retrying --node.started--> running attempt
                    --approval.requested--> paused for a human (run.waiting; re-run
                                            from the top, attempt + 1, once decided)
                    --node.failed (cancelled)--> stopped (the run was cancelled, or a
                                            sibling failed; it runs again on resume)

A gate (an approval, a ``confirm: true`` node) goes from started to paused for a human
without running. The loop, with what holds after each step::

    loop:
        decide every due edge         -> edge records staged and flushed; view.due empty
        start every ready node        -> node.started staged (not yet flushed); gates'
                                         approval.requested staged; each body has a task,
                                         or is the one run inline
        run the inline node           -> its node.completed and edge decisions staged,
                                         then flushed
        if nothing runs: finish       -> run.completed (or run.waiting) committed
        wait for one visit to finish  -> its outcome and its edge decisions (and those of
                                         every visit finished by then) flushed, one batch

Records are sealed and folded into the `RunView` when staged, and stored when flushed:
so the view runs ahead of the store by what is staged, and what holds is that nothing
that depends on a staged record starts before the flush that stores it (a node starts
only after the decisions that made it ready are flushed; ``node.started`` itself rides
with the next flush, and a crash before it only loses the fact that the visit had
started -- it starts again with the same visit number, as a resume does).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .. import _log as L
from .._definition import _expr
from .._definition._model import DEFAULT_STEPS
from .._definition._plan import Plan, PlanNode
from .._errors import InterlockError, InternalError, RunError, StepLimitError, UnknownOutcome
from .._json import JSONObject
from . import _records as R
from ._approvals import close_others, offered, requested
from ._call import NodeCall
from ._decide import Abort, Decider, Rejected
from ._finish import complete, finish
from ._fold import RunView
from ._gates import waiting_object
from ._guards import Outcome
from ._journal import StoreOutage
from ._mapped import run_items

log = logging.getLogger("interlock")

YIELD_EVERY = 64  # inline visits between two turns given to the event loop


class Stop(Protocol):
    """What `Runner.stop` is read through: an `asyncio.Event`, say."""

    def is_set(self) -> bool: ...


class Runner:
    """Executes one run of ``plan`` whose records go to ``sink`` (folded into ``view``)."""

    inline = True  # a node alone runs in the loop's own task (tests turn it off)

    def __init__(self, plan: Plan, sink: R.Sink, run_id: str, view: RunView) -> None:
        self.plan = plan
        self.sink = sink
        self.run_id = run_id
        self.view = view
        self.inline = self.inline  # (the class's, read faster from the instance)
        self.calls = NodeCall(plan, view, sink, run_id)
        self.decide = Decider(plan, view, sink)
        # outcomes of visits run as tasks -- or what one raised, for the loop to raise
        self._done: asyncio.Queue[Outcome | BaseException] | None = None
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.cancelled_by: dict[str, Any] | None = None  # set by drive()'s cancel watcher
        # set (``stop.is_set()``) to stop at the next node boundary: the visits in flight
        # finish and are committed, no other starts, and the run is left RUNNING (a
        # worker's drain on SIGTERM; whoever claims the run next continues it)
        self.stop: Stop | None = None
        # the decisions offered for this run's gates by other processes while it executes
        # (`Store.offer_decision`), read when it would otherwise wait: set by its driver
        self.offers: Callable[[], Awaitable[dict[str, dict[str, Any]]]] | None = None
        self._asked = False  # a gate's request staged, not flushed yet

    async def execute(self) -> None:
        """Run the loop until the run ends or waits; its last record is committed."""
        try:
            try:
                await self._loop()
            finally:
                await _stop_tasks(self._tasks, self.calls)
                await self.calls.close()
        except Abort as abort:
            self.sink.add(R.run_failed(abort.error.to_json(), abort.error.node))
        except Rejected as rej:
            for item in close_others(self.view, None, f"not needed: the run was rejected at "
                                     f"{rej.node!r}", rej.by):
                self.sink.add(item)
            self.sink.add(R.run_rejected(rej.node, rej.message))
        except StoreOutage as outage:  # the store failed under a node's ``ctx.once``
            raise outage.error from outage.error.__cause__
        except InterlockError:
            raise  # the store's (or a misuse): the caller's to see, as it was
        except Exception as exc:  # a bug (ours, or a plug-in's): the run fails, recorded
            log.error("run %s stopped on an unexpected error", self.run_id, exc_info=True)
            bug = InternalError(f"the run stopped on an unexpected {type(exc).__name__}: {exc}")
            self.sink.add(R.run_failed({"type": "internal_error", "node": None,
                                        "message": str(bug)}, None))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.cancelled_by is None or task is None:
                raise  # not ours: the caller is being cancelled
            task.uncancel()
            self.sink.add(R.run_cancelled(self.cancelled_by.get("by")))
        await self.sink.flush()

    async def _loop(self) -> None:
        view, sink, calls, decide = self.view, self.sink, self.calls, self.decide
        when = decide.when  # (a bound method made once)
        self._restart_running()
        inline_steps = 0
        heavy_seen = _expr.heavy
        stop = self.stop
        while True:
            if view.due:
                while (waiting := decide.due()) is not None:
                    await decide.call_async_router(waiting)  # then decide on
                await sink.flush()
            if view.ready and (stop is None or not stop.is_set()):
                inline = self._start_ready()
                if inline is not None:
                    # one node and nothing else in flight: await it here, no task needed
                    pn, visit = inline
                    stack = calls.stacks[pn.guards]  # (`calls.stack(pn)`, one call less)
                    assert stack is not None
                    outcome = await stack(calls.begin(pn, visit, 1))
                    if outcome.error is None and outcome.pause is None and not pn.branched:
                        if outcome.goto is None and not outcome.tokens:  # (no coroutine)
                            # `complete(decide, outcome)`, R.node_completed inlined (`_records`)
                            fields: JSONObject = {
                                "node": outcome.node, "visit": outcome.visit,
                                "attempt": outcome.attempt, "duration_ms": outcome.duration_ms}
                            if outcome.update:
                                fields["update"] = outcome.update
                            sink.visited(fields, when)  # (node.visited: `_staging`)
                            if view.due:  # its edges, in the same batch (none left when
                                decide.due()  # the fold took them, or its record carries one)
                        else:
                            complete(decide, outcome)
                    else:
                        await finish(calls, decide, outcome, alone=True)
                    await sink.flush()
                    inline_steps += 1
                    if inline_steps % YIELD_EVERY == 0 or _expr.heavy != heavy_seen:
                        heavy_seen = _expr.heavy  # a costly condition (up to ~100 ms) ran:
                        # nodes that never wait (and a store that never waits) would
                        # otherwise hold the event loop for the whole run
                        await asyncio.sleep(0)
                    continue
            if not self._tasks:
                if view.ready and stop is not None and stop.is_set():  # for the next
                    log.info("run %s stopped at a node boundary; it is continued when "
                             "next claimed", self.run_id)
                    return
                if await self._end():
                    return
                continue
            await self._collect()

    def _restart_running(self) -> None:
        """Visits that were running when the previous process stopped run again; a gate
        still waiting for its human stays waiting; a confirmed node's body starts."""
        for key in list(self.view.running):
            self._restart(key)

    def _restart(self, key: tuple[str, int]) -> None:
        """`_restart_running` for one visit (or a visit a decision folded in continues)."""
        view = self.view
        v = view.running[key]
        gate = view.gates.get(key)
        if gate is not None and gate.decision is None:
            return
        if gate is not None and gate.kind == "unknown_outcome" \
                and gate.decision == "rejected":  # recorded as not done: it failed
            self._start_failed(v.node, v.visit, v.attempt, UnknownOutcome(
                f"{v.node!r} was approved and started (attempt {v.attempt}) but its "
                "outcome is unknown (the process running it stopped); a person recorded "
                "it as not done (rejected at its unknown_outcome gate)", node=v.node))
            return
        first_body = gate is not None and gate.kind == "confirm" and not gate.body_started
        self._start_task(v.node, v.visit, 1 if first_body else v.attempt + 1, rerun=True)

    async def _end(self) -> bool:
        """Nothing runs and nothing is ready: the run completed, or waits for a human --
        unless a decision offered meanwhile (another process's) continues it: False."""
        view = self.view
        if view.idle:
            await self.sink.commit([R.run_completed()])
            return True
        if view.due or view.ready:
            return False  # a decision folded in while the loop awaited: go on
        pending = view.pending_gates()
        if pending and await self.fold_offers():
            return view.status in ("REJECTED", "COMPLETED", "CANCELLED")
        if pending and not view.ready and not view.due:
            first = waiting_object(pending)
            await self.sink.commit([R.run_waiting(first, first["node"])])
            return True
        raise Abort(RunError("the run stopped with work left over -- this is a bug "
                             "in interlock, please report it with the trace"))

    async def fold_offers(self, offers: dict[str, dict[str, Any]] | None = None) -> bool:
        """Fold in the decisions offered for this run's waiting gates (a decision
        made while this process executes the run; ``offers``: those read already, else
        read here): their records committed, the bodies they let run started. Whether any
        was folded in. A rejection that ends the run while other visits run raises
        `Rejected` (the loop stops them first)."""
        view = self.view
        if not view.pending_gates():
            return False
        if offers is None:
            if self.offers is None:
                return False
            offers = await self.offers()
        items = offered(self.plan.spec, view, offers) if offers else []
        if not items:
            return False
        ending = [fields for t, fields in items if t == L.RUN_REJECTED]
        if ending and self._tasks:
            await self.sink.commit([i for i in items if i[0] != L.RUN_REJECTED])
            raise Rejected.ending(items)
        await self.sink.commit(items)
        for rtype, fields in items:
            key = (str(fields.get("node")), int(fields.get("visit") or 0))
            if rtype == L.APPROVAL_DECIDED and fields.get("decision") != "closed":
                self.calls.wake(key)  # a mapped visit's task: its decided item goes on
                if key in view.running and key not in self._tasks:
                    self._restart(key)  # an approved body, a node that asked, a rejected action
        return True

    def offer(self, offers: dict[str, dict[str, Any]]) -> None:
        """Hand decisions offered for this run (read by its watcher) to the loop, which
        folds them in (`fold_offers`) when it next looks."""
        gates = self.view.pending_gates()
        if self._done is None or not self._tasks or not gates:
            return
        waiting = {(g.node, g.visit, g.key, g.requested_at) for g in gates}
        if any((d.get("node"), d.get("visit"), d.get("key"), d.get("requested_at")) in waiting
               for d in offers.values()):
            self._done.put_nowait(_Offers(offers))

    async def _collect(self) -> None:
        """Wait for a visit to finish; take every other one that has finished too (a
        fan-out's branches often end together) and commit them in one batch."""
        done = self._done
        assert done is not None
        if self._asked:  # a gate asked (`_start_ready`): committed before the wait, so
            self._asked = False  # the run shows WAITING_APPROVAL now (`_gates.shown`)
            await self.sink.flush()
        outcome = await done.get()
        while True:
            if isinstance(outcome, _Offers):  # decisions offered: fold them in
                await self.fold_offers(outcome.offers)
                if done.empty():
                    break
                outcome = done.get_nowait()
                continue
            if not isinstance(outcome, Outcome):
                raise outcome  # a visit raised (the store failed, a bug): the run's error
            self._tasks.pop((outcome.node, outcome.visit), None)
            if await finish(self.calls, self.decide, outcome):  # an item decided meanwhile
                self._restart((outcome.node, outcome.visit))
            if done.empty():
                break
            outcome = done.get_nowait()
        await self.sink.flush()

    # -- starting visits ----------------------------------------------------------------

    def _start_ready(self) -> tuple[PlanNode, int] | None:
        """Start every ready node; return the one to run inline when it is alone."""
        view = self.view
        # (inline: not while a gate waits -- a decision offered meanwhile wakes the loop
        # only while it waits for tasks, `offer`)
        if len(view.ready) == 1 and not self._tasks and self.inline and not view.gates:
            # the common step of a chain or a loop: one node, nothing else in flight
            node = view.ready[0]
            pn = self.plan.nodes[node]
            if not pn.gate and pn.mapped is None:
                limit = view.limits.get("steps")
                if limit is not None and view.steps >= limit:
                    raise Abort(_step_limit(limit, node))
                visit = view.started.get(node, 0) + 1
                # R.node_started(node, visit, 1) -- deferred in a format-2 run: one
                self.sink.defer(node, visit)  # node.visited if it never waits (`_staging`)
                return pn, visit
        recs = self.sink.stage([R.node_started(n, vis, 1) for n, vis in _next_visits(self.view)])
        gates = [rec for rec in recs if self._is_gate(rec["node"])]
        if gates:
            nodes, state = self.plan.nodes, self.view.state
            self.sink.stage([requested(rec["node"], nodes[rec["node"]].spec, rec["visit"], state)
                             for rec in gates])
            self._asked = True
        # node.started is not flushed on its own: it goes with the next commit (a
        # completion, an effect, a retry). A crash before that loses only the fact
        # that the visit had started, so it starts again -- with the same visit
        # number and idempotency key -- which is what a resume does anyway.
        bodies = [rec for rec in recs if not self._is_gate(rec["node"])]
        if len(bodies) == 1 and not self._tasks and self.inline and not view.gates:
            pn = self.plan.nodes[bodies[0]["node"]]
            if pn.mapped is None:  # (a mapped node's items run in a task of their own)
                return pn, bodies[0]["visit"]
        for rec in bodies:
            self._start_task(rec["node"], rec["visit"], 1, rerun=False)
        return None

    def _is_gate(self, node: str) -> bool:
        pn = self.plan.nodes[node]
        return pn.gate and pn.mapped is None  # (a mapped gate's items ask: `run_items`)

    def _start_task(self, node: str, visit: int, attempt: int, *, rerun: bool) -> None:
        if self._done is None:
            self._done = asyncio.Queue()
        pn = self.plan.nodes[node]
        task = asyncio.get_running_loop().create_task(
            self._run_visit(pn, visit, attempt, rerun), name=f"interlock:{node}:{visit}")
        self._tasks[(node, visit)] = task

    def _start_failed(self, node: str, visit: int, attempt: int, error: RunError) -> None:
        """A visit whose outcome is a failure known without running it (an unknown
        outcome recorded as not done): handed to the loop as a finished task's."""
        if self._done is None:
            self._done = asyncio.Queue()
        done = self._done

        async def fail() -> None:
            done.put_nowait(Outcome(node, visit, attempt, error=error))

        self._tasks[(node, visit)] = asyncio.get_running_loop().create_task(
            fail(), name=f"interlock:{node}:{visit}")

    async def _run_visit(self, pn: PlanNode, visit: int, attempt: int, rerun: bool) -> None:
        """A visit as a task: run it and report the outcome to the loop -- or what it
        raised (the store refusing a record, a bug), which the loop raises: the loop
        waits for something from every task, so a task must never end without a word.
        Only a cancellation (the loop's own, `_stop_tasks`) ends it silently."""
        done = self._done
        assert done is not None
        try:
            if pn.mapped is not None:  # its items (those not completed, on a re-run)
                outcome: Outcome | BaseException = await run_items(self.calls, pn, visit)
            else:
                outcome = await self.calls.visit(pn, visit, attempt, rerun=rerun)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the loop, which raises it
            outcome = _leaf(exc)
        done.put_nowait(outcome)


class _Offers(BaseException):
    """Decisions offered for the run, put in the outcomes' queue by its watcher."""

    def __init__(self, offers: dict[str, dict[str, Any]]) -> None:
        super().__init__("offers")
        self.offers = offers


async def _stop_tasks(tasks_by_key: dict[tuple[str, int], asyncio.Task[None]],
                      calls: NodeCall) -> None:
    """Cancel visits still in flight (a sibling failed, the run was cancelled).

    Their tokens were spent: each gets a ``node.failed`` record saying so, and
    runs again on resume.
    """
    running = calls.view.running
    tasks = list(tasks_by_key.items())
    for _, t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
    tasks_by_key.clear()
    for key, _ in tasks:  # those not stopped inside their body (a retry's backoff, ...)
        if (*key, None) not in calls.stopped:
            visit = running.get(key)
            calls.stop(key[0], key[1], visit.attempt if visit else None, None)


def _next_visits(view: RunView) -> list[tuple[str, int]]:
    """Each ready node and the number of the visit it starts (within the step limit)."""
    items: list[tuple[str, int]] = []
    handed: Counter[str] = Counter()
    steps_limit = view.limits.get("steps")
    count = view.steps
    for node in list(view.ready):
        if steps_limit is not None and count >= steps_limit:
            raise Abort(_step_limit(steps_limit, node))
        count += 1
        handed[node] += 1
        items.append((node, view.started[node] + handed[node]))
    return items


def _leaf(exc: BaseException) -> BaseException:
    """The error in a group raised by a task group (a mapped node's items): the store's
    outage first, else the first one."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    outage = exc.subgroup(StoreOutage)
    found: BaseException = outage if outage is not None else exc
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


def _step_limit(limit: int, node: str) -> StepLimitError:
    why = "" if limit != DEFAULT_STEPS else (" (interlock's default when none is "
                                             "declared: declare limits: {steps: N} in the "
                                             "workflow)")
    return StepLimitError(
        f"the run reached limits.steps={limit} node executions{why} before {node!r} could "
        "start; raise the limit (--set limits.steps=N) if the loop is expected to run "
        "longer", node=node)


__all__ = ["InterlockError", "Runner"]
