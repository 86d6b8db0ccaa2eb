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
recorded as such, and the visit's outcome is that item's error.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from .._definition._edge import MAP_CONCURRENCY
from .._definition._plan import PlanNode
from .._errors import NodeError, RunError, StepLimitError, WriteConflictError
from .._json import JSONObject
from . import _records as R
from ._approvals import requested
from ._call import NodeCall
from ._context import PauseRequested
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
    """Run the items of ``pn``'s visit that have not completed; the visit's outcome.
    Never raises Exception (a cancellation of the run propagates)."""
    view = calls.view
    edge = pn.mapped
    assert edge is not None
    m = view.maps[(pn.name, visit)]
    if pn.gate:  # a mapped gate: each item asks a person (those not asked yet)
        return await _ask_items(calls, pn, visit)
    # the fold's ``m.done``: on a re-run, the items completed in the log do not run again
    todo = iter([i for i in range(len(m.items)) if i not in m.done])
    stack = calls.stack(pn)
    t0 = perf_counter()

    async def worker() -> None:
        for i in todo:  # one iterator, shared: each item is taken by one worker
            await _run_item(calls, pn, visit, stack, i)

    workers = min(edge.spec.max_concurrency or MAP_CONCURRENCY, len(m.items) - len(m.done))
    error: RunError | None = None
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(worker())
    except* _ItemFailed as failed:
        # the task group cancelled the other items: each records its own node.failed
        # (cancelled) through the guards, and runs again if the run is resumed
        error = _first(failed)
    written: JSONObject | None = None
    if error is None:
        error = _shared_writes(calls, pn, m.done)
        # the fields the visit writes, for the scheduler's write-conflict check against
        # other branches (the values are the fold's to merge, from the items' records)
        written = {edge.spec.collect: None} if edge.spec.collect is not None else \
            dict.fromkeys(k for update in m.done.values() for k in update)
    duration = round((perf_counter() - t0) * 1e6) / 1000
    return new_outcome((pn.name, visit, 1, written, None, error, duration, 0, None))


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
    """One item's attempt through the guard stack; raises `_ItemFailed` if it failed."""
    view, sink = calls.view, calls.sink
    m = view.maps[(pn.name, visit)]
    running = m.running.get(i)
    if running is None:  # a new item: a step (a re-run after a resume is not one)
        limit = view.limits.get("steps")
        if limit is not None and view.steps >= limit:
            raise _ItemFailed(_step_limit(limit, pn, i))
    attempt = 1 if running is None else running.attempt + 1
    sink.add(R.node_started(pn.name, visit, attempt, i))
    out = await stack(calls.begin(pn, visit, attempt, i))
    error = out.error
    if error is None and out.pause is not None:
        error = NodeError(f"node {pn.name!r} asked a human (ctx.confirm, or a tool with "
                          "confirm: true); the items of a mapped node cannot wait for "
                          "one: confirm before or after the map", node=pn.name)
    if error is not None:
        error.details["item"] = i
        error.message = f"{error.message} (item {i}, counting from 0, of {len(m.items)})"
        await sink.commit([R.node_failed(pn.name, visit, out.attempt, error.to_json(),
                                         out.duration_ms, out.tokens, i)])
        raise _ItemFailed(error)
    # committed now, not with the visit: a crash later keeps this item's work
    sink.add(R.node_completed(pn.name, visit, out.attempt, out.duration_ms, out.update,
                              None, out.tokens, i))
    await sink.flush()


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


__all__ = ["run_items"]
