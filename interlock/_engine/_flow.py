"""The flow machine: where the run may go next, from the edges decided so far.

The fold (`_fold.RunView`) hands it every edge decision and every completion; it
keeps, for each node and join, what has arrived, and says which nodes are ready, which
edge decisions are due, and which nodes will not run. It owns no state of the run's
fields, visits or gates, only the bookkeeping of delivery and dead paths.

Its vocabulary
--------------
- a *port* (`Plan.ports`) is one forward way into a node: one edge's entry into one
  target. A node with several ports (``a -> c``, ``b -> c``) may run once per edge
  taken; it is ruled out only when every port of one *activation* is resolved and none
  was taken.
- an *activation* (``acts[node]``, a FIFO of ``{port id: taken}``) groups one
  resolution of each of a node's ports, in arrival order: the n-th resolution of a port
  belongs to the n-th activation that does not have it yet.
- a *barrier* (``barriers[edge]``, a FIFO of ``{source: arrived}``) is a join edge's
  waiting room: one entry per round, filled by its sources as they complete (arrived)
  or are ruled out (not arrived). A full entry with any arrival makes the join's
  decision *due* (``Due(edge, "*", arrived=...)``); one with none sends dead signals on.
- a *deferred exit* (``deferred[scc]``) is a dead signal that leaves a cyclic
  component -- a port or a barrier entry outside it. It waits (see "Loop exits");
  ``taken_exits[scc]`` records the exits taken meanwhile.
- ``active[scc]`` counts the component's nodes that are ready or running.

Invariants
----------
1. ``ready``, ``running`` and ``due`` are the view's own containers (shared, never
   replaced): the flow machine and the fold see one truth.
2. ``active[scc]`` counts the component's deliveries not yet completed: `enqueue`
   adds one, the fold takes one away when the visit completes (or fails, caught). A
   failed visit that will run again stays counted: its component is not idle.
3. A dead signal inside a component, or leaving an acyclic node, is resolved at once;
   one leaving a cyclic component is resolved only when ``active[scc]`` is 0 and no
   decision is due, and then only if the same exit was not taken meanwhile.
4. Ruling out is a worklist (`rule_out`), never recursion: its order is the order
   nodes were ruled out, and that order is part of the log (it orders the decisions
   that become due).
5. Everything here is a function of the records applied so far, in their order: a
   replay makes the same moves at the same records, which is what makes resume exact.

Dead paths
----------
Each node keeps a queue of *activations*; an activation records, per forward
port, whether it was taken or found dead. A taken port makes its node ready
at once (a node runs once per edge taken). When every port of the oldest
activation is resolved and none was taken, the node is ruled out and each of
its outgoing edges is resolved dead in turn -- a worklist, not recursion.

Loop exits
----------
Inside a loop, an exit edge not taken in one iteration may be taken in the
next::

    remediate -> verify --(retry)--> remediate        verify -> summary: otherwise

Ruling ``summary`` out after the first ``retry`` would be wrong, so dead
signals that leave a cyclic component are *deferred* until nothing inside it
is ready or running; then every exit not taken during that time is resolved
dead. Taken exits go through at once.

Quiescence
----------
The run is *quiescent* when nothing is ready, running or due: no pending join can
ever receive another arrival. Then (`quiesce`, called by the fold after each record)
any partially filled barrier or activation is settled with its missing entries
counted dead, one at a time, oldest component or edge first, until something is
ready or due again or nothing is left. So a join fires with the branches that did
run and never hangs. All of this happens at the same records on replay.

    record applied --> due empty? --yes--> deferred exits, or nothing ready/running?
                                                 |yes
                                   flush the idle components' exits, then
                                   settle partial barriers / activations
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._definition._model import END
from .._definition._plan import Plan, PlanEdge, PlanNode, Port


@dataclass(slots=True)
class Due:
    """An edge decision owed. ``source`` is the completed node (``*`` for a settled join)."""

    edge: PlanEdge
    source: str
    goto: str | None = None  # the target a ``choose`` node returned
    arrived: tuple[str, ...] = ()  # a settled join: the sources that completed


# -- deferred loop exits ---------------------------------------------------------------
#
# A dead signal that leaves a cyclic component waits (see "Loop exits" above) until
# nothing inside the component is ready or running. Two kinds of signal can leave one:
# a forward port of a node outside it, and a source's entry into a join barrier outside
# it. Each is a small value, kept in a set per component -- ``_deferred`` for the dead
# ones, ``_taken_exits`` for those taken meanwhile (a taken one cancels its dead twin
# when the component goes idle; an exit is then resolved dead at most once).


@dataclass(frozen=True, slots=True)
class PortExit:
    """A loop exit through a forward port (``Plan.ports[port]``)."""

    port: int

    def __hash__(self) -> int:  # the hash of its encoding: the same set order as before
        return hash(("port", self.port))

    def encode(self) -> tuple[str, int]:
        """Its snapshot encoding (a JSON list), also its place in the flush order."""
        return ("port", self.port)


@dataclass(frozen=True, slots=True)
class BarrierExit:
    """A loop exit through a join: ``source``'s entry into edge ``edge``'s barrier."""

    edge: int
    source: str

    def __hash__(self) -> int:
        return hash(("barrier", self.edge, self.source))

    def encode(self) -> tuple[str, int, str]:
        return ("barrier", self.edge, self.source)


DeferredExit = PortExit | BarrierExit


def _exit_order(item: DeferredExit) -> str:
    # Exits are flushed in the order of their encodings' reprs: the order every stored
    # log was written in (a different order would resolve ports, and so record edge
    # decisions, in another order than a replay of an old log expects).
    return repr(item.encode())


def _decode_exit(x: object) -> DeferredExit:
    match x:
        case ["port", int(port)]:
            return PortExit(port)
        case ["barrier", int(edge), str(source)]:
            return BarrierExit(edge, source)
    raise ValueError(f"not a deferred loop exit: {x!r}")


@dataclass(slots=True)
class Flow:
    """The flow machine of one run's view (see the module's docstring)."""

    plan: Plan
    # the view's containers (invariant 1): nodes delivered to but not started, the
    # visits running (only their count matters here), the edge decisions owed
    ready: deque[str]
    running: Mapping[tuple[str, int], object]
    due: dict[tuple[int, str], Due]
    acts: dict[str, deque[dict[int, bool]]] = field(default_factory=dict)
    barriers: dict[int, deque[dict[str, bool]]] = field(default_factory=dict)
    active: Counter[int] = field(default_factory=Counter)  # cyclic scc -> ready+running
    deferred: dict[int, set[DeferredExit]] = field(default_factory=dict)
    taken_exits: dict[int, set[DeferredExit]] = field(default_factory=dict)
    # nodes being ruled out, while `rule_out` drains them (None otherwise: not state)
    _ruling: deque[str] | None = None

    def _dead_edges(self, edges: list[PlanEdge]) -> None:
        """Edges of a node that will not be taken this time (its error edges when it
        completes; the other error edges when one catches): their targets' ports die."""
        for e in edges:
            for t in e.targets:
                port = e.ports.get(t)
                if port is not None:
                    self.dead_port(port)

    # -- delivery and dead paths -------------------------------------------------------

    def completed(self, pn: PlanNode, goto: str | None, reenter: str | None,
                  owed: Sequence[PlanEdge] | None = None) -> None:
        """``pn``'s visit completed: each of its edges' decisions is due (``goto``: the
        target a ``choose`` node returned), or its entry into a join's barrier arrived;
        its error edges are dead. A modified approval sends the run back to ``reenter``
        instead, and decides nothing. ``owed``: the edges whose decisions are due, when
        not all of ``pn.out`` (format 2: the others' are implied by theirs)."""
        node = pn.name
        if pn.cyclic:
            self.active[pn.scc] -= 1  # (invariant 2)
        if reenter is not None:
            self.enqueue(reenter)
            return
        for e in pn.out if owed is None else owed:
            if e.is_join and node in e.barrier:
                self.barrier(e, node, True)
            else:
                # (a goto is the node's whole routing: its other edges see it too, and
                # are not taken -- `_decide`)
                self.due[(e.index, node)] = Due(e, node, goto)
        if pn.errors:  # it did not fail: its error edges are not taken
            self._dead_edges(pn.errors)

    def caught(self, pn: PlanNode, edge: int) -> None:
        """``pn``'s visit failed and its error edge ``edge`` catches the error: that edge's
        decision is due; its ordinary edges and its other error edges are dead."""
        node = pn.name
        if pn.cyclic:
            self.active[pn.scc] -= 1  # (invariant 2)
        self.rule_out(node)  # its ordinary edges: not taken (its joins: not arrived)
        for e in pn.errors:
            if e.index == edge:
                self.due[(e.index, node)] = Due(e, node)
        self._dead_edges([e for e in pn.errors if e.index != edge])

    def decided(self, e: PlanEdge, source: str, taken: Collection[str]) -> None:
        """Edge ``e`` was decided for ``source`` (a node, or ``*`` for a join): each of its
        targets in ``taken`` is delivered to, each other one is sent a dead signal."""
        # A back edge (from a node of the loop it closes) has no port: taken, it starts
        # a new iteration; not taken, it signals nothing -- the loop's exits say where
        # the run goes instead. A forward edge resolves its target's port.
        back = source in e.back_sources
        ports = e.ports
        for t in e.targets:
            if t == END:
                continue
            port = ports.get(t)
            if t in taken:
                if port is None or back:
                    self.enqueue(t)  # a back edge: a new iteration, no port to resolve
                elif port.exit_scc is None and t in self.plan.single_port:
                    self.enqueue(t)  # its only way in, taken: nothing else to settle
                else:
                    self.taken_port(port)
            elif port is not None and not back:
                self.dead_port(port)


    def enqueue(self, node: str) -> None:
        # the one way a node becomes ready (invariant 2 counts it here); ``ready`` is a
        # FIFO, so nodes start in the order they were delivered to, on every replay
        self.ready.append(node)
        pn = self.plan.nodes[node]
        if pn.cyclic:
            self.active[pn.scc] += 1

    def taken_port(self, port: Port) -> None:
        # a taken exit goes through at once, and is remembered for the component's next
        # flush: its dead twin from the same idle period must not rule its target out
        if port.exit_scc is not None:
            self.taken_exits.setdefault(port.exit_scc, set()).add(PortExit(port.id))
        self._resolve_port(port, True)

    def dead_port(self, port: Port) -> None:
        # a dead signal leaving a loop waits for the loop to go idle (invariant 3)
        if port.exit_scc is not None:
            self.deferred.setdefault(port.exit_scc, set()).add(PortExit(port.id))
            return
        self._resolve_port(port, False)

    def _resolve_port(self, port: Port, taken: bool) -> None:
        # A port's n-th resolution belongs to the oldest activation that lacks it (FIFO):
        # two deliveries to ``c`` through the same port are two activations, each waiting
        # for the other ports' n-th resolutions. A taken port delivers at once; the
        # activation only decides, once full, whether the node is ruled out.
        target = port.target
        if taken:
            self.enqueue(target)
        if target in self.plan.single_port:
            # one way in: each activation is settled by this port alone (the common case;
            # no queue to keep)
            if not taken:
                self.rule_out(target)
            return
        acts = self.acts.setdefault(target, deque())
        for act in acts:
            if port.id not in act:
                act[port.id] = taken
                break
        else:
            acts.append({port.id: taken})
        self._settle_acts(target, force=False)

    def _settle_acts(self, target: str, *, force: bool) -> None:
        # Full activations are settled oldest first. ``force`` (quiescence) settles the
        # oldest one as it is -- its missing ports can no longer resolve, so they count
        # dead -- and then only full ones: what it rules out may fill the next.
        acts = self.acts.get(target)
        nports = len(self.plan.nodes[target].ports)
        while acts and (len(acts[0]) == nports or force):
            act = acts.popleft()
            if not any(act.values()):
                self.rule_out(target)
            force = False

    def rule_out(self, node: str) -> None:
        """``node`` will not run in this activation: resolve each of its edges dead.

        A worklist, not recursion: ruling a node out can rule its successors out, and so
        on down a chain of any length (a skipped branch of 10,000 nodes). The first call
        drains the list; one made while it does (from `_resolve_port`, `_settle_acts`,
        `_settle_barrier`) only adds its node, in order."""
        work = self._ruling
        if work is not None:
            work.append(node)
            return
        self._ruling = work = deque((node,))
        try:
            while work:
                self._rule_out_one(work.popleft())
        finally:
            self._ruling = None

    def _rule_out_one(self, node: str) -> None:
        for e in self.plan.nodes[node].out:
            if e.is_join:
                if node in e.barrier:
                    self.barrier(e, node, False)
                continue
            for t in e.targets:
                port = e.ports.get(t)
                if port is not None:
                    self.dead_port(port)

    def barrier(self, e: PlanEdge, source: str, arrived: bool) -> None:
        # ``source`` completed (arrived) or was ruled out at join ``e``. A source inside a
        # loop whose join is outside it is a loop exit: an arrival goes through at once
        # (and is remembered as taken), a ruling-out waits for the loop to go idle.
        exit_scc = e.barrier_exit.get(source)
        if exit_scc is not None:
            if not arrived:
                self.deferred.setdefault(exit_scc, set()).add(BarrierExit(e.index, source))
                return
            self.taken_exits.setdefault(exit_scc, set()).add(BarrierExit(e.index, source))
        self._resolve_barrier(e, source, arrived)

    def _resolve_barrier(self, e: PlanEdge, source: str, arrived: bool) -> None:
        # One entry per round of the join, FIFO, as with activations: a source's n-th
        # signal fills the oldest entry it is missing from.
        # (a source in a loop before the join may arrive twice before another source
        # arrives once: its second arrival opens the next round, it does not overwrite)
        queue = self.barriers.setdefault(e.index, deque())
        for entry in queue:
            if source not in entry:
                if arrived:
                    entry[source] = True
                else:
                    entry[source] = False
                break
        else:
            queue.append({source: arrived})
        self._settle_barrier(e, force=False)

    def _settle_barrier(self, e: PlanEdge, *, force: bool) -> None:
        # A full entry (or, forced at quiescence, the oldest partial one) settles the
        # round: with any arrival the join's decision is due, naming the sources that
        # arrived, in the order they did; with none, the join's targets' ports die.
        queue = self.barriers.get(e.index)
        while queue and (len(queue[0]) == len(e.barrier) or force):
            entry = queue.popleft()
            force = False
            if any(entry.values()):
                # keyed (edge, "*"): the join is decided on its own, not with a node's
                # group; ``arrived`` goes into its record, and the fold's route
                # bookkeeping (``route_wait``, ``routed``) reads it from there
                arrived = tuple(src for src, ok in entry.items() if ok)
                self.due[(e.index, "*")] = Due(e, "*", arrived=arrived)
            else:
                for t in e.targets:
                    port = e.ports.get(t)
                    if port is not None:
                        self.dead_port(port)

    # -- quiescence --------------------------------------------------------------------

    def quiesce(self) -> None:
        """Flush loop exits of idle components, then settle what can no longer fill."""
        # Phase 1, per component: idle (nothing of it ready or running) and nothing due
        # anywhere -- ``due`` is checked again for each, a flush may make a decision due.
        # Phase 2, only when the whole run is quiescent: settle one waiting thing at a
        # time and look again, for settling one may deliver (and end the quiescence).
        for scc in [c for c, d in self.deferred.items() if d]:
            if self.active[scc] == 0 and not self.due:
                self._flush_exits(scc)
        while not self.ready and not self.running and not self.due:
            if not self._settle_partial():
                break

    def _flush_exits(self, scc: int) -> None:
        # An exit taken while the component ran cancels its dead signals of the same
        # idle period; both sets start empty again (the next iteration decides afresh).
        # Both sets are popped, not cleared: a component that never defers again costs
        # nothing more, and a snapshot taken after holds no empty entry for it.
        pending = self.deferred.pop(scc, set()) - self.taken_exits.pop(scc, set())
        for item in sorted(pending, key=_exit_order):
            match item:
                case PortExit(port):
                    self._resolve_port(self.plan.ports[port], False)
                case BarrierExit(edge, source):
                    self._resolve_barrier(self.plan.edges[edge], source, False)

    def _settle_partial(self) -> bool:
        # One step of phase 2, in a fixed order (deferred exits, then barriers, then
        # activations, each in its dict's insertion order): True if it settled one.
        # The order is part of the log's meaning: each settlement may make a decision
        # due, and decisions are recorded in the order they became due. Changing it
        # changes which records a replay of a stored log expects (the golden logs pin it).
        for scc in [c for c, d in self.deferred.items() if d]:
            self._flush_exits(scc)
            return True
        for index, queue in self.barriers.items():
            if queue:
                self._settle_barrier(self.plan.edges[index], force=True)
                return True
        for target, acts in self.acts.items():
            if acts:
                self._settle_acts(target, force=True)
                return True
        return False

    # -- the snapshot codec (a part of `RunView.dump`) -------------------------------

    def dump(self) -> dict[str, object]:
        """Its state as JSON values, in the snapshot's key order."""
        return {
            "acts": {t: [list(a.items()) for a in q] for t, q in self.acts.items() if q},
            "barriers": [[i, [list(e.items()) for e in q]]
                         for i, q in self.barriers.items() if q],
            "active": list(self.active.items()),
            "deferred": [[c, [list(x.encode()) for x in items]]
                         for c, items in self.deferred.items()],
            "taken_exits": [[c, [list(x.encode()) for x in items]]
                            for c, items in self.taken_exits.items()],
        }

    def restore(self, d: dict[str, Any]) -> None:
        """Its state from ``d`` (what `dump` wrote), in place of the present one."""
        self.acts = {t: deque({int(p): b for p, b in a} for a in q)
                     for t, q in d["acts"].items()}
        self.barriers = {int(i): deque({s: b for s, b in e} for e in q)
                         for i, q in d["barriers"]}
        self.active = Counter({int(c): n for c, n in d["active"]})
        self.deferred = {int(c): {_decode_exit(x) for x in items} for c, items in d["deferred"]}
        self.taken_exits = {int(c): {_decode_exit(x) for x in items}
                            for c, items in d["taken_exits"]}
