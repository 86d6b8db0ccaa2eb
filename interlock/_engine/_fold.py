"""The fold: a run's log -> what the run is now.

``RunView.apply(record)`` is the only way a run changes. Executing a run
appends records and applies them one by one; resuming a run applies the
stored records to a fresh view -- the same function, so the same result.
The view derives, from records alone:

- ``state``      the fields, merged with their reducers;
- ``ready``      nodes delivered to but not started (FIFO);
- ``running``    visits started and not completed (re-run these on resume);
- ``due``        edge decisions owed (a node completed, a join settled) that
                 the executor must make -- conditions, routers, gotos -- and
                 append as ``edge.taken`` / ``edge.skipped``;
- joins, dead paths and loop exits (``flow``), visits, steps, tokens, status.

Joins, dead paths, loop exits and quiescence are the flow machine's
(`_flow.Flow`, ``view.flow``): the view hands it each decision and completion; it
shares the view's ``ready``, ``running`` and ``due``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from .. import _log as L
from .._definition._model import ERROR_FIELD
from .._definition._plan import PlanEdge, PlanNode
from .._definition._state import merge_update
from .._errors import InternalError, UsageError
from ._flow import Due
from ._gates import shown
from ._migration import migrate
from ._view import Gate, MapRun, ViewData, Visit, Writer, gate_key

_new_writer = functools.partial(tuple.__new__, Writer)  # no Python-level __new__ call


class RunView(ViewData):
    """A run's view, changed only by `apply` (the view's fields: `ViewData`)."""

    __slots__ = ()

    # -- applying records ----------------------------------------------------------

    def apply(self, rec: L.Record) -> None:
        handler = _HANDLERS.get(rec["type"])
        if handler is not None and self.status in _ENDED and rec["type"] != L.RUN_FORKED:
            # nothing changes a run once it completed, was rejected or cancelled (a fork
            # is a new run: its run.forked re-opens the copied log)
            raise InternalError(f"record {rec['seq']} ({rec['type']}) comes after the run "
                                f"ended ({self.status}): no record changes a run that "
                                "completed, was rejected or was cancelled")
        self.seq = rec["seq"]
        if handler is not None:
            handler(self, rec)
        # The flow machine settles what waits (deferred loop exits, partial joins) only
        # when no decision is owed: a due decision may still deliver into a component or
        # a join. With deferred exits it looks even while other nodes run (a component can
        # be idle while the rest of the run is not); otherwise only once nothing is ready
        # or running. Either way, at the same record on every replay.
        if not self.due and (self.flow.deferred or not (self.ready or self.running)):
            self.flow.quiesce()

    def _on_run_started(self, rec: L.Record) -> None:
        self.state = dict(rec.get("input") or {})
        defaults = rec.get("defaults")  # what declared fields start as
        if defaults:
            self.state.update(defaults)
        self.config = dict(rec.get("config") or {})
        self.limits = dict(rec.get("limits") or {})
        # a detached run (``run --detach``) is PENDING until a worker executes it
        self.status = "PENDING" if rec.get("detached") else "RUNNING"
        for e in self.plan.start_edges:
            self.due[(e.index, "START")] = Due(e, "START")

    def _on_run_resumed(self, rec: L.Record) -> None:
        # A failed visit stays in ``running``: the executor runs it again.
        self.config.update(rec.get("config") or {})
        self.limits.update(rec.get("limits") or {})
        # a decision recorded for a worker to continue (``detached``) leaves it PENDING
        self.status = "PENDING" if rec.get("detached") else "RUNNING"
        self.error = None
        self.waiting = None

    def _on_node_started(self, rec: L.Record) -> None:
        node, visit = key = rec["node"], rec["visit"]
        if self.maps and "item" in rec:
            self._on_item_started(rec)
            return
        if key in self.running:  # a retry, a re-run, or a confirmed node's body starting
            self.running[key].attempt = rec.get("attempt", 1)
            self.running[key].effect_tokens = 0
            if self.status == "RETRYING":
                self.status = "RUNNING"
            gate = self.gates.get(key)
            if gate is not None and gate.decision == "approved":
                gate.body_started = True
            return
        # A first start takes one delivery off ``ready`` (a node delivered to twice is
        # there twice: visits n and n+1); its number is the record's (`Runner` numbers it).
        try:
            self.ready.remove(node)
        except ValueError:
            raise InternalError(f"record {rec['seq']}: node {node!r} started but was not "
                                "ready") from None
        if visit > self.started.get(node, 0):
            self.started[node] = visit
        self.steps += 1
        self.running[key] = Visit(node, visit, rec.get("attempt", 1), rec["seq"])
        if self.map_items:
            queue = self.map_items.get(node)
            if queue:  # a mapped node's visit: its items are its steps, not the visit
                self.maps[key] = MapRun(queue.popleft())
                self.steps -= 1

    # -- the items of a mapped node's visit (records with an ``item``) -------------------

    def _on_item_started(self, rec: L.Record) -> None:
        m = self.maps[(rec["node"], rec["visit"])]
        item = rec["item"]
        v = m.running.get(item)
        if self.gates:  # an approved confirm: true item's body starting (`_item_gates`)
            gate = self.gates.get(gate_key(rec["node"], rec["visit"], item))
            if gate is not None and gate.decision == "approved":
                gate.body_started = True
        if v is None:
            self.steps += 1  # each item is a step
            m.running[item] = Visit(rec["node"], rec["visit"], rec.get("attempt", 1),
                                    rec["seq"])
            return
        v.attempt = rec.get("attempt", 1)  # a retry, or a re-run after a resume
        v.effect_tokens = 0
        if self.status == "RETRYING":
            self.status = "RUNNING"

    def _on_item_completed(self, rec: L.Record) -> None:
        node, visit, item = rec["node"], rec["visit"], rec["item"]
        m = self.maps[(node, visit)]
        v = m.running.pop(item, None)
        m.done[item] = rec.get("update") or {}
        if self.gates:  # a mapped gate's item, decided
            self.gates.pop(gate_key(node, visit, item), None)
        tokens = rec.get("tokens") or 0
        if v is not None:
            tokens = max(0, tokens - v.effect_tokens)
        self._spend(node, visit, tokens)

    def _merge_items(self, node: str, m: MapRun, seq: int) -> None:
        """A mapped node's visit completed: its items' updates merged (`MapRun.updates`)."""
        edge = self.plan.nodes[node].mapped
        writer = _new_writer((node, seq))
        for update in m.updates(edge.spec.collect if edge is not None else None):
            if update:
                merge_update(self.state, update, self.plan.reducers)
                for field_name in update:
                    self.writers[field_name] = writer

    def _attempt_visit(self, rec: L.Record) -> Visit | None:
        """The visit an attempt's record is about: an item's, or the node's."""
        key = rec["node"], rec["visit"]
        if self.maps and "item" in rec:
            m = self.maps.get(key)
            return m.running.get(rec["item"]) if m is not None else None
        return self.running.get(key)

    def _on_node_completed(self, rec: L.Record) -> None:
        key = rec["node"], rec["visit"]
        node = key[0]
        if self.maps:
            if "item" in rec:
                self._on_item_completed(rec)
                return
            m = self.maps.pop(key, None)
            if m is not None:
                self._merge_items(node, m, rec["seq"])
        visit = self.running.pop(key, None)
        update = rec.get("update")
        if update:
            # the last completion to write each field, by its seq: what the write-conflict
            # check (`NodeCall.write_conflict`) compares with a visit's start
            merge_update(self.state, update, self.plan.reducers)
            writer = _new_writer((node, rec["seq"]))
            for field_name in update:
                self.writers[field_name] = writer
        self.visits[node] += 1
        tokens = rec.get("tokens")
        if tokens:  # the attempt's; what its effects' records carried is counted already
            if visit is not None and visit.effect_tokens:
                tokens = max(0, tokens - visit.effect_tokens)
            self.tokens += tokens
        if self.gates:
            self.gates.pop(key, None)
        pn = self.plan.nodes[node]
        # the latest completion's routes start afresh: not routed yet, and every join it
        # feeds still to decide (`_decide.Decider._stranded` reads both)
        self.routed[node] = False
        self.route_wait[node] = pn.joins_out
        # its edges' decisions are due (a join's: its barrier is arrived at); a modified
        # approval (``reenter``) sends the run back to that node instead
        _completed(self, pn, rec)  # (format 2: edges it implies taken)

    def _on_node_failed(self, rec: L.Record) -> None:
        if "caught" in rec:
            self._on_caught(rec)
            return
        visit = self._attempt_visit(rec)
        if visit is not None and (rec.get("error") or {}).get("type") != "cancelled":
            visit.failures += 1  # (a cancelled visit was stopped, not failed)
        self._attempt_ended(rec)

    def _on_caught(self, rec: L.Record) -> None:
        """A visit failed with an error one of its error edges catches: the
        visit is over (it does not run again on resume), the error is written to the
        reserved ``error`` field, its other edges are not taken, and the catching edge
        is due (the runner decides it in the same batch)."""
        node = rec["node"]
        key = (node, rec["visit"])
        self._attempt_ended(rec)
        self.running.pop(key, None)
        if self.maps:  # a mapped node's visit, one of whose items failed: it is over
            self.maps.pop(key, None)
        if self.gates:  # its gate, or its items' gates (closed, or decided and not run)
            for slot in [s for s, g in self.gates.items() if (g.node, g.visit) == key]:
                del self.gates[slot]
        self.visits[node] += 1
        caught = rec["caught"]
        self.state[ERROR_FIELD] = caught["error"]
        self.routed[node] = False
        self.route_wait[node] = 0
        self.flow.caught(self.plan.nodes[node], caught["edge"])

    def _on_node_retrying(self, rec: L.Record) -> None:
        self.status = "RETRYING"  # until the next attempt starts (visible in `status`)
        visit = self._attempt_visit(rec)
        if visit is not None:
            visit.failures += 1
        self._attempt_ended(rec)  # the failed attempt's tokens were spent

    # -- tokens (each counted once: see `_view.Visit`) ------------------------------

    def _attempt_ended(self, rec: L.Record) -> None:
        """An attempt ended without completing (failed, retrying, paused for a human): its
        ``tokens`` were spent, less what its effects' records carried (counted already)."""
        node, visit = rec["node"], rec["visit"]
        running = self._attempt_visit(rec)
        tokens = rec.get("tokens") or 0
        if running is not None:
            tokens = max(0, tokens - running.effect_tokens)
            running.effect_tokens = 0
        self._spend(node, visit, tokens)

    def _spend(self, node: str, visit: int, tokens: int | None) -> None:
        """Tokens a record says were spent: the run's, the node's, the running visit's."""
        if tokens:
            self.tokens += tokens
            running = self.running.get((node, visit))
            if running is not None:
                running.tokens += tokens

    def _on_edge(self, rec: L.Record) -> None:
        index = rec["edge"]
        e = self.plan.edges[index]
        source = rec.get("from", "*")
        # the decision owed is paid: `Decider.due` loops until ``due`` is empty, and
        # relies on each decision it stages removing its own due here
        self.due.pop((index, source), None)
        taken_here = rec["type"] == L.EDGE_TAKEN
        taken = rec.get("to", ()) if taken_here else ()
        if taken_here:
            self.takes[index] += 1
            self.routed[source] = True
        arrived_from = rec.get("arrived")
        if arrived_from:  # a settled join: its sources' route
            for arrived in arrived_from:
                self.route_wait[arrived] -= 1
                if taken_here:
                    self.routed[arrived] = True
        if e.mapping is not None and taken:  # its items, for the visit it starts
            self.map_items.setdefault(taken[0], deque()).append(rec.get("value") or [])
        # last: delivering may make nodes ready and settle joins (new dues), which must
        # see the route bookkeeping above already done
        _decided(self, e, source, taken, taken_here)  # (format 2: and what it implies)

    def _on_run_forked(self, rec: L.Record) -> None:
        self.parent = (rec["parent_run"], rec["parent_seq"])
        self._on_run_resumed(rec)
        self._on_state_patched(rec)
        for d in rec.get("deadlines") or ():  # a gate the fork waits at gets its own time
            gate = self.gates.get((d["node"], d["visit"]))
            if gate is not None:
                gate.deadline = d["deadline"]

    def _on_state_patched(self, rec: L.Record) -> None:
        # a patch replaces top-level fields, bypassing reducers (a modify decision)
        self.state.update(rec.get("patch") or {})

    def _on_approval_requested(self, rec: L.Record) -> None:
        item = rec.get("item")
        key = gate_key(rec["node"], rec["visit"], item)
        if _mid_body(rec.get("kind"), rec.get("key")):  # paused mid-body (ctx.confirm)
            self._attempt_ended(rec)
        self.gates[key] = Gate(rec["node"], rec["visit"], rec["kind"], rec["at"],
                               rec.get("show") or {}, rec["decisions"], rec.get("deadline"),
                               key=rec.get("key"), input=rec.get("input"),
                               path=rec.get("path"), item=item,
                               child_kind=rec.get("child_kind"),
                               children=rec.get("pending"))

    def _on_approval_decided(self, rec: L.Record) -> None:
        if (gate := _decided_gate(self, rec)) is None:
            return  # (closed after it was decided: see `_decided_gate`)
        gate.decision = rec["decision"]
        if gate.item is not None:  # a mapped item's gate: its item's completion follows
            return
        if _mid_body(gate.kind, gate.key):
            # the node asked mid-body (ctx.confirm, a child's gate): it runs again and
            # finds the answer
            self.confirmations[(gate.node, gate.visit, rec["key"])] = rec["decision"]
            self.gates.pop((gate.node, gate.visit))
        elif gate.kind == "confirm" and gate.decision != "approved":
            # the body never runs: the visit ends here (the run ends REJECTED)
            self.gates.pop((gate.node, gate.visit))
            self.running.pop((gate.node, gate.visit), None)

    def _on_effect(self, rec: L.Record) -> None:
        # ``ctx.once``'s journal: the result by (node, visit, key) -- not by attempt, so
        # a retry or a re-run after a crash finds it and does not run the effect again
        key = rec["key"] if "item" not in rec else (rec["item"], rec["key"])
        self.effects[(rec["node"], rec["visit"], key)] = rec.get("result")
        # what the effect spent (an LLM call's usage), committed with its result: a crash
        # after it, a retry or a cancellation does not lose it, a replay does not repeat it
        self._spend(rec["node"], rec["visit"], rec.get("tokens"))
        if "steps" in rec:  # a child run's steps count in its parent too
            self.steps += rec["steps"]
        running = self._attempt_visit(rec)
        if running is not None and rec.get("tokens"):
            running.effect_tokens += rec["tokens"]


