"""Why a decision that names its gate (``resume --gate NODE``, the API's ``node``) finds
no gate waiting there, in words a person can act on:

    a wrong name        the gates that wait, and a "did you mean" (the nearest name)
    a gate decided      who decided it, how, when and where ("decided already: approved
                        by bob at 2026-12-05 04:12:03 UTC via api"), from its record
    a node, not a gate  what it is: not a gate, or a gate the run has not reached

Either refusal is a `GateNotWaiting` (exit 2; a server answers 409) -- a `NoSuchGate`
(a server answers 422) for a name the workflow has no gate of -- raised before anything
is offered or recorded.
"""

from __future__ import annotations

import difflib
from datetime import UTC, datetime
from typing import Any

from .. import _log as L
from .._engine._approvals import GateNotWaiting, NoSuchGate
from .._engine._gates import entries, gate_name, naming
from .._engine._view import Gate
from .._store import Store
from ._load import Loaded, load_run
from ._verify import ChildLinks


async def check_named(st: Store, run_id: str, loaded: Loaded, name: str,
                      above: str = "", *, via: str | None = None,
                      asked: float | None = None) -> None:
    """Refuse a decision for the gate ``name`` of run ``run_id`` (as ``loaded``) when no
    gate of the run waits under that name: `GateNotWaiting`, saying who decided it
    already, or which gates wait and which name was meant. A name that waits -- a gate
    of the run's, or a path into a child run it waits through -- passes, unless
    ``asked`` (the decision's ``requested_at``) is not when it was asked: a decision
    made for an earlier asking of the gate. ``above``: for a child run's gate decided
    through its parent, the path down to it (``remediate/``), which the names in the
    refusal start with, as the parent's ``--gate`` takes them."""
    view = loaded.view
    pending = view.pending_gates()
    gate = _waiting(pending, name)
    if gate is not None:
        if asked is not None and _asked_at(gate, name) not in (None, asked):
            raise GateNotWaiting(_asked_again(run_id, above + name, gate, asked))
        return
    waiting = sorted({above + str(e.get("node")) for g in pending for e in entries(g)})
    status, shown = view.status, above + name
    which = "child run" if above else "run"
    run = f"{which} {run_id!r}"
    still = (f"; still waiting: {', '.join(waiting)}" if waiting
             else f"; nothing else waits for a decision (the {which} is {status})")
    if "/" in name:  # a child run's gate: the child says, if this run still links to it
        await _check_child(st, loaded, name, above, via)
    found = await last_decided(st, run_id, name)
    if found is not None:
        raise GateNotWaiting(f"the decision is refused: gate {shown!r} of {run} was "
                             f"decided already: {decided_text(found)}; exactly one decision "
                             f"per gate wins{still}")
    gates = [above + n for n, ns in loaded.spec.nodes.items()
             if (ns.approval is not None or ns.confirm) and n != name.split("[", 1)[0]]
    node = name.split("[", 1)[0]
    items = await _items_asked(st, run_id, node)
    at_items = _items_waiting(pending, node) if "[" in name and "/" not in name else []
    if at_items:  # another index of a mapped gate: its items that wait, not a "did you mean"
        hint = f" Items {_span(at_items)} of {above + node!r} wait."
    else:
        meant = difflib.get_close_matches(shown, waiting, n=1) or \
            difflib.get_close_matches(shown, gates, n=1)
        hint = f" Did you mean {meant[0]!r}?" if meant else ""
    listed = (f" Waiting: {', '.join(waiting)} (decide one with {naming(via, 'NAME')})."
              if waiting
              else f" Nothing waits for a decision: the {which} is {status}.")
    ns = loaded.spec.nodes.get(node.split("/", 1)[0])
    refused = NoSuchGate if ns is None or (ns.approval is None and not ns.confirm
                                           and ns.workflow is None) else GateNotWaiting
    raise refused(f"the decision is refused: no gate of {run} waits at {shown!r}: "
                  f"{_what(loaded, name, items)}.{hint}{listed}")


def _items_waiting(pending: list[Gate], node: str) -> list[int]:
    """The items of the mapped gate ``node`` that wait in ``pending``."""
    return sorted(g.item for g in pending if g.node == node and g.item is not None
                  and g.path is None)


def _span(items: list[int]) -> str:
    """'0-3' for a run of items, else '0, 2, 5' (a few, then '...')."""
    if items == list(range(items[0], items[-1] + 1)) and len(items) > 2:
        return f"{items[0]}\u2013{items[-1]}"
    return ", ".join(map(str, items[:6])) + (", ..." if len(items) > 6 else "")


async def _check_child(st: Store, loaded: Loaded, name: str, above: str,
                       via: str | None) -> None:
    """`check_named` in the last child run the node ``name`` starts with (``NODE/...``,
    ``NODE[i]/...``) started -- its gate decided there, or never there."""
    top, rest = name.split("/", 1)
    node, _, item = top.partition("[")
    links, child = ChildLinks(loaded.row), None
    async for page in st.iter_entries(loaded.row.run_id):
        for entry in page:
            if entry.type == L.CHILD_STARTED:
                rec = entry.record()
                linked = await links.follow(st, rec)
                if linked is not None and rec.get("node") == node and \
                        str(rec.get("item")) == (item.rstrip("]") or "None"):
                    child = linked
    if child is not None:
        await check_named(st, child, await load_run(st, child), rest, f"{above}{top}/",
                          via=via)


