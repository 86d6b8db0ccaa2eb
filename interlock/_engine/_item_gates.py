"""The gates of a mapped node's items (a map over an approval node, a ``confirm: true``
node or a sub-workflow whose child waits): each item waits on its own, as gate
``NODE[i]``, and is decided on its own (`_approvals.decide` picks it by that name).

What a decision on an item's gate becomes, after its ``approval.decided``:

    approval        approve/reject: the item completes; its update is the decision
                    record (``collect`` gathers it), whichever it was
    confirm         approve: nothing more -- the item's body runs (`_mapped`), its
                    result is the item's update; reject: the item completes with the
                    rejection record as its update, and its body never runs (as an
                    approval item's rejection, it is the item's outcome, not the run's)
    unknown_outcome approve: the body runs again; approve with ``data``: the outcome
                    checked by hand is the item's update; reject: the item fails with
                    `UnknownOutcome` when the visit goes on (the map's error edges apply)
    workflow        (a child run's gate, decided in the child) nothing more: the item
                    runs again and continues its child

A ``confirm: true`` item whose body had started, approved, and has no outcome in the
log when the run resumes is asked about again (`unknown_item`), never run again unasked.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from .. import _log as L
from . import _records as R
from ._fold import RunView
from ._view import Gate

Items = list[tuple[str, dict[str, Any]]]


def item_decided(gate: Gate, decision: str, by: str | None, comment: str | None,
                 data: Any) -> Items:
    """The records after ``approval.decided`` for the gate of a mapped node's item (see
    the module's docstring): the item's completion, or nothing (its body runs)."""
    assert gate.item is not None
    # an approval item's decision, or a confirm item's rejection, is the item's whole
    # outcome: its completion goes with the decision, in the same commit
    if gate.kind == "approval" or (gate.kind == "confirm" and decision != "approved"):
        said: dict[str, Any] = {"decision": decision, "by": by, "comment": comment,
                                "at": datetime.fromtimestamp(time.time(), UTC).isoformat(),
                                "item": gate.item}
        if gate.input is not None:
            said["data"] = data
        return [R.node_completed(gate.node, gate.visit, 1, 0.0, said, None, 0, gate.item)]
    if gate.kind == "unknown_outcome" and decision == "approved" and data is not None:
        # the outcome a person checked by hand is the item's update
        return [R.node_completed(gate.node, gate.visit, 1, 0.0, dict(data["result"]), None, 0,
                                 gate.item)]
    return []


def unknown_item(view: RunView, gate: Gate, started: L.Record) -> R.Item:
    """The ``unknown_outcome`` gate of item ``gate.item`` of a mapped ``confirm: true``
    node, approved, whose body started (``started``: that attempt's ``node.started``)
    and has no outcome in the log: it is not run again unasked."""
    assert gate.item is not None
    pn = view.plan.nodes[gate.node]
    edge = pn.mapped
    m = view.maps[(gate.node, gate.visit)]
    arguments = {f: view.state.get(f) for f in pn.spec.reads or []}
    if edge is not None:
        arguments[edge.spec.item_name] = m.items[gate.item]
    show = {"action": f"{gate.node}[{gate.item}]", "arguments": arguments,
            "started_at": started.get("at"), "attempt": started.get("attempt")}
    ns = pn.spec
    return (L.APPROVAL_REQUESTED, {
        "node": gate.node, "visit": gate.visit, "kind": "unknown_outcome",
        "show": L.to_json_value(show), "decisions": ["approve", "reject"],
        "approvers": list(ns.approval.approvers) if ns.approval is not None
        and ns.approval.approvers else None, "deadline": None, "item": gate.item})


def item_suspects(view: RunView) -> list[Gate]:
    """The approved gates of confirm items whose body started and that have not
    completed: each may have an unknown outcome (the log's last attempt record says)."""
    out = []
    for g in view.gates.values():
        if g.item is None or g.kind not in ("confirm", "unknown_outcome") \
                or g.decision != "approved" or not g.body_started:
            continue
        m = view.maps.get((g.node, g.visit))
        if m is not None and g.item in m.running:
            out.append(g)
    return out


__all__ = ["item_decided", "item_suspects", "unknown_item"]