# -- log formats 2 and 3: records the fold implies (`_log.FORMAT`) ---------------------
#
# Each function below does what the fold of the record(s) it stands for would do, at the
# record that implies them, in the order the records would have come: a format-1 log and
# its format-2 twin fold to the same view record for record, and a format-3 log to its
# format-2 twin's views (tests/engine/test_format.py).


def _on_started(view: RunView, rec: L.Record) -> None:
    """``run.started``, and the log's format (format 2 implies some records)."""
    fmt = rec.get("format", 1)
    if type(fmt) is not int or not 1 <= fmt <= L.READS:
        raise UsageError(f"record {rec['seq']}: the run's log is in format {fmt!r}, and "
                         f"this version of interlock reads formats 1 to {L.READS}: a newer "
                         "version wrote it -- read or continue the run with that version")
    view._on_run_started(rec)
    view.format = fmt


def _on_visited(view: RunView, rec: L.Record) -> None:
    """``node.visited``: the visit's ``node.started`` and ``node.completed`` at once; in
    format 3, with a ``when``, then its ``when`` edge's record (`_when_record`)."""
    view._on_node_started(rec)
    view._on_node_completed(rec)
    when = rec.get("when")
    if when is not None:
        view._on_edge(_when_record(view, rec, when))


def _when_record(view: RunView, rec: L.Record, when: object) -> L.Record:
    """Log format 3: the edge record a ``node.visited``'s ``when`` stands for; refused
    where the engine would not write one (before format 3, not a `Plan.implied_when`
    node, not its ``when`` edge, a decision its completion did not make due: a goto)."""
    node = rec["node"]
    owed = view.plan.implied_when.get(node) if view.format > 2 else None
    if not isinstance(when, dict) or owed is None or when.get("edge") != owed[0].index \
            or (owed[0].index, node) not in view.due:
        if view.format < 3:
            why = f"a log of format {view.format} never holds one"
        elif owed is None:
            why = (f"{node!r} is not a node whose edges are one `when` edge and its "
                   "`otherwise` edges (the only nodes whose visit carries one)")
        else:
            why = (f"its completion owed no decision of that edge (its `when` edge is "
                   f"edge {owed[0].index}, decided only after a completion without a goto)")
        raise InternalError(f"record {rec['seq']}: the node.visited of {node!r} carries an "
                            f"edge decision (`when`: {when!r}), but {why}: the engine did "
                            "not write it")
    return {**when, "from": node, "seq": rec["seq"], "at": rec.get("at"),
            "type": L.EDGE_TAKEN if when.get("to") else L.EDGE_SKIPPED}


