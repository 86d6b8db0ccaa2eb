"""Destructive actions are never repeated silently: on resume, a ``confirm: true``
node (or a mapped one's item) that was approved and had started, but whose outcome is
not in the log, stops the run at an ``unknown_outcome`` gate instead of running
again."""

from __future__ import annotations

from typing import Any

from .. import _log as L
from .._engine._approvals import unknown_outcome
from .._engine._fold import RunView
from .._engine._item_gates import item_suspects, unknown_item
from .._engine._view import Gate
from .._store import Store

_ATTEMPT_TYPES = frozenset({L.NODE_STARTED, L.NODE_FAILED, L.NODE_RETRYING, L.NODE_COMPLETED,
                            L.NODE_VISITED})


async def unknown_outcomes(store: Store, run_id: str, view: RunView
                           ) -> list[tuple[str, dict[str, Any]]]:
    """The ``approval.requested`` (kind ``unknown_outcome``) records for the approved
    ``confirm: true`` visits of ``view`` (and items of mapped ones) whose last attempt
    started and never ended: the process running the action died (its start is committed
    before it runs)."""
    suspects = [g for g in view.gates.values()
                if g.item is None and g.kind in ("confirm", "unknown_outcome")
                and g.decision == "approved" and g.body_started
                and (g.node, g.visit) in view.running]
    out: list[tuple[str, dict[str, Any]]] = []
    for gate in suspects:
        last = await _last_attempt(store, run_id, gate, view.running[(gate.node,
                                                                      gate.visit)].started_seq)
        if last is not None and last["type"] == L.NODE_STARTED:
            out += unknown_outcome(view, gate, last)
    for gate in item_suspects(view):
        assert gate.item is not None
        item = view.maps[(gate.node, gate.visit)].running[gate.item]
        last = await _last_attempt(store, run_id, gate, item.started_seq)
        if last is not None and last["type"] == L.NODE_STARTED:
            out.append(unknown_item(view, gate, last))
    return out


async def _last_attempt(store: Store, run_id: str, gate: Gate, since: int) -> L.Record | None:
    """The last attempt record (started, failed, retrying, completed) of ``gate``'s visit
    -- or of its item -- from seq ``since`` on."""
    last: L.Record | None = None
    async for page in store.iter_entries(run_id, after=max(since - 1, 0)):
        for entry in page:
            rec = entry.record()
            if rec.get("type") in _ATTEMPT_TYPES and rec.get("node") == gate.node \
                    and rec.get("visit") == gate.visit and rec.get("item") == gate.item:
                last = rec
    return last
