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
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import _log as L
from .._definition._model import END, ERROR_FIELD
from .._definition._plan import Plan
from .._definition._state import merge_update
from .._errors import InternalError
from ._flow import Due, Flow


@dataclass(slots=True)
class Visit:
    node: str
    visit: int
    attempt: int
    started_seq: int
    tokens: int = 0  # recorded so far by all its attempts (a node's `tokens:` is per visit)
    failures: int = 0  # attempts that failed (what `retry.attempts` counts)
    effect_tokens: int = 0  # of the current attempt's, those its effects' records carried

    def encode(self) -> list[Any]:
        """Its snapshot encoding: its fields, in order (``Visit(*encoded)`` restores it)."""
        return [self.node, self.visit, self.attempt, self.started_seq, self.tokens,
                self.failures, self.effect_tokens]


@dataclass(slots=True)
class MapRun:
    """A mapped node's visit (SPEC §7): its items, the update of each item completed so
    far (merged, or collected, when the last one completes), the item visits running."""

    items: list[Any]
    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    running: dict[int, Visit] = field(default_factory=dict)


@dataclass(slots=True)
class Gate:
    """A visit waiting for (or given) a human decision."""

    node: str
    visit: int
    kind: str  # "approval" | "confirm" | "tool" (ctx.confirm inside a node, e.g. an agent's tool)
    requested_at: float
    show: dict[str, Any]
    decisions: list[str]
    deadline: float | None = None
    decision: str | None = None  # approved | rejected | modified | timed_out
    body_started: bool = False  # a confirmed node's body has started
    key: str | None = None  # for kind "tool": the key the node asked under ("workflow": the child)
    # the JSON Schema a decision must satisfy: an approval's ``input:`` (its ``data``), a
    # guarded tool's arguments (a ``modify`` patch); None when the gate takes neither
    input: dict[str, Any] | None = None
    path: str | None = None  # for kind "workflow": the nodes down to the child's gate

    def encode(self) -> list[Any]:
        """Its snapshot encoding: its fields, in order (``Gate(*encoded)`` restores it)."""
        return [self.node, self.visit, self.kind, self.requested_at, self.show,
                self.decisions, self.deadline, self.decision, self.body_started, self.key,
                self.input, self.path]

    def waiting(self) -> dict[str, Any]:
        """The ``waiting`` object of SPEC §3 (a child run's gate: ``node`` is its path)."""
        out = {"node": self.path or self.node, "kind": self.kind, "show": self.show,
               "decisions": self.decisions, "requested_at": self.requested_at,
               "deadline": self.deadline}
        if self.key is not None:
            out["key"] = self.key
        if self.input is not None:
            out["input"] = self.input
        return out


class Writer(NamedTuple):
    """The last completion that wrote a field. (A named tuple: one per completion.)"""

    node: str
    completed_seq: int


_new_writer = functools.partial(tuple.__new__, Writer)  # no Python-level __new__ call