def when_decided(view: RunView, rec: L.Record) -> None:
    """Fold the ``when`` decision (``rec``: its edge record) a format-3 ``node.visited``
    will carry, made just after its completion's fold (`end_visit`, `_staging`): what
    `RunView.apply` does with the edge's record, the view's seq already the visit's."""
    view._on_edge(rec)
    if not view.due and (view.flow.deferred or not (view.ready or view.running)):
        view.flow.quiesce()


def start_visit(view: RunView, rec: L.Record) -> None:
    """Fold the ``node.started`` of an inline visit, which the executor defers
    (`_staging.Staging.defer`): what `RunView.apply` does with it, less the look at
    quiescence, which finds nothing to settle after a start: the run is not quiescent
    (the visit runs), and no loop went idle since the last record's look (the
    scheduler starts a visit only once nothing is due, so that look was made; a start
    only makes its loop busier). A replay's look at this record finds the same."""
    if view.status in _ENDED:
        raise InternalError(f"record {rec['seq']} ({rec['type']}) comes after the run "
                            f"ended ({view.status})")
    view.seq = rec["seq"]
    view._on_node_started(rec)


def end_visit(view: RunView, rec: L.Record) -> None:
    """Fold a ``node.visited`` whose start the view has folded already: the executor
    folds a visit's start when it starts (`_journal.Journal.defer`) and seals it as
    ``node.visited`` with its completion when nothing was recorded in between."""
    if view.status in _ENDED:
        raise InternalError(f"record {rec['seq']} ({rec['type']}) comes after the run "
                            f"ended ({view.status})")
    view.seq = rec["seq"]
    view._on_node_completed(rec)
    if not view.due and (view.flow.deferred or not (view.ready or view.running)):
        view.flow.quiesce()


