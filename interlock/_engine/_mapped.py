"""A mapped node's visit (``map:``): its items, each an attempt through the node's
guard stack, at most ``max_concurrency`` at a time.

The map edge's decision recorded the list (``edge.taken`` with the items as its
``value``); the visit's ``node.started`` made it a `_fold.MapRun`. Each item then has
records of its own -- ``node.started``, ``node.completed`` (its update, not merged yet),
``node.retrying``, ``node.failed`` -- with its index as ``item``, and its completion is
committed before this returns. When every item has completed the scheduler records the
visit's ``node.completed`` with ``items`` (`_records.map_completed`), at which the fold
merges the items' updates in item order (or collects them) and the node's edges are
decided once. A resume runs only the items that had not completed. One item failing
(after its retries) fails the visit: the items still running are cancelled, each
recorded as such, the gates of items still waiting are closed, and the visit's outcome
is that item's error.

Items that wait for people (each on its own, gate ``NODE[i]``; what a decision
on one becomes: `_item_gates`):

- a mapped approval: every item asks at once (`_ask_items`); a decision completes it;
- a mapped ``confirm: true`` node: every item asks first; an approved item's body runs
  at once, its start committed before it runs (a crash then leaves an unknown outcome,
  asked about again on resume, never run again unasked);
- a mapped sub-workflow: an item whose child run waits records the child's gate as its
  own (``NODE[i]/child_gate``, kind ``workflow``); once decided in the child, the item
  runs again and continues its child.

The visit's task dispatches the items that can go on (`_dispatch`); one waiting for a
decision is parked. A decision folded in while the task runs wakes it (`NodeCall.wake`)
and a parked item goes on at once; the task ends when nothing it started runs and the
rest wait (`ItemsWaiting`: the visit stays running; the scheduler starts it again when
a decision lets an item go on).
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import perf_counter

from .. import _log as L
from .._definition._edge import MAP_CONCURRENCY
from .._definition._plan import PlanNode
from .._errors import NodeError, RunError, StepLimitError, UnknownOutcome, WriteConflictError
from .._json import JSONObject
from . import _records as R
from ._approvals import approvers, requested
from ._call import NodeCall
from ._context import PauseRequested
from ._fold import RunView
from ._guards import Call, Outcome, new_outcome
from ._view import gate_key


class ItemsWaiting(PauseRequested):
    """The outcome's ``pause`` of a mapped gate's visit whose items wait for people
    (each item waits on its own): the visit stays running; each item's decision
    completes it, and the visit completes when every item has (`run_items` again)."""

    def __init__(self) -> None:
        super().__init__("items", {})


class _ItemFailed(Exception):
    def __init__(self, error: RunError) -> None:
        self.error = error


async def run_items(calls: NodeCall, pn: PlanNode, visit: int) -> Outcome:
    """Run the items of ``pn``'s visit that can go on; the visit's outcome (`ItemsWaiting`
    while some wait for people). Never raises Exception (a cancellation of the run
    propagates)."""
    view = calls.view
    edge = pn.mapped
    assert edge is not None
    m = view.maps[(pn.name, visit)]
    if pn.spec.approval is not None:  # a mapped approval: each item asks a person
        return await _ask_items(calls, pn, visit)
    t0 = perf_counter()
    if pn.spec.confirm:  # each item asks first (those not asked yet, or asked again)
        await _ask_confirms(calls, pn, visit)
    limit = edge.spec.max_concurrency or MAP_CONCURRENCY
    if pn.spec.confirm or pn.spec.workflow is not None:  # its items can wait for people
        error = await _dispatch(calls, pn, visit, limit)
    else:
        error = await _run_all(calls, pn, visit, limit)
    written: JSONObject | None = None
    pause: PauseRequested | None = None
    if error is not None:
        # the visit fails: the items still waiting are not asked any more (asked again if
        # the visit runs again -- a resume of the failed run)
        await calls.sink.commit(_close_items(view, pn.name, visit, error))
    elif len(m.done) < len(m.items):
        pause = ItemsWaiting()
    else:
        error = _shared_writes(calls, pn, m.done)
        # the fields the visit writes, for the scheduler's write-conflict check against
        # other branches (the values are the fold's to merge, from the items' records)
        written = {edge.spec.collect: None} if edge.spec.collect is not None else \
            dict.fromkeys(k for update in m.done.values() for k in update)
    duration = round((perf_counter() - t0) * 1e6) / 1000
    return new_outcome((pn.name, visit, 1, written, None, error, duration, 0, pause))


async def _run_all(calls: NodeCall, pn: PlanNode, visit: int, limit: int) -> RunError | None:
    """`_dispatch` for items that never wait (a call or an agent node): ``limit`` workers
    share one iterator over the items not completed (each item taken by one worker).
    None, or the error of the first item that failed (the others are cancelled)."""
    m = calls.view.maps[(pn.name, visit)]
    todo = iter([i for i in range(len(m.items)) if i not in m.done])
    stack = calls.stack(pn)

    async def worker() -> None:
        for i in todo:
            await _run_item(calls, pn, visit, stack, i)

    error: RunError | None = None
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(limit, len(m.items) - len(m.done))):
                group.create_task(worker())
    except* _ItemFailed as failed:
        # the task group cancelled the other items: each records its own node.failed
        # (cancelled) through the guards, and runs again if the run is resumed
        error = _first(failed)
    return error


def can_go_on(view: RunView, node: str, visit: int, item: int) -> bool:
    """Whether item ``item`` of ``node``'s visit may run now: not completed, and not
    waiting for a decision (its gate, if it has one, decided -- and not closed)."""
    m = view.maps.get((node, visit))
    if m is None or item in m.done:
        return False
    gate = view.gates.get(gate_key(node, visit, item)) if view.gates else None
    if gate is None:  # (a confirm: true item always has one: it asked first)
        return not view.plan.nodes[node].spec.confirm
    return gate.decision is not None and gate.decision != "closed"


def items_to_go_on(view: RunView, node: str, visit: int) -> bool:
    """Whether a visit whose items waited has one a decision lets go on now (folded in
    after its task last looked): the scheduler starts the visit's task again."""
    m = view.maps.get((node, visit))
    return m is not None and any(can_go_on(view, node, visit, i) for i in m.running)