@dataclass(slots=True)
class RunView:
    plan: Plan
    state: dict[str, Any] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    running: dict[tuple[str, int], Visit] = field(default_factory=dict)
    due: dict[tuple[int, str], Due] = field(default_factory=dict)
    visits: Counter[str] = field(default_factory=Counter)  # completed visits per node
    started: Counter[str] = field(default_factory=Counter)  # visit numbers handed out
    takes: Counter[int] = field(default_factory=Counter)  # edge index -> times taken
    steps: int = 0
    tokens: int = 0
    seq: int = 0
    config: dict[str, Any] = field(default_factory=dict)  # effective, with every override
    limits: dict[str, Any] = field(default_factory=dict)
    parent: tuple[str, int] | None = None  # (run, seq) this run was forked from
    status: str = "PENDING"
    error: dict[str, Any] | None = None
    waiting: dict[str, Any] | None = None
    writers: dict[str, Writer] = field(default_factory=dict)
    # a `ctx.once` result by (node, visit, key) -- key (item, key) for a mapped node's item
    effects: dict[tuple[str, int, Any], Any] = field(default_factory=dict)
    # mapped nodes' visits (SPEC §7 map) by (node, visit), and the item lists of map
    # edges taken, by target, until its visit starts
    maps: dict[tuple[str, int], MapRun] = field(default_factory=dict)
    map_items: dict[str, deque[list[Any]]] = field(default_factory=dict)
    # human gates (approval nodes and confirm: true), by visit; see `Gate`
    gates: dict[tuple[str, int], Gate] = field(default_factory=dict)
    confirmations: dict[tuple[str, int, str], str] = field(default_factory=dict)
    # No silent dead ends through joins: for the latest completion of a node, whether
    # any edge (its own, or a join it arrived at) took it somewhere, and how many of its
    # joins are still undecided. The runner reads both before recording a decision.
    routed: dict[str, bool] = field(default_factory=dict)
    route_wait: Counter[str] = field(default_factory=Counter)
    # joins, dead paths, loop exits, quiescence: the flow machine, on ready/running/due
    flow: Flow = field(init=False)

    # -- applying records ----------------------------------------------------------

    def __post_init__(self) -> None:
        # every node is present in ``visits`` so that ``run.visits.x`` is 0, not missing
        self.visits.update(self.plan.no_visits)
        self.flow = Flow(self.plan, self.ready, self.running, self.due)

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
        defaults = rec.get("defaults")  # what declared fields start as (SPEC §7)
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
        tokens = rec.get("tokens") or 0
        if v is not None:
            tokens = max(0, tokens - v.effect_tokens)
        self._spend(node, visit, tokens)

    def _merge_items(self, node: str, m: MapRun, seq: int) -> None:
        """A mapped node's visit completed: its items' updates, in item order, merged
        through the reducers -- or, with ``collect``, gathered in a list under that field."""
        edge = self.plan.nodes[node].mapped
        collect = edge.spec.collect if edge is not None else None
        updates = [m.done.get(i, {}) for i in range(len(m.items))]
        if collect is not None:
            updates = [{collect: updates}]
        writer = _new_writer((node, seq))
        for update in updates:
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
        if pn.cyclic:
            self.flow.active[pn.scc] -= 1
        self.routed[node] = False
        self.route_wait[node] = pn.joins_out
        reenter = rec.get("reenter")
        if reenter is not None:  # a modified approval: the run goes back to ``reenter``
            self.flow.enqueue(reenter)
            return
        goto = rec.get("goto")
        for e in pn.out:
            if e.is_join and node in e.barrier:
                self.flow.barrier(e, node, True)
            else:
                self.due[(e.index, node)] = Due(e, node, goto if e.kind == "choose" else None)
        if pn.errors:  # it did not fail: its error edges are not taken
            self.flow.dead_edges(pn.errors)

    def _on_node_failed(self, rec: L.Record) -> None:
        if "caught" in rec:
            self._on_caught(rec)
            return
        visit = self._attempt_visit(rec)
        if visit is not None and (rec.get("error") or {}).get("type") != "cancelled":
            visit.failures += 1  # (a cancelled visit was stopped, not failed)
        self._attempt_ended(rec)

    def _on_caught(self, rec: L.Record) -> None:
        """A visit failed with an error one of its error edges catches (SPEC §7): the
        visit is over (it does not run again on resume), the error is written to the
        reserved ``error`` field, its other edges are not taken, and the catching edge
        is due (the runner decides it in the same batch)."""
        node = rec["node"]
        key = (node, rec["visit"])
        self._attempt_ended(rec)
        self.running.pop(key, None)
        if self.maps:  # a mapped node's visit, one of whose items failed: it is over
            self.maps.pop(key, None)
        if self.gates:
            self.gates.pop(key, None)
        if self.maps:  # a mapped node's visit: an item failed, the others were stopped
            self.maps.pop(key, None)
        self.visits[node] += 1
        pn = self.plan.nodes[node]
        if pn.cyclic:
            self.flow.active[pn.scc] -= 1
        caught = rec["caught"]
        self.state[ERROR_FIELD] = caught["error"]
        self.routed[node] = False
        self.route_wait[node] = 0
        self.flow.rule_out(node)  # its ordinary edges: not taken (its joins: not arrived)
        edge = caught["edge"]
        for e in pn.errors:
            if e.index == edge:
                self.due[(e.index, node)] = Due(e, node)
        self.flow.dead_edges([e for e in pn.errors if e.index != edge])

    def _on_node_retrying(self, rec: L.Record) -> None:
        self.status = "RETRYING"  # until the next attempt starts (visible in `status`)
        visit = self._attempt_visit(rec)
        if visit is not None:
            visit.failures += 1
        self._attempt_ended(rec)  # the failed attempt's tokens were spent

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
        self.due.pop((index, source), None)
        taken_here = rec["type"] == L.EDGE_TAKEN
        taken = (rec.get("to") or ()) if taken_here else ()
        if taken_here:
            self.takes[index] = self.takes.get(index, 0) + 1
            self.routed[source] = True
        arrived_from = rec.get("arrived")
        if arrived_from:  # a settled join: its sources' route
            for arrived in arrived_from:
                self.route_wait[arrived] -= 1
                if taken_here:
                    self.routed[arrived] = True
        if e.mapping is not None and taken:  # its items, for the visit it starts
            self.map_items.setdefault(taken[0], deque()).append(rec.get("value") or [])
        # Each target of the edge is delivered to (taken) or sent a dead signal (not).
        # A back edge (from a node of the loop it closes) has no port: taken, it starts
        # a new iteration; not taken, it signals nothing -- the loop's exits say where
        # the run goes instead. A forward edge resolves its target's port.
        back = source in e.back_sources
        ports = e.ports
        single_port = self.plan.single_port
        for t in e.targets:
            if t == END:
                continue
            port = ports.get(t)
            if t in taken:
                if port is None or back:
                    self.flow.enqueue(t)  # a back edge: a new iteration, no port to resolve
                elif port.exit_scc is None and t in single_port:
                    self.flow.enqueue(t)  # its only way in, taken: nothing else to settle
                else:
                    self.flow.taken_port(port)
            elif port is not None and not back:
                self.flow.dead_port(port)

    def _on_run_forked(self, rec: L.Record) -> None:
        self.parent = (rec["parent_run"], rec["parent_seq"])
        self._on_run_resumed(rec)
        self._on_state_patched(rec)
        for d in rec.get("deadlines") or ():  # a gate the fork waits at gets its own time
            gate = self.gates.get((d["node"], d["visit"]))
            if gate is not None:
                gate.deadline = d["deadline"]

    def _on_state_patched(self, rec: L.Record) -> None:
        # a patch replaces top-level fields, bypassing reducers (SPEC §3, modify)
        self.state.update(rec.get("patch") or {})

    def _on_approval_requested(self, rec: L.Record) -> None:
        key = (rec["node"], rec["visit"])
        if _mid_body(rec.get("kind"), rec.get("key")):  # paused mid-body (ctx.confirm)
            self._attempt_ended(rec)
        self.gates[key] = Gate(rec["node"], rec["visit"], rec["kind"], rec["at"],
                               rec.get("show") or {}, rec["decisions"], rec.get("deadline"),
                               key=rec.get("key"), input=rec.get("input"),
                               path=rec.get("path"))

    def _on_approval_decided(self, rec: L.Record) -> None:
        gate = self.gates[(rec["node"], rec["visit"])]
        gate.decision = rec["decision"]
        if _mid_body(gate.kind, gate.key):
            # the node asked mid-body (ctx.confirm, a child's gate): it runs again and
            # finds the answer
            self.confirmations[(gate.node, gate.visit, rec["key"])] = rec["decision"]
            self.gates.pop((gate.node, gate.visit))
        elif gate.kind == "confirm" and gate.decision != "approved":
            # the body never runs: the visit ends here (the run ends REJECTED)
            self.gates.pop((gate.node, gate.visit))
            self.running.pop((gate.node, gate.visit), None)

    def pending_gates(self) -> list[Gate]:
        return [g for g in self.gates.values() if g.decision is None]

    def _on_effect(self, rec: L.Record) -> None:
        key = rec["key"] if "item" not in rec else (rec["item"], rec["key"])
        self.effects[(rec["node"], rec["visit"], key)] = rec.get("result")
        # what the effect spent (an LLM call's usage), committed with its result: a crash
        # after it, a retry or a cancellation does not lose it, a replay does not repeat it
        self._spend(rec["node"], rec["visit"], rec.get("tokens"))
        if "steps" in rec:  # a child run's steps count in its parent too (SPEC §7)
            self.steps += rec["steps"]
        running = self._attempt_visit(rec)
        if running is not None and rec.get("tokens"):
            running.effect_tokens += rec["tokens"]

    def _on_terminal(self, rec: L.Record) -> None:
        self.status = L.TERMINAL_TYPES[rec["type"]]
        self.error = rec.get("error")
        self.waiting = None  # a run cancelled while it waited waits no more

    def _on_waiting(self, rec: L.Record) -> None:
        self.status = "WAITING_APPROVAL"
        self.waiting = rec.get("waiting")


    # -- the snapshot codec (``_snapshot`` adds the version and binds it to the chain) ---

    def dump(self) -> dict[str, Any]:
        """The view's fields after ``seq``, as JSON values, in the snapshot's key order.

        The encoding is explicit, field by field: JSON has no tuples, sets or int keys.
        `restore` reads it back; changing either changes the snapshot format (and
        ``_snapshot.VERSION`` with it)."""
        return {
            "state": self.state, "ready": list(self.ready),
            "running": [x.encode() for x in self.running.values()],
            "due": [[d.edge.index, d.source, d.goto, list(d.arrived)]
                    for d in self.due.values()],
            "visits": dict(self.visits), "started": dict(self.started),
            "takes": list(self.takes.items()), "steps": self.steps, "tokens": self.tokens,
            "config": self.config, "limits": self.limits,
            "parent": list(self.parent) if self.parent else None, "status": self.status,
            "error": self.error, "waiting": self.waiting,
            "writers": {k: [w.node, w.completed_seq] for k, w in self.writers.items()},
            "effects": [[n, vis, key, val] for (n, vis, key), val in self.effects.items()],
            "gates": [g.encode() for g in self.gates.values()],
            "confirmations": [[n, vis, key, d]
                              for (n, vis, key), d in self.confirmations.items()],
            "routed": self.routed, "route_wait": dict(self.route_wait),
            **self.flow.dump(),
            "maps": [[n, vis, m.items, list(m.done.items()),
                      [x.encode() for x in m.running.values()], list(m.running)]
                     for (n, vis), m in self.maps.items()],
            "map_items": {t: list(q) for t, q in self.map_items.items() if q},
        }

    @classmethod
    def restore(cls, plan: Plan, seq: int, d: dict[str, Any]) -> RunView:
        """The view `dump` wrote as ``d``, at record ``seq``. Raises KeyError, IndexError,
        TypeError or ValueError when ``d`` is not such a dump."""
        v = cls(plan)
        v.seq = seq
        v.state = d["state"]
        v.ready = deque(d["ready"])
        v.running = {(r[0], r[1]): Visit(*r) for r in d["running"]}
        v.due = {(i, src): Due(plan.edges[i], src, goto, tuple(arr))
                 for i, src, goto, arr in d["due"]}
        v.visits = Counter(d["visits"])
        v.started = Counter(d["started"])
        v.takes = Counter({int(k): n for k, n in d["takes"]})
        v.steps, v.tokens = d["steps"], d["tokens"]
        v.config, v.limits = d["config"], d["limits"]
        v.parent = (d["parent"][0], d["parent"][1]) if d["parent"] else None
        v.status, v.error, v.waiting = d["status"], d["error"], d["waiting"]
        v.writers = {k: Writer(n, s) for k, (n, s) in d["writers"].items()}
        v.effects = {(n, vis, key if isinstance(key, str) else tuple(key)): val
                     for n, vis, key, val in d["effects"]}
        v.gates = {(g[0], g[1]): Gate(*g) for g in d["gates"]}
        v.confirmations = {(n, vis, key): dec for n, vis, key, dec in d["confirmations"]}
        v.routed = d["routed"]
        v.route_wait = Counter(d["route_wait"])
        v.maps = {(n, vis): MapRun(items, {int(i): u for i, u in done},
                                   {int(i): Visit(*r) for i, r in zip(idx, running, strict=True)})
                  for n, vis, items, done, running, idx in d["maps"]}
        v.map_items = {t: deque(q) for t, q in d["map_items"].items()}
        v.flow = Flow(plan, v.ready, v.running, v.due)  # on the restored containers
        v.flow.restore(d)
        return v

    # -- reading -------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.ready and not self.running and not self.due


