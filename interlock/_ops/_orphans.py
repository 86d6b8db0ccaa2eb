"""Child runs nothing waits for any more: closed the way their parent's own gates are.

A parent waits at a child run's gates through a gate of its own (kind ``workflow``, keyed
by the child's id). When that gate is closed -- the parent was rejected, and its other
gates with it; an item of a map over a sub-workflow failed, and its siblings' gates with
it -- or the parent ended (rejected, cancelled, completed), the child would otherwise wait
at its gates for ever, and show in ``runs --waiting``, ``/api/approvals`` and the inbox.
`close_children` closes such a child as its parent's gates are closed: an
``approval.decided`` ``closed`` for each gate it waits at (its comment saying why), then
``run.rejected`` when the parent was rejected, ``run.cancelled`` otherwise -- and so on
down to its own children.

It is idempotent (a child that ended is left alone) and called wherever a parent's log
can have moved so: at the end of each execution of a run (`_execute.drive`), after a
``cancel``, after a decision recorded in a child. A process that dies between the
parent's record and the child's leaves the child waiting until the next look: the lists
of waiting runs (`list_runs`, the server's inbox) call `close_stranded`, which closes a
waiting child whose parent ended, or whose visit in its parent is over, before it is
listed. So does a store that fails mid-close: the child's closing records are one
append, so it is closed whole or left as it was (its claim given back when the store
lets it), a warning names it, and the next look tries again -- the inbox, which looks
at a child only when its parent moves, looks again at those it could not settle.

A FAILED parent is not an end: its resume runs the failed visit again, which continues
the children of its items (their gates are asked again), so those are left waiting; a
``cancel`` of the parent closes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from .. import _log as L
from .._definition._plan import Plan
from .._engine._approvals import close_others
from .._engine._fold import RunView
from .._engine._journal import Journal
from .._errors import ClaimError, InterlockError, LogError, RunNotFound, StoreError
from .._plugins._subflow import child_run_id
from .._store import RunRow, Store
from ._claims import LEASE_SECONDS, _claim_of, make_owner
from ._load import Loaded, load_run

log = logging.getLogger("interlock")

# a parent in one of these will never continue a child it waited through
ENDED = frozenset({"COMPLETED", "REJECTED", "CANCELLED"})


def parent_of(row: RunRow) -> str | None:
    """The run ``row``'s parent (a child run's ``options.parent.run``), or None."""
    parent = row.options.get("parent")
    run = parent.get("run") if isinstance(parent, dict) else None
    return run if isinstance(run, str) else None


class Closing:
    """A journal's listener (wrapping the caller's) that notes the child runs whose gates
    the records it sees close: ``children``, child id -> (node, visit, the closing's
    comment). (The fold forgets a mapped visit's item gates once the visit is over.)
    ``listener``: what the journal is given -- the caller's own for a run of ``plan``
    that can have no children (no ``workflow:`` node, no agent: a workflow tool's)."""

    __slots__ = ("children", "inner", "listener")

    def __init__(self, plan: Plan, inner: Callable[[L.Record, RunView], object] | None
                 ) -> None:
        self.inner = inner
        self.children: dict[str, tuple[str, int, str]] = {}
        kids = any(pn.spec.workflow is not None or pn.spec.agent is not None
                   for pn in plan.nodes.values())
        self.listener: Callable[[L.Record, RunView], object] | None = \
            self._note if kids else inner

    def _note(self, rec: L.Record, view: RunView) -> None:
        if rec["type"] == L.APPROVAL_DECIDED and rec.get("decision") == "closed" \
                and rec.get("kind") == "workflow" and isinstance(rec.get("key"), str):
            self.children[rec["key"]] = (rec["node"], rec["visit"], str(rec.get("comment")))
        if self.inner is not None:
            self.inner(rec, view)


def _candidates(plan: Plan, run_id: str, view: RunView,
                closed: Mapping[str, tuple[str, int, str]]) -> dict[str, str | None]:
    """The child runs ``run_id``'s view no longer waits through, each with why its gate
    was closed (None: the run ended): those whose gates were closed (``closed``: by the
    records just committed; an item's, once its visit is over: a retry of the visit
    continues it), and -- once the run ended -- every child it waited through or ran."""
    ended = view.status in ENDED
    out: dict[str, str | None] = {}
    for key, (node, visit, comment) in closed.items():
        if ended or (node, visit) not in view.running:
            out[key] = comment
    if not ended:
        return out
    for gate in view.gates.values():
        if gate.kind == "workflow" and gate.key is not None and gate.key not in out \
                and gate.decision in (None, "closed"):
            out[gate.key] = None
    # a child's gate closed at once (not an item's) leaves only its decision, by the
    # child's id (a guarded tool's key is no run's: `_close` checks the child's link)
    for (_, _, key), decided in view.confirmations.items():
        if decided == "closed":
            out.setdefault(key, None)
    for (node, visit) in view.running:  # the children of its sub-workflow visits
        if plan.nodes[node].spec.workflow is None:
            continue
        m = view.maps.get((node, visit))
        for i in ([None] if m is None else [i for i in range(len(m.items))
                                             if i not in m.done]):
            out.setdefault(child_run_id(run_id, node, visit, i), None)
    return out


def _why(run_id: str, view: RunView, comment: str | None = None) -> tuple[str, str]:
    """How a child of ``run_id`` ends, and why (its gates' ``closed`` comment):
    ``comment``, why the parent closed the gate it waited through."""
    error = view.error or {}
    if view.status == "REJECTED":
        at = error.get("node")
        return "rejected", (f"not needed: the parent run {run_id!r} was rejected"
                            + (f" at {at!r}" if at else ""))
    if view.status == "CANCELLED":
        return "cancelled", f"not needed: the parent run {run_id!r} was cancelled"
    if comment is not None:
        return "cancelled", (f"not needed: the parent run {run_id!r} closed the gate that "
                             f"waited through it ({comment.removeprefix('not needed: ')})")
    if view.status == "COMPLETED":
        return "cancelled", f"not needed: the parent run {run_id!r} completed without it"
    return "cancelled", (f"not needed: the parent run {run_id!r} went on without it (the "
                         "visit it belonged to is over)")


async def close_children(store: Store, run_id: str, view: RunView | None = None,
                         plan: Plan | None = None, by: str | None = None, *,
                         closed: Mapping[str, tuple[str, int, str]] | None = None
                         ) -> list[str]:
    """Close the child runs ``run_id`` no longer waits through (see the module's
    docstring), and theirs; the ids of those closed here. ``view``/``plan``: the run as
    the caller has it folded (read from the store when not given). ``by``: who cancelled
    the parent (recorded in a cancelled child's ``run.cancelled``). ``closed``: the
    children whose gates the records just committed closed (`Closing.children`)."""
    if view is None or plan is None:
        try:
            loaded = await load_run(store, run_id)
        except RunNotFound:
            return []
        view, plan = loaded.view, loaded.plan
    children = _candidates(plan, run_id, view, closed or {})
    done = []
    for child, comment in children.items():
        outcome, why = _why(run_id, view, comment)
        if await _guarded(store, run_id, child, outcome, why, by) in ("closed", "asked"):
            done.append(child)
    return done


# what became of a child `_guarded` set out to close: closed here; asked of the executor
# that holds its claim (which closes it, if it executes it); nothing to close (it ended,
# or is not this parent's); or not closed now (the store failed: the next look tries again)
Closed = Literal["closed", "asked", "left", "failed"]


async def _guarded(store: Store, parent: str, child: str, outcome: str, why: str,
                   by: str | None) -> Closed:
    try:
        return await _close(store, parent, child, outcome, why, by)
    except InterlockError as exc:  # the store away, a broken or keyed log: left, said
        # (what the store said: not the journal's advice to resume, which is a run's)
        said = exc.__cause__ if isinstance(exc.__cause__, InterlockError) else exc
        log.warning("child run %s of run %s is not needed any more but could not be "
                    "closed, left as it was (the next look at the waiting runs tries "
                    "again: runs --waiting, /api/approvals): %s", child, parent, said)
        return "failed"


async def _close(store: Store, parent: str, child: str, outcome: str, why: str,
                 by: str | None) -> Closed:
    try:
        row = await store.get_run(child)
    except RunNotFound:
        return "left"
    if parent_of(row) != parent or row.summary.status in ENDED:
        return "left"
    owner = make_owner()
    try:
        generation = await store.claim(child, owner, LEASE_SECONDS)
    except ClaimError:  # executed elsewhere: its executor stops it (and closes its own)
        await store.request_cancel(child, by)
        return "asked"
    try:
        loaded = await load_run(store, child)  # under the claim: as it is now
        view = loaded.view
        if view.status in ENDED:
            return "left"
        pending = [g for g in view.pending_gates() if g.kind != "message"]
        items = close_others(view, None, why)
        if outcome == "rejected" and pending:
            first = min(pending, key=lambda g: g.requested_at)
            items.append((L.RUN_REJECTED, {"node": first.node, "error": {
                "type": "rejected", "node": first.node, "message": why}}))
        else:
            fields: dict[str, object] = {"error": {"type": "cancelled", "node": None,
                                                   "message": why}}
            if by is not None:
                fields["by"] = by
            items.append((L.RUN_CANCELLED, fields))
        await Journal(store, child, view, loaded.writer(),
                      claim=_claim_of(owner, generation)).commit(items)
    finally:
        await _give_back(store, child, owner)
    await close_children(store, child, view, loaded.plan, by)
    return "closed"


async def _give_back(store: Store, child: str, owner: str) -> None:
    """The claim taken to close ``child`` given back. A release the store refuses is
    said, not raised: the error that counts is the close's, if it failed; the claim's
    lease runs out, and a look after that closes the child (or finds it closed)."""
    try:
        await store.release(child, owner)
    except ClaimError:
        pass
    except InterlockError as exc:
        log.warning("child run %s: the claim taken to close it was not given back (%s); "
                    "it can be claimed again once its lease runs out (%.0f s)", child,
                    exc, LEASE_SECONDS)


async def close_stranded(store: Store, rows: Iterable[RunRow], *,
                         again: set[str] | None = None) -> set[str]:
    """The look of a list of waiting runs (whole rows: their ``options`` link a child to
    its parent): each waiting child whose parent no longer waits through it -- the parent
    ended, or the visit the child belonged to is over -- is closed (a process died
    between the parent's record and the child's). The ids of the runs closed. ``again``:
    given, it gets the ids of the children this look could not settle (the store failed,
    or another holds the child's claim), for a caller that looks at a child only when
    its parent moves (the server's inbox) to look at again."""
    closed: set[str] = set()
    parents: dict[str, Loaded | str | None] = {}
    for row in rows:
        link = row.options.get("parent")
        if row.summary.status != "WAITING_APPROVAL" or not isinstance(link, dict) \
                or not isinstance(link.get("run"), str):
            continue
        parent = link["run"]
        if parent not in parents:
            try:
                parents[parent] = await _parent(store, parent)
            except StoreError as exc:  # the store away: not now
                log.warning("the parent run %s of waiting run %s could not be read (the "
                            "next look tries again): %s", parent, row.run_id, exc)
                if again is not None:
                    again.add(row.run_id)
                continue
        found = parents[parent]
        if found is None:
            continue
        if isinstance(found, str):  # ended
            outcome, why = found.split(":", 1)
        else:
            if (link.get("node"), link.get("visit")) in found.view.running:
                continue
            outcome, why = _why(parent, found.view)
        done = await _guarded(store, parent, row.run_id, outcome, why, None)
        if done == "closed":
            closed.add(row.run_id)
        elif done != "left" and again is not None:
            again.add(row.run_id)
    return closed


async def _parent(store: Store, run_id: str) -> Loaded | str | None:
    """A waiting child's parent: ``"OUTCOME:WHY"`` when it ended, None when it may yet
    continue the child (FAILED: a resume runs its visit again; gone; a broken log), else
    it folded. `StoreError` when the store fails."""
    try:
        row = await store.get_run(run_id)
        if row.summary.status == "FAILED":
            return None
        loaded = await load_run(store, run_id)
    except (RunNotFound, LogError):  # (gone, a broken log: not now)
        return None
    except StoreError:
        raise
    except InterlockError:  # (a keyed log, an unreadable definition: not now)
        return None
    if loaded.view.status in ENDED:
        return ":".join(_why(run_id, loaded.view))
    return loaded


__all__ = ["Closing", "close_children", "close_stranded", "parent_of"]