def _asked_at(gate: Gate, name: str) -> float | None:
    """When the asking ``name`` names (a gate of the run's, or a gate a child run waits
    at, as ``waiting.pending`` lists it) was asked; None for a deeper path the listing
    does not show (its own run checks it)."""
    at = next((e.get("requested_at") for e in entries(gate) if e.get("node") == name), None)
    if isinstance(at, float | int):  # (a child's gate: its own asking, not the wait's)
        return at
    return gate.requested_at if name in (gate_name(gate), gate.node) else None


def _waiting(pending: list[Gate], name: str) -> Gate | None:
    """The waiting gate ``name`` may name as `_approvals.decide` and
    `_children._child_gate` look it up: its node, ``NODE[i]``, or a path into a child
    run the run waits through (which the child checks in turn); None if none."""
    for gate in pending:
        if name == gate_name(gate):
            return gate
        if gate.kind == "workflow":  # (a map item's child: NODE[i]/..., never NODE alone)
            top = gate.node if gate.item is None else f"{gate.node}[{gate.item}]"
            if name == top or name.startswith(top + "/"):
                return gate
        elif name == gate.node:
            return gate
    return None


def _asked_again(run_id: str, name: str, gate: Gate, asked: float) -> str:
    """Why a decision made for the asking of ``name`` at ``asked`` is refused: the gate
    waiting under that name now is another asking (``gate``)."""
    kind = {"approval": "an approval", "confirm": "a confirmation", "workflow":
            "a child run's gate", "tool": "a guarded tool call"}.get(gate.kind, gate.kind)
    what = ("its outcome is unknown: approving runs it AGAIN"
            if gate.kind == "unknown_outcome" else f"visit {gate.visit}, {kind}")
    made = f"the request it was made for (gate {name!r} of run {run_id!r}, asked at {utc(asked)})"
    if asked < gate.requested_at:  # an earlier asking: answered (or closed) since
        why = (f"is no longer waiting: the gate was asked again at {utc(gate.requested_at)} "
               f"({what})")
    else:  # a time this gate was not asked at (a later one, or none of its askings)
        why = (f"is not the one waiting: the gate's waiting request was asked at "
               f"{utc(gate.requested_at)} ({what})")
    return (f"the decision is refused: {made} {why}; decide the request waiting now (in a "
            "chat: its newer message)")


def _what(loaded: Loaded, name: str, items: list[int]) -> str:
    """What ``name`` is in the run's workflow, for a decision it cannot take (``items``:
    the items of a mapped gate ``name`` the run asked about)."""
    spec = loaded.spec
    node = name.split("[", 1)[0].split("/", 1)[0]
    ns = spec.nodes.get(node)
    if ns is None:
        return f"workflow {spec.workflow!r} has no node {node!r}"
    if "/" in name:
        return f"{node!r} waits for no child run now"
    if ns.workflow is not None:
        return (f"{node!r} is a sub-workflow node: name its child run's gate by its path "
                f"from here ({node}/GATE; {node}[i]/GATE for a map item's child)")
    if ns.approval is not None or ns.confirm:
        if name == node and items:  # (its items were asked, and none waits)
            return (f"{node!r} is a mapped gate, each of its items a gate of its own "
                    f"({node}[{items[0]}]..{node}[{items[-1]}]), and none waits")
        if name != node and items:  # an item it has not (an index out of its range)
            return (f"{node!r} is a mapped gate whose items asked are "
                    f"{node}[{items[0]}]..{node}[{items[-1]}]; {name!r} is none of them")
        asked = f"for {name!r}" if name != node else "in this run"
        return f"{node!r} is a gate that has asked for no decision {asked}"
    return f"{node!r} is not a gate (neither an approval: node nor a confirm: true node)"


async def _items_asked(st: Store, run_id: str, node: str) -> list[int]:
    """The items of the mapped gate ``node`` that run ``run_id`` asked a decision for."""
    items: set[int] = set()
    async for page in st.iter_entries(run_id):
        for entry in page:
            if entry.type == L.APPROVAL_REQUESTED:
                rec = entry.record()
                if rec.get("node") == node and isinstance(rec.get("item"), int):
                    items.add(rec["item"])
    return sorted(items)


async def last_decided(st: Store, run_id: str, name: str) -> dict[str, Any] | None:
    """The last ``approval.decided`` record of the gate ``name`` (a node, or ``NODE[i]``
    for a map item's) in run ``run_id``'s log, or None if it was never decided."""
    found = None
    async for page in st.iter_entries(run_id):
        for entry in page:
            if entry.type != L.APPROVAL_DECIDED:
                continue
            rec = entry.record()
            item = rec.get("item")
            named = rec.get("node") if item is None else f"{rec.get('node')}[{item}]"
            if named == name and rec.get("kind") != "workflow":
                found = rec
    return found


def decided_text(rec: dict[str, Any]) -> str:
    """'approved by bob at 2026-12-05 04:12:03 UTC via api' for a decision's record (an
    ``approval.decided``, or a decision offered: ``offered_at`` its time)."""
    decision = str(rec.get("decision"))
    decision = {"approve": "approved", "reject": "rejected", "modify": "modified"}.get(
        decision, decision)
    at = rec.get("offered_at") if "offered_at" in rec else rec.get("at")  # (an offer's
    # ``at`` is a modify's re-entry node)
    when = f" at {utc(at)}" if isinstance(at, int | float) else ""
    via = f" via {rec['via']}" if rec.get("via") else ""
    if decision == "closed":  # the engine closed it: its comment says why
        return f"closed{when} ({rec.get('comment') or 'the run ended'})"
    who = rec.get("by") or "an anonymous decider (no --by)"
    deadline = " (its deadline passed)" if rec.get("timed_out") else ""
    return f"{decision} by {who}{when}{via}{deadline}"


def utc(ts: float) -> str:
    """A record's time as people read it: '2026-12-05 04:12:03 UTC'."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