class Scope:
    """A lazy mapping for expression evaluation: only the names an expression reads
    are looked up, so a condition costs the same in a 10- or a 10 000-node graph.
    It reads the view as it is at each lookup."""

    __slots__ = ("_view",)

    def __init__(self, view: RunView) -> None:
        self._view = view

    def __getitem__(self, name: str) -> Any:
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

    @property
    def ok(self) -> bool:
        return self.status == "COMPLETED"

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "status": self.status,
                "state": self.state, "steps": self.steps, "tokens": self.tokens,
                "error": self.error, "waiting": self.waiting}


def result_of(run_id: str, workflow: str, view: RunView) -> RunResult:
    return RunResult(run_id=run_id, workflow=workflow, status=view.status,
                     state=dict(view.state), steps=view.steps, tokens=view.tokens,
                     error=view.error, waiting=view.waiting)


_MID_BODY = frozenset({"tool", "workflow"})  # gates asked for from inside a node's body

def _mid_body(kind: Any, key: Any) -> bool:
    """Whether a gate of ``kind`` was asked for from inside a node's body: a guarded
    tool's, a child run's, a guarded tool's unknown outcome (which has a key; a ``confirm:
    true`` node's unknown outcome has none)."""
    return kind in _MID_BODY or (kind == "unknown_outcome" and key is not None)


_ENDED = frozenset({"COMPLETED", "REJECTED", "CANCELLED"})  # (a FAILED run may go on)

_HANDLERS = {
    L.RUN_STARTED: RunView._on_run_started,
    L.RUN_RESUMED: RunView._on_run_resumed,
    L.RUN_FORKED: RunView._on_run_forked,
    L.STATE_PATCHED: RunView._on_state_patched,
    L.NODE_STARTED: RunView._on_node_started,
    L.NODE_COMPLETED: RunView._on_node_completed,
    L.NODE_FAILED: RunView._on_node_failed,
    L.NODE_RETRYING: RunView._on_node_retrying,
    L.EDGE_TAKEN: RunView._on_edge,
    L.EDGE_SKIPPED: RunView._on_edge,
    L.EFFECT_RECORDED: RunView._on_effect,
    L.APPROVAL_REQUESTED: RunView._on_approval_requested,
    L.APPROVAL_DECIDED: RunView._on_approval_decided,
    L.RUN_COMPLETED: RunView._on_terminal,
    L.RUN_FAILED: RunView._on_terminal,
    L.RUN_REJECTED: RunView._on_terminal,
    L.RUN_CANCELLED: RunView._on_terminal,
    L.RUN_WAITING: RunView._on_waiting,
}
