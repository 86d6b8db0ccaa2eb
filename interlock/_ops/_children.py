"""The gates of child runs a parent waits at: where a run waits through its
children, which children wait there no more, decisions and expired deadlines forwarded
into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _log as L
from .._engine._fold import RunView
from .._engine._gates import ambiguous, gate_name, running_beside
from .._engine._view import Gate, gate_key
from .._errors import RunNotFound, UsageError
from .._store import Store
from ._claims import _commit_claimed
from ._gate_refusals import check_named
from ._load import load_run
from ._orphans import close_children

if TYPE_CHECKING:
    from .._engine._approvals import Decision


async def waiting_paths(store: Store, run_id: str, parent: str | None = None
                        ) -> list[str] | None:
    """The names of every gate a run waits at (its own, and through its child runs each
    gate's path of nodes down to it), sorted; None when the run does not only wait for
    humans -- it is not WAITING_APPROVAL, or a gate was decided and its branch is to go
    on, or a child it waits through moved on -- or, with ``parent``, when it is not that
    run's child (a fork's log names the children of the run it was forked from)."""
    try:
        loaded = await load_run(store, run_id)
    except RunNotFound:
        return None
    view = loaded.view
    if parent is not None and (loaded.row.options.get("parent") or {}).get("run") != parent:
        return None
    pending = view.pending_gates()
    # (no gate left: its last one was decided in its log, through its parent, and the run
    # is to go on to its end -- nothing is due when that node has no edges, or, in log
    # format 2, edges its completion implies; as `continue_child` has it)
    if view.status != "WAITING_APPROVAL" or not pending or \
            running_beside(view, pending) is not None:
        return None
    names = []
    for gate in pending:
        if gate.kind != "workflow" or gate.key is None:
            names.append(gate_name(gate))
            continue
        below = await waiting_paths(store, gate.key, run_id)
        if below is None:
            return None  # this run has the child's node to run again
        names += [f"{head(gate)}/{b}" for b in below]
    return sorted(names)


def head(gate: Gate) -> str:
    """The start of the path of a child run's gate: the node (a ``workflow:`` node), or
    the node and the tool (``assistant/run_triage``: an agent's workflow tool, whose
    child's id says so -- `agents._delegates.tool_child_id`)."""
    key = str(gate.key)
    mark = f".{gate.node}.{gate.visit}.tool."
    at = key.rfind(mark)
    if at < 0:  # (a mapped sub-workflow's item: ``remediate[2]``)
        return gate.node if gate.item is None else f"{gate.node}[{gate.item}]"
    return f"{gate.node}/{key[at + len(mark):].split('.', 1)[0]}"


async def _unblocked(store: Store, run_id: str, view: RunView
                     ) -> list[tuple[str, dict[str, object]]]:
    """Decisions for the gates of child runs that no longer wait there (the child was
    decided or continued on its own, or waits at another gate now, or is not this run's:
    a fork's): the node runs again and finds its child as it is (or starts its own)."""
    items = []
    for gate in view.pending_gates():
        if gate.kind != "workflow" or gate.key is None:
            continue
        below = await waiting_paths(store, gate.key, run_id)
        # what the node recorded it waits for: each of the child's gates (or, in a log
        # from before they were listed, the oldest)
        shown = sorted(str(c.get("node")) for c in gate.children) if gate.children \
            else [gate.path]
        if below is None or [f"{head(gate)}/{b}" for b in below] != shown:
            items.append(continued(gate))
    return items


def continued(gate: Gate, decision: str = "continued", **fields: object
              ) -> tuple[str, dict[str, object]]:
    """``approval.decided`` for the gate of a child run (decided there, or waiting there
    no more): the node -- or the mapped node's item -- runs again and continues it."""
    out: dict[str, object] = {"node": gate.node, "visit": gate.visit, "kind": "workflow",
                              "decision": decision, **fields, "key": gate.key}
    if gate.item is not None:
        out["item"] = gate.item
    return (L.APPROVAL_DECIDED, out)


def _child_gate(view: RunView, decision: Decision, skip: list[tuple[str, dict[str, object]]]
                ) -> tuple[Gate, Decision] | None:
    """The gate of a child run ``decision`` is for, and the decision as the child takes
    it (``node`` ``remediate/approval`` names the gate ``approval`` of the child of
    ``remediate``); None when it is for a gate of this run."""
    from dataclasses import replace

    moved = _slots(skip)
    pending = [g for g in view.pending_gates() if g.slot not in moved]
    if decision.node is not None:
        for g in pending:
            if g.kind != "workflow":
                continue
            top = head(g)
            if decision.node == top or decision.node.startswith(top + "/"):
                rest = decision.node[len(top) + 1:]
                return g, replace(decision, node=rest or None)
        return None
    if pending and pending[0].kind == "workflow":
        return pending[0], decision
    return None


def _slots(items: list[tuple[str, dict[str, object]]]) -> set[tuple[str, int]]:
    """The gates (`Gate.slot`) the ``approval.decided`` records in ``items`` decide."""
    return {gate_key(str(f["node"]), int(str(f["visit"])),
                     f["item"] if isinstance(f.get("item"), int) else None)  # type: ignore[arg-type]
            for _, f in items}


async def _decide_child(store: Store, run_id: str, decision: Decision, above: str = ""
                        ) -> None:
    """Record ``decision`` at the gate a child run (or its child...) waits at; the run
    that includes it continues it when it runs the node again. ``above``: the path down
    to the child (``remediate/``), for the refusals' words."""
    from .._engine._approvals import GateNotWaiting, NotAnApprover, decide

    loaded = await load_run(store, run_id)
    view = loaded.view
    if decision.node is not None:  # a gate named: does it wait (who decided it, if not)?
        await check_named(store, run_id, loaded, decision.node, above, via=decision.via)
        vague = ambiguous(decision.node, view.pending_gates(), decision.via, above)
        if vague is not None:  # (a mapped gate's name, several items waiting)
            raise GateNotWaiting(vague)
    if view.status != "WAITING_APPROVAL":
        raise UsageError(f"child run {run_id!r} is {view.status}, not waiting for a decision; "
                         "the decision is refused")
    moved = await _unblocked(store, run_id, view)
    below = _child_gate(view, decision, moved)
    if below is not None:
        await _decide_child(store, str(below[0].key), below[1], f"{above}{head(below[0])}/")
        return
    try:
        items = decide(loaded.spec, view, decision)
    except NotAnApprover as exc:  # (said of the child's gate: which run's it is)
        raise NotAnApprover(f"{exc} (a gate of child run {run_id!r}, whose workflow "
                            f"{loaded.row.workflow!r} declares them)") from None
    await _commit_claimed(store, loaded, items)
    # (a rejection that ended the child closes the children it waited through)
    await close_children(store, run_id, loaded.view, loaded.plan)


async def _expired_children(store: Store, view: RunView,
                            skip: list[tuple[str, dict[str, object]]]
                            ) -> list[tuple[str, dict[str, object]]]:
    """`_approvals.expire` in the child runs a run waits for (at any depth): the engine's
    decisions for their gates whose deadline has passed, recorded there; the records that
    make this run's node run again and continue each such child."""
    moved = _slots(skip)
    items = []
    for gate in view.pending_gates():
        if gate.kind == "workflow" and gate.key is not None and \
                gate.slot not in moved and await _expire_child(store, gate.key):
            items.append(continued(gate))
    return items


async def _expire_child(store: Store, run_id: str) -> bool:
    """Whether a deadline passed in the child run ``run_id`` (or below it), now decided."""
    from .._engine._approvals import expire

    try:
        loaded = await load_run(store, run_id)
    except RunNotFound:
        return False
    view = loaded.view
    if view.status != "WAITING_APPROVAL":
        return False
    below = await _expired_children(store, view, await _unblocked(store, run_id, view))
    items = expire(loaded.spec, view) + below
    if not items:
        return False
    await _commit_claimed(store, loaded, items)
    return True
