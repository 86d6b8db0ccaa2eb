"""The gates a run waits at, as its surfaces show them: names, the ``waiting`` object, the
run's shown status.

Several gates can wait at once -- in parallel branches, in the items of a map, in child
runs -- and each is decided on its own. Every surface (``status``, the API's run object,
``runs --waiting``, ``/api/approvals``, the inbox) shows each of them from the moment it
is asked, also while other branches of the run are still running in the process that
executes it:

- The fold's own ``status`` says where the *executor* is: RUNNING while it executes,
  WAITING_APPROVAL once it stopped with nothing left to do but gates (``run.waiting``).
  Several parts of the engine rely on that (a ``resume`` without a decision refuses a
  run stopped at its gates; a worker continues a RUNNING one).
- `shown` is what people see: WAITING_APPROVAL as soon as any gate waits. While other
  branches still run (or are ready to, or have edges to decide), ``waiting.running``
  lists their nodes -- the run then has an executor, or needs one: a store's
  ``claim_next`` hands a run so marked to a worker once nobody holds it (its executor
  died), as it does a RUNNING one. A run stopped at its gates has no ``running``.

The run's row (`_journal.Journal.flush`) and its result (`_fold.result_of`) both go
through `shown`, so the row says WAITING_APPROVAL in the very write that commits the
gate's ``approval.requested``.
"""

from __future__ import annotations

from typing import Any

from .._json import JSONObject
from ._view import Gate, ViewData

# the fold's statuses of a run whose executor is (or should be) at work: shown as
# WAITING_APPROVAL while a gate waits
_LIVE = frozenset({"RUNNING", "RETRYING", "PENDING"})


def gate_name(gate: Gate) -> str:
    """The gate's name in ``waiting.pending`` and for ``--gate``/the API's ``node``: its
    node, ``NODE[i]`` for item ``i`` of a mapped gate, or for a child run's gate the path
    of nodes down to it."""
    return gate.path or (gate.node if gate.item is None else f"{gate.node}[{gate.item}]")


def gate_slot(gate: Gate) -> str:
    """The key a decision on ``gate`` is offered under (`Store.offer_decision`): one per
    visit of the gate, and for a confirmation asked inside a node (a guarded tool call)
    one per key it asks under; and per request (an unknown outcome asked after the
    confirmation of the same visit), so that a gate asked again is decided afresh."""
    return f"{gate_name(gate)}#{gate.visit}@{gate.requested_at!r}" + (
        f"#{gate.key}" if gate.key is not None else "")


def oldest(pending: list[Gate]) -> Gate:
    """The gate waiting longest (by ``requested_at``; the first requested on a tie)."""
    return min(pending, key=lambda g: g.requested_at)


def entries(gate: Gate) -> list[JSONObject]:
    """``gate``'s entries in ``waiting.pending``: one -- or, for a child run's gate, one
    per gate the child (and its children) waits at, each named by its path from here
    (``remediate/approval``, ``remediate/deploy[2]``, ``remediate/fix/approval``)."""
    if gate.children:
        return [dict(c) for c in gate.children]
    return [gate.waiting()]


def waiting_object(pending: list[Gate]) -> dict[str, Any]:
    """The ``waiting`` object of a run waiting at ``pending``: the oldest
    gate's, with ``pending`` listing every waiting gate, oldest first."""
    listed = sorted((e for g in pending for e in entries(g)), key=_requested_at)
    out: dict[str, Any] = dict(listed[0])
    out["pending"] = listed
    return out


def _requested_at(entry: JSONObject) -> float:
    at = entry.get("requested_at")
    return float(at) if isinstance(at, int | float) else 0.0


def shown(view: ViewData) -> tuple[str, JSONObject | None]:
    """The status and ``waiting`` a run's surfaces show (see the module's docstring):
    the fold's, except that a run with a gate waiting is WAITING_APPROVAL even while its
    executor still runs other branches (then ``waiting.running`` names them)."""
    status = view.status
    if not view.gates or (status not in _LIVE and status != "WAITING_APPROVAL"):
        return status, view.waiting
    # (a conversation's wait for its next message is not a gate for a person to decide)
    pending = [g for g in view.pending_gates() if g.kind != "message"]
    if not pending:
        return status, view.waiting
    waiting = waiting_object(pending)
    if status == "WAITING_APPROVAL":
        # stopped at its gates: those waiting now (a child run's gate decided through its
        # parent is recorded in the child without resuming it: no ``run.waiting`` again)
        return status, waiting
    beside = running_beside(view, pending)
    if beside is not None:
        waiting["running"] = beside
    return "WAITING_APPROVAL", waiting


def running_beside(view: ViewData, pending: list[Gate]) -> list[str] | None:
    """The nodes of the run's branches that are not waiting at a gate: visits running (a
    mapped visit with an item not asking a person, or none asking), nodes ready to start,
    nodes whose edges are to be decided -- in that order, each once; None when there are
    none (the run has nothing to do but wait)."""
    at_gate = {(g.node, g.visit) for g in pending if g.item is None}
    out: dict[str, None] = {}
    for key in view.running:
        m = view.maps.get(key)
        if m is not None:
            # busy unless it only waits for its items' people (every item not done asks)
            asking = {g.item for g in pending if (g.node, g.visit) == key}
            if not asking or set(range(len(m.items))) - set(m.done) - asking:
                out[key[0]] = None
        elif key not in at_gate:
            out[key[0]] = None
    out.update(dict.fromkeys(view.ready))
    for due in view.due.values():
        out.update(dict.fromkeys(due.arrived or (due.source,)))
    if not out and not view.due:
        return None
    return [n for n in out if n in view.plan.nodes]


# -- naming a gate in a decision, as each surface does ---------------------------------


def naming(via: str | None, name: str) -> str:
    """How a decision made ``via`` a surface names the gate ``name``: the CLI's
    ``--gate 'deploy[1]'``, the API's field (``"node": "deploy[1]"``), Python's
    ``node='deploy[1]'`` (``via`` None: `approve(node=...)`, `decide_gate`'s gate)."""
    if via == "cli":
        import shlex

        return f"--gate {shlex.quote(name)}"
    if via is None:
        return f"node={name!r}"
    import json

    return f'"node": {json.dumps(name)} in the request body'


def ambiguous(node: str, pending: list[Gate], via: str | None, above: str = "") -> str | None:
    """Why a decision naming ``node`` alone is refused when ``node`` is a mapped gate
    with more than one item waiting in ``pending`` -- it would decide one the decider
    did not pick -- or None (one item waiting, or ``node`` no mapped gate). ``above``:
    for a child run's gate, the path down to it (``remediate/``)."""
    items = sorted((g for g in pending if g.node == node and g.item is not None
                    and g.path is None), key=lambda g: g.item or 0)
    if len(items) < 2:
        return None
    names = [above + gate_name(g) for g in items]
    listed = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)" if len(names) > 6
                                     else "")
    field = "" if via in ("cli", None) else " (the field node)"
    return (f"the decision is refused: {above + node!r} is a mapped gate with {len(items)} items "
            f"waiting ({listed}): name one{field}, e.g. {naming(via, names[0])}")
