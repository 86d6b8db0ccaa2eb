"""``run.migrated`` in the fold: a run moves onto another definition.

The fold (`_fold.RunView`) hands the record here: it checks that the record is one a
reader can follow (its definition is the one its hash names, it moves from the
definition the run is on), swaps the view's plan, and carries over what survives the
move -- what is in flight, the start edges of a run not started, the edges' take
counts -- and a new flow machine over the same containers. ``interlock migrate``
(`_ops._migrate`) checked statically, before recording it, that this can hold.
"""

from __future__ import annotations

from collections import Counter

from .. import _log as L
from .._definition._plan import PlanEdge
from .._errors import InternalError
from ._flow import Due, Flow
from ._view import ViewData


def migrate(view: ViewData, rec: L.Record) -> None:
    """The run moves onto another definition: from here on the fold reads
    the new plan. What was in flight stays where it was (the waiting gate, the failed
    visit, the start edges of a run not started), or, with ``at_node``, gives way to
    that node, ready. ``interlock migrate`` checked statically that this holds (no
    join half-arrived, no mapped visit, every node in flight in the new graph)."""
    if view.plans is None:
        raise InternalError(f"record {rec['seq']} (run.migrated): this reader was not "
                            "given a way to read the definition it moves to")
    if L.definition_digest(rec["definition"]) != rec["to_hash"]:
        raise InternalError(f"record {rec['seq']} (run.migrated): its definition does not "
                            "match its to_hash")
    if view.migration is not None and rec.get("from_hash") != view.migration["to_hash"]:
        raise InternalError(f"record {rec['seq']} (run.migrated): its from_hash is not the "
                            "definition the run was on (the previous migration's to_hash)")
    plan = view.plans(rec["definition"])
    old = view.plan
    at = rec.get("at_node")
    # a run migrated before its first decision still owes its start edges: the new
    # plan's (the old plan's dues name the old plan's edges, and are dropped below)
    starting = any(src == "START" for _, src in view.due)
    if at is not None:
        view.running.clear()
        view.gates.clear()
        view.ready.clear()
        view.ready.append(at)
        if view.status == "WAITING_APPROVAL":
            view.status, view.waiting = "PENDING", None
    missing = [n for n in [*view.ready, *(k[0] for k in view.running)]
               if n not in plan.nodes]
    if missing:
        raise InternalError(f"record {rec['seq']} (run.migrated): node {missing[0]!r} "
                            "is in flight but the new definition has no such node")
    view.due.clear()
    if starting and at is None:
        for e in plan.start_edges:
            view.due[(e.index, "START")] = Due(e, "START")
    # an edge's ``max`` counts its takes: an edge the new graph keeps keeps its count
    index = {_edge_key(e): e.index for e in plan.edges}
    view.takes = Counter({index[_edge_key(old.edges[i])]: n for i, n in view.takes.items()
                          if _edge_key(old.edges[i]) in index})
    for name in plan.no_visits:
        view.visits.setdefault(name, 0)
    view.plan = plan
    # a new flow machine over the same containers (its invariant 1): nothing is
    # half-arrived (checked by `interlock migrate`), so only ``active`` is rebuilt --
    # each node in flight in a loop of the new plan keeps that loop from going idle
    view.flow = Flow(plan, view.ready, view.running, view.due)
    for name in [*view.ready, *(k[0] for k in view.running)]:
        pn = plan.nodes[name]
        if pn.cyclic:
            view.flow.active[pn.scc] += 1
    view.migration = {"to_hash": rec["to_hash"], "at_node": at, "code": rec.get("code")}


def _edge_key(e: PlanEdge) -> bytes:
    """What identifies an edge across two definitions: its declaration."""
    return L.dumps(e.spec.model_dump(mode="json"))
