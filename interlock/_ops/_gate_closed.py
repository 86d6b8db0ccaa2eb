"""A decision on a gate that a rejection closed: refused, saying which rejection.

Several gates of a run wait at once, and a rejection with no rejection route ends the run
REJECTED and closes the others (``approval.decided`` with decision ``closed``). A decision
made on one of those at about the same moment, from another process, loses: its offer is
not folded in (`_engine._approvals.offered` stops at the rejection). Its decider is told so
-- "gate 'security' was closed when 'legal' was rejected by y at ..." -- as a refused
decision (exit 2, a server's 409), never as "recorded".
"""

from __future__ import annotations

from collections.abc import Callable

from .. import _log as L
from .._engine._approvals import GateNotWaiting
from .._engine._gates import gate_name
from .._engine._view import Gate
from .._store import Store
from ._gate_refusals import utc
from ._load import Functions, Loaded, load_run


class GateClosed(GateNotWaiting):
    """A decision on a gate a rejection closed (exit 2; a server answers 409)."""


def closed_refusal(loaded: Loaded, run_id: str, match: Callable[[Gate], bool]
                   ) -> GateClosed | None:
    """The refusal of a decision on the gate of ``loaded``'s run that ``match`` picks,
    if a rejection closed it (else None)."""
    if loaded.view.status != "REJECTED":
        return None  # (an item's gate closed when its item failed is asked again)
    closed = [g for g in loaded.view.gates.values() if g.decision == "closed" and match(g)]
    if not closed:
        return None
    gate = closed[-1]
    name = gate_name(gate)
    rejected = _rejection(loaded, gate)
    if rejected is None:  # (the rejection is before a snapshot: its record is not read)
        node = (loaded.view.error or {}).get("node")
        how = f"when {node!r} was rejected" if node else "when the run was rejected"
    else:
        by = rejected.get("by") or "an anonymous decider"
        how = (f"when {rejected['node']!r} was {rejected.get('decision')} by {by} at "
               f"{_when(rejected.get('at'))}")
    return GateClosed(f"the decision is refused: gate {name!r} of run {run_id!r} was closed "
                      f"{how}; the run ended {loaded.view.status} and takes no more "
                      f"decisions -- see `interlock trace {run_id}`")


def raise_closed(loaded: Loaded, run_id: str, gate: tuple[str, int, str | None, float]
                  ) -> None:
    """Raise `GateClosed` if a rejection closed ``gate`` before our decision on it was
    folded in (the decision offered for it is then not recorded)."""
    closed = closed_refusal(loaded, run_id, lambda g: g.slot == gate[:2] and g.key == gate[2]
                            and g.requested_at == gate[3])
    if closed is not None:
        raise closed


async def refuse_closed(st: Store, run_id: str, gate: tuple[str, int, str | None, float],
                         workflow: Functions | None) -> None:
    """`raise_closed` for a run this process executed to its rejection."""
    raise_closed(await load_run(st, run_id, workflow=workflow), run_id, gate)


def _rejection(loaded: Loaded, gate: Gate) -> L.Record | None:
    """The decision whose rejection closed ``gate``: the last rejection (or deadline
    passed) recorded before its closing."""
    seen_closing = False
    for entry in reversed(loaded.entries):
        if entry.type != L.APPROVAL_DECIDED:
            continue
        rec = entry.record()
        if rec.get("decision") == "closed":
            if rec["node"] == gate.node and rec["visit"] == gate.visit \
                    and rec.get("item") == gate.item:
                seen_closing = True
        elif seen_closing and rec.get("decision") in ("rejected", "timed_out"):
            return rec
    return None


def _when(at: object) -> str:
    return utc(at) if isinstance(at, int | float) else "an unknown time"
