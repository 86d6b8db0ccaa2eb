"""A run's node visits as a reader sees them: what each visit read, returned, cost, raised.

The log records what a node returned (``node.completed``'s ``update``), its duration,
tokens and error, but not what it was given: that is the state when it started, which
only the fold knows. `node_visits` folds the run's records from the first, with the
same `RunView.apply` as status, resume and trace, and takes each visit's input -- the
fields it ``reads:`` (all of the state when it declares none; an approval's ``show:``
fields) -- as the state stood at its first ``node.started`` (or its ``node.visited``: log format 2).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from .. import _log as L
from .._definition._model import WorkflowSpec
from .._definition._spec import parse
from .._definition._state import scoped
from .._engine._fold import RunView
from .._plugins._compile import reading_plan
from .._store import Store, release_store
from ._load import TRACE_PAGE, open_store_arg, plan_maker

SHARE_EVERY = 200  # records folded between two yields to the event loop (`share_loop`)

_STATUS = {L.NODE_STARTED: "running", L.NODE_COMPLETED: "completed", L.NODE_FAILED: "failed",
           L.NODE_RETRYING: "retrying", L.APPROVAL_REQUESTED: "waiting",
           L.APPROVAL_DECIDED: "decided", L.NODE_VISITED: "completed"}
_STARTS = frozenset({L.NODE_STARTED, L.NODE_VISITED})  # (node.visited: started, completed)
_COMPLETIONS = frozenset({L.NODE_COMPLETED, L.NODE_VISITED})


def _input(spec: WorkflowSpec, rec: L.Record, view: RunView) -> dict[str, object]:
    node, state = rec["node"], view.state
    ns = spec.nodes[node]
    fields = ns.approval.show if ns.approval is not None else ns.reads
    picked = scoped(state, tuple(fields) if fields is not None else None)  # as `_call` does
    item, visit = rec.get("item"), rec.get("visit")
    mapped = view.maps.get((node, visit)) if isinstance(visit, int) else None
    if mapped is not None and isinstance(item, int) and 0 <= item < len(mapped.items):
        # a mapped item's visit also gets its item, under the map edge's ``as``
        edge = next((e for e in spec.edges if e.map and node in (e.to or ())), None)
        picked[edge.item_name if edge is not None else "item"] = mapped.items[item]
    return copy.deepcopy(picked)  # a reducer may change the state's values in place later


async def node_visits(run_id: str, *, store: str | Store | None = None,
                      share_loop: bool = False) -> list[dict[str, Any]]:
    """Each visit of each node of the run, in the order they started: ``node``, ``visit``,
    ``item`` (a mapped node's item index, else null), ``status`` (running, retrying,
    waiting, decided, completed, failed), ``input``, ``update``, ``error``, ``tokens``,
    ``duration_ms`` (the attempts' sum), ``attempts``, ``decision`` (a gate's),
    ``seqs`` (its records).

    ``share_loop``: give the event loop back after every `SHARE_EVERY` records folded,
    so that a long run's fold does not stall the other tasks of the loop (the server's
    ``/visits``). (A thread would not: the fold is Python, and holds the GIL from
    the loop's thread for its whole switch interval at every hand-over.)"""
    st, owned = open_store_arg(store)
    try:
        row = await st.get_run(run_id)
        spec = parse(row.definition)
        view = RunView(reading_plan(spec), plans=plan_maker())  # (migrations read too)
        visits: dict[tuple[str, Any, Any], dict[str, Any]] = {}

        every = SHARE_EVERY if share_loop else TRACE_PAGE
        async for entries in st.iter_entries(run_id, page=TRACE_PAGE):
            for start in range(0, len(entries), every):
                if start or share_loop:
                    await asyncio.sleep(0)
                for entry in entries[start:start + every]:
                    rec = entry.record()
                    status = _STATUS.get(rec["type"])
                    node = rec.get("node")
                    spec = view.plan.spec  # (a migrated run's later records: the new one's)
                    if status is not None and isinstance(node, str) and node in spec.nodes:
                        _visit(spec, visits, rec, status, view)
                    view.apply(rec)
        return list(visits.values())
    finally:
        if owned:
            await release_store(st)


def _visit(spec: WorkflowSpec, visits: dict[tuple[str, Any, Any], dict[str, Any]],
           rec: L.Record, status: str, view: RunView) -> None:
    node = rec["node"]
    key = (node, rec.get("visit"), rec.get("item"))
    v = visits.get(key)
    if v is None:
        v = visits[key] = {
            "node": node, "visit": rec.get("visit"), "item": rec.get("item"),
            "status": status, "input": _input(spec, rec, view), "update": None,
            "error": None, "tokens": 0, "duration_ms": None, "attempts": 0,
            "decision": None, "seqs": []}
    v["seqs"].append(rec["seq"])
    v["status"] = status
    if rec["type"] in _STARTS:
        v["attempts"] = max(v["attempts"], int(rec.get("attempt") or 1))
    if rec.get("duration_ms") is not None:
        v["duration_ms"] = (v["duration_ms"] or 0.0) + float(rec["duration_ms"])
    if rec.get("tokens"):
        v["tokens"] += int(rec["tokens"])
    if rec["type"] in _COMPLETIONS:
        v["update"], v["error"] = rec.get("update"), None
    elif rec.get("error") is not None:
        v["error"] = rec["error"]
    if rec["type"] == L.APPROVAL_DECIDED:
        v["decision"] = rec.get("decision")