async def _dispatch(calls: NodeCall, pn: PlanNode, visit: int, limit: int) -> RunError | None:
    """Run the items that can go on, at most ``limit`` at a time, in item order; park
    those that wait, and look again when a decision is folded in (``wake``). Returns when
    nothing started here runs and nothing else can go on: None, or the error of the first
    item that failed (the others are cancelled, each recording its own ``node.failed``)."""
    view, node = calls.view, pn.name
    m = view.maps[(node, visit)]
    stack = calls.stack(pn)
    # the fold's ``m.done``: on a re-run, the items completed in the log do not run again
    todo = deque(i for i in range(len(m.items)) if i not in m.done)
    parked: list[int] = []
    running: dict[asyncio.Future[object], int] = {}
    wake = calls.waker((node, visit))
    # What holds at the top of each turn: every item not completed is in exactly one of
    # ``todo`` (to look at), ``parked`` (waiting for a decision when last looked at) and
    # ``running``; an item is started only after `can_go_on` said so against the view as
    # it is now, so an item waiting for a person never starts, and one decided while
    # parked starts at the next turn after the wake (the scheduler folds a decision in
    # between two of this task's awaits: the view never changes under a check).
    try:
        while True:
            if wake.is_set():  # a decision was folded in: the parked items look again
                wake.clear()
                todo.extendleft(sorted(parked, reverse=True))
                parked.clear()
            while todo and len(running) < limit:
                i = todo.popleft()
                if can_go_on(view, node, visit, i):
                    running[asyncio.create_task(_run_item(calls, pn, visit, stack, i))] = i
                elif i not in m.done:
                    parked.append(i)
            if not running:
                if wake.is_set():  # decided while the last items ran: look again
                    continue
                # nothing runs and the rest wait: the visit's task ends here; a decision
                # folded in from now on restarts it (`items_to_go_on`, the scheduler's)
                return None
            woken: asyncio.Future[object] = asyncio.ensure_future(wake.wait())
            try:
                done, _ = await asyncio.wait([*running, woken],
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
            for task in done:
                if task is woken:
                    continue
                i = running.pop(task)
                exc = task.exception()
                if isinstance(exc, _ItemFailed):
                    return exc.error
                if exc is not None:
                    raise exc  # the store's, a bug: the run's error (`_runner._leaf`)
                if i not in m.done:
                    parked.append(i)  # it waits now (a child run's gate)
    finally:
        calls.wakers.pop((node, visit), None)
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def _close_items(view: RunView, node: str, visit: int, error: RunError) -> list[R.Item]:
    """``approval.decided`` ``closed`` for the item gates of ``node``'s visit still
    waiting: an item failed, and the visit with it."""
    why = f"not needed: item {error.details.get('item')} of {node!r} failed"
    return [(L.APPROVAL_DECIDED, {"node": g.node, "visit": g.visit, "kind": g.kind,
                                  "decision": "closed", "by": None, "comment": why,
                                  "key": g.key, "item": g.item})
            for g in view.pending_gates()
            if g.node == node and g.visit == visit and g.item is not None]


async def _ask_confirms(calls: NodeCall, pn: PlanNode, visit: int) -> None:
    """A mapped ``confirm: true`` node's items that have not asked (or whose gate was
    closed): each asks, one gate per item; its body runs once approved."""
    view = calls.view
    edge = pn.mapped
    assert edge is not None
    m = view.maps[(pn.name, visit)]
    recs: list[R.Item] = []
    for i in range(len(m.items)):
        gate = view.gates.get(gate_key(pn.name, visit, i))
        if i in m.done or (gate is not None and gate.decision != "closed"):
            continue
        running = m.running.get(i)
        recs.append(R.node_started(pn.name, visit, 1 if running is None
                                   else running.attempt + 1, i))
        recs.append(requested(pn.name, pn.spec, visit, view.state, item=i,
                              value=m.items[i], as_name=edge.spec.item_name))
    if recs:
        await calls.sink.commit(recs)


async def _ask_items(calls: NodeCall, pn: PlanNode, visit: int) -> Outcome:
    """A mapped gate's visit: a request for each item not asked yet; it waits until every
    item has its decision."""
    view, sink = calls.view, calls.sink
    edge = pn.mapped
    assert edge is not None
    m = view.maps[(pn.name, visit)]
    t0 = perf_counter()
    asked = [i for i in range(len(m.items))
             if i not in m.done and gate_key(pn.name, visit, i) not in view.gates]
    if asked:
        as_name = edge.spec.as_ or "item"
        recs = []
        for i in asked:
            recs.append(R.node_started(pn.name, visit, 1, i))
            recs.append(requested(pn.name, pn.spec, visit, view.state, item=i,
                                  value=m.items[i], as_name=as_name))
        await sink.commit(recs)
    duration = round((perf_counter() - t0) * 1e6) / 1000
    if len(m.done) < len(m.items):
        return new_outcome((pn.name, visit, 1, None, None, None, duration, 0,
                            ItemsWaiting()))
    collect = edge.spec.collect
    return new_outcome((pn.name, visit, 1, {collect: None} if collect else {}, None, None,
                        duration, 0, None))


async def _run_item(calls: NodeCall, pn: PlanNode, visit: int, stack: Call, i: int) -> None:
    """One item's attempt through the guard stack; raises `_ItemFailed` if it failed.
    Returns when it completed, or when it waits (a child run's gate: recorded)."""
    view, sink = calls.view, calls.sink
    m = view.maps[(pn.name, visit)]
    running = m.running.get(i)
    gate = view.gates.get(gate_key(pn.name, visit, i)) if view.gates else None
    if running is None:  # a new item: a step (a re-run after a resume is not one)
        limit = view.limits.get("steps")
        if limit is not None and view.steps >= limit:
            raise _ItemFailed(_step_limit(limit, pn, i))
    elif gate is not None and gate.kind == "unknown_outcome" and gate.decision == "rejected":
        # recorded as not done: the item failed (the map's error edges apply)
        raise _ItemFailed(await _failed(calls, pn, visit, i, running.attempt, UnknownOutcome(
            f"item {i} of {pn.name!r} was approved and started (attempt {running.attempt}) "
            "but its outcome is unknown (the process running it stopped); a person "
            "recorded it as not done (rejected at its unknown_outcome gate)",
            node=pn.name), 0.0, 0))
    action = gate is not None and gate.kind in ("confirm", "unknown_outcome")
    attempt = 1 if running is None else running.attempt + 1
    if action:  # an approved action's start is committed before it runs
        await sink.commit([R.node_started(pn.name, visit, attempt, i)])
    else:
        sink.add(R.node_started(pn.name, visit, attempt, i))
    out = await stack(calls.begin(pn, visit, attempt, i))
    error = out.error
    if error is None and out.pause is not None:
        if out.pause.path is not None:  # its child run waits: so does the item
            await sink.commit([_child_waits(pn, visit, i, out)])
            return
        error = NodeError(f"node {pn.name!r} asked a human from inside its body "
                          "(ctx.confirm, or a guarded tool); an item of a mapped node can "
                          "wait only at the node's own gate (an approval node, a confirm: "
                          "true node) or at a gate of its sub-workflow's child run: make "
                          "the node confirm: true, or confirm before or after the map",
                          node=pn.name)
    if error is not None:
        raise _ItemFailed(await _failed(calls, pn, visit, i, out.attempt, error,
                                        out.duration_ms, out.tokens))
    # committed now, not with the visit: a crash later keeps this item's work
    sink.add(R.node_completed(pn.name, visit, out.attempt, out.duration_ms, out.update,
                              None, out.tokens, i))
    await sink.flush()


async def _failed(calls: NodeCall, pn: PlanNode, visit: int, i: int, attempt: int,
                  error: RunError, duration_ms: float, tokens: int) -> RunError:
    """Commit item ``i``'s ``node.failed``; its error, saying which item it was."""
    m = calls.view.maps[(pn.name, visit)]
    error.details["item"] = i
    error.message = f"{error.message} (item {i}, counting from 0, of {len(m.items)})"
    await calls.sink.commit([R.node_failed(pn.name, visit, attempt, error.to_json(),
                                           duration_ms, tokens, i)])
    return error


def _child_waits(pn: PlanNode, visit: int, i: int, out: Outcome) -> R.Item:
    """``approval.requested`` for item ``i`` whose child run waits at a gate: the child's
    gate, as the item's (``NODE[i]/child_gate``); decided in the child."""
    pause = out.pause
    assert pause is not None and pause.path is not None
    below = pause.path.split("/", 1)[1]
    # every gate the child waits at, named by its path through this item
    pending = [{**g, "node": f"{pn.name}[{i}]/{str(g.get('node')).split('/', 1)[-1]}"}
               for g in pause.pending or ()]
    fields: dict[str, object] = {
        "node": pn.name, "visit": visit, "attempt": out.attempt, "kind": "workflow",
        "key": pause.key, "show": L.to_json_value(pause.show),
        "path": f"{pn.name}[{i}]/{below}", "decisions": list(pause.decisions),
        "tokens": out.tokens or None, "child_kind": pause.kind,
        "pending": L.to_json_value(pending) if pending else None,
        "approvers": approvers(pn.spec), "item": i}
    if pause.edit is not None:
        fields["input"] = L.to_json_value(pause.edit)
    return (L.APPROVAL_REQUESTED, fields)


def _step_limit(limit: int, pn: PlanNode, i: int) -> StepLimitError:
    return StepLimitError(
        f"the run reached limits.steps={limit} node executions before item {i} of node "
        f"{pn.name!r} could start (each item of a map is a step); raise the limit "
        "(--set limits.steps=N)", node=pn.name, item=i)


def _first(group: BaseExceptionGroup[_ItemFailed]) -> RunError:
    """The error of the first item that failed (the others were cancelled)."""
    exc = group.exceptions[0]
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, _ItemFailed)
    return exc.error


def _shared_writes(calls: NodeCall, pn: PlanNode, done: dict[int, JSONObject]
                   ) -> WriteConflictError | None:
    """Without ``collect``, two items writing a field that has no reducer: which one
    would win depends on their order, so it is a write conflict (as between branches)."""
    edge = pn.mapped
    assert edge is not None
    if edge.spec.collect is not None:
        return None
    reducers = calls.plan.reducers
    first: dict[str, int] = {}
    for i in sorted(done):
        for key in done[i]:
            if reducers.get(key, "replace") != "replace":
                continue
            if key in first:
                return WriteConflictError(
                    f"items {first[key]} and {i} of mapped node {pn.name!r} both wrote field "
                    f"{key!r}, which has no reducer: declare one under state: (append, "
                    "extend, merge, add), or gather the items' updates with 'collect: FIELD' "
                    "on the map edge", node=pn.name, field=key, items=[first[key], i])
            first[key] = i
    return None


__all__ = ["ItemsWaiting", "can_go_on", "items_to_go_on", "run_items"]