def _completed(view: RunView, pn: PlanNode, rec: L.Record) -> None:
    """The flow machine told of ``pn``'s completion; in format 2 (no goto, no
    ``reenter``): of an implied-otherwise node, only its ``when`` edge's decision made
    due (its record implies the ``otherwise`` edges': `_otherwise`); of a
    `Plan.always_taken` node, the ``edge.taken`` of each edge: what `RunView._on_edge`
    does for each, in the order they were written."""
    node = pn.name
    if view.format < 2 or "goto" in rec or "reenter" in rec:
        view.flow.completed(pn, rec.get("goto"), rec.get("reenter"))
        return
    if node not in view.plan.always_taken:  # (an implied-otherwise node: its `when` alone)
        view.flow.completed(pn, None, None, view.plan.implied_when.get(node))
        return
    # what `Flow.completed` and each edge's `_on_edge` would do, with no decision made due
    # only to be popped again (the hot path of a chain; no error edges, no joins here)
    takes, flow = view.takes, view.flow
    if pn.cyclic:
        flow.active[pn.scc] -= 1  # (the flow machine's invariant 2)
    view.routed[node] = True
    for e in pn.out:
        takes[e.index] += 1
        flow.decided(e, node, e.targets)


def _decided(view: RunView, e: PlanEdge, source: str, taken: Collection[str],
             taken_here: bool) -> None:
    """The flow machine told of edge ``e``'s decision (its targets ``taken``); then, in
    format 2, what its record implies (`_otherwise`)."""
    view.flow.decided(e, source, taken)
    if view.format > 1:
        edges = view.plan.implied_otherwise.get(e.index)
        if edges is not None and source != "*":
            _otherwise(view, edges, source, not taken_here)


def _otherwise(view: RunView, edges: tuple[PlanEdge, ...], source: str, taken: bool
               ) -> None:
    """In format 2, after the record of the one ``when`` edge of a
    `Plan.implied_otherwise` node ``source``, those of its ``otherwise`` ``edges``: each
    ``taken`` (the ``when`` was not) or skipped."""
    for e in edges:
        view.due.pop((e.index, source), None)
        if taken:
            view.takes[e.index] += 1
            view.routed[source] = True
        view.flow.decided(e, source, e.targets if taken else ())


class Scope:
    """A lazy mapping for expression evaluation: only the names an expression reads
    are looked up, so a condition costs the same in a 10- or a 10 000-node graph.
    It reads the view as it is at each lookup."""

    __slots__ = ("_view",)

    def __init__(self, view: RunView) -> None:
        self._view = view

    def __getitem__(self, name: str) -> object:
        if name == "config":
            return self._view.config
        if name == "run":
            v = self._view
            return {"visits": v.visits, "step": v.steps, "tokens": v.tokens}
        return self._view.state[name]

    def __contains__(self, name: object) -> bool:
        return name in ("config", "run") or name in self._view.state



@dataclass(frozen=True, slots=True)
class RunResult:
    """Where a run stands, as its log has it: what ``interlock status RUN_ID --json``
    prints (and the server's run object)."""

    run_id: str
    workflow: str
    status: str
    state: dict[str, Any]
    steps: int
    tokens: int
    error: dict[str, Any] | None
    waiting: dict[str, Any] | None
    # the nodes still to run whose code changed since the run started (or was
    # migrated); in the JSON object only when there are some
    code_changed: list[str] | None = field(default=None, kw_only=True)

    @property
    def ok(self) -> bool:
        return self.status == "COMPLETED"

    def to_json(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "workflow": self.workflow, "status": self.status,
               "state": self.state, "steps": self.steps, "tokens": self.tokens,
               "error": self.error, "waiting": self.waiting}
        if self.code_changed:
            out["code_changed"] = self.code_changed
        return out


def result_of(run_id: str, workflow: str, view: RunView) -> RunResult:
    """The run as its surfaces show it: WAITING_APPROVAL while a gate waits, also while
    its executor runs other branches (`_gates.shown`)."""
    status, waiting = shown(view)
    return RunResult(run_id=run_id, workflow=workflow, status=status,
                     state=dict(view.state), steps=view.steps, tokens=view.tokens,
                     error=view.error, waiting=waiting)


_MID_BODY = frozenset({"tool", "workflow", "message"})  # gates asked for from inside a node's body

def _mid_body(kind: Any, key: Any) -> bool:
    """Whether a gate of ``kind`` was asked for from inside a node's body: a guarded
    tool's, a child run's, a guarded tool's unknown outcome (which has a key; a ``confirm:
    true`` node's unknown outcome has none)."""
    return kind in _MID_BODY or (kind == "unknown_outcome" and key is not None)


def _decided_gate(view: RunView, rec: L.Record) -> Gate | None:
    """The gate an ``approval.decided`` decides; None for a ``closed`` one whose gate is
    gone: decided earlier in the same batch (its node completed), then closed by a
    rejection folded in after it -- which an older interlock could stage (it folded
    two offered decisions against the same view); nothing is left to close."""
    gate = view.gates.get(gate_key(rec["node"], rec["visit"], rec.get("item")))
    if gate is None and rec["decision"] != "closed":
        raise InternalError(f"record {rec['seq']}: a decision on gate {rec['node']!r} "
                            f"(visit {rec['visit']}), which does not wait")
    return gate


def _on_terminal(view: RunView, rec: L.Record) -> None:
    view.status = L.TERMINAL_TYPES[rec["type"]]
    view.error = rec.get("error")
    view.waiting = None  # a run cancelled while it waited waits no more


def _on_waiting(view: RunView, rec: L.Record) -> None:
    view.waiting = rec.get("waiting")
    # a conversation waiting for its next message is not waiting for an approval
    message = (view.waiting or {}).get("kind") == "message"
    view.status = "WAITING_INPUT" if message else "WAITING_APPROVAL"


_ENDED = frozenset({"COMPLETED", "REJECTED", "CANCELLED"})  # (a FAILED run may go on)

_HANDLERS = {
    L.RUN_STARTED: _on_started,
    L.RUN_RESUMED: RunView._on_run_resumed,
    L.RUN_FORKED: RunView._on_run_forked,
    L.RUN_MIGRATED: migrate,  # onto another definition: `_migration`
    L.STATE_PATCHED: RunView._on_state_patched,
    L.NODE_STARTED: RunView._on_node_started,
    L.NODE_COMPLETED: RunView._on_node_completed,
    L.NODE_VISITED: _on_visited,
    L.NODE_FAILED: RunView._on_node_failed,
    L.NODE_RETRYING: RunView._on_node_retrying,
    L.EDGE_TAKEN: RunView._on_edge,
    L.EDGE_SKIPPED: RunView._on_edge,
    L.EFFECT_RECORDED: RunView._on_effect,
    L.APPROVAL_REQUESTED: RunView._on_approval_requested,
    L.APPROVAL_DECIDED: RunView._on_approval_decided,
    L.RUN_COMPLETED: _on_terminal,
    L.RUN_FAILED: _on_terminal,
    L.RUN_REJECTED: _on_terminal,
    L.RUN_CANCELLED: _on_terminal,
    L.RUN_WAITING: _on_waiting,
}
