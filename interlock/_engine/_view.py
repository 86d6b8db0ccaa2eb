"""A run's view: what the fold (`_fold.RunView`) keeps, and its snapshot encoding.

`ViewData` holds the fields of a view -- the run's state, the visits ready, running
and completed, the decisions owed, gates, effects, tokens, status -- and encodes them
(`ViewData.dump`, `ViewData.restore`). It changes them in no other way: how each record
changes them is the fold's (`_fold.RunView`, a `ViewData` with ``apply``). The parts
the view holds per visit are here too: `Visit`, `MapRun`, `Gate`, `Writer`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

from .._definition._plan import Plan
from .._json import JSON, JSONObject
from ._flow import Due, Flow

# Tokens: each is counted once, whichever records carry it. An attempt's closing record
# (completed, failed, retrying, paused) carries everything the attempt spent; an
# ``effect.recorded`` carries what was spent up to that effect, committed with its result
# so that a crash after it cannot lose it. So the fold counts a closing record's tokens
# less the attempt's ``effect_tokens`` (what its effects carried), which starts again at
# 0 with each attempt (``node.started``). ``Visit.tokens`` adds up every attempt of the
# visit: a node's ``tokens:`` budget is per visit, across its retries.


@dataclass(slots=True)
class Visit:
    node: str
    visit: int
    attempt: int
    started_seq: int
    tokens: int = 0  # recorded so far by all its attempts (a node's `tokens:` is per visit)
    failures: int = 0  # attempts that failed (what `retry.attempts` counts)
    effect_tokens: int = 0  # of the current attempt's, those its effects' records carried

    def encode(self) -> list[object]:
        """Its snapshot encoding: its fields, in order (``Visit(*encoded)`` restores it)."""
        return [self.node, self.visit, self.attempt, self.started_seq, self.tokens,
                self.failures, self.effect_tokens]


@dataclass(slots=True)
class MapRun:
    """A mapped node's visit: its items, the update of each item completed so
    far (merged, or collected, when the last one completes), the item visits running."""

    items: list[JSON]
    done: dict[int, JSONObject] = field(default_factory=dict)
    running: dict[int, Visit] = field(default_factory=dict)

    def updates(self, collect: str | None) -> list[JSONObject]:
        """Its items' updates in item order, to merge through the reducers -- or, with
        ``collect``, one update that gathers them in a list under that field."""
        updates = [self.done.get(i, {}) for i in range(len(self.items))]
        if collect is None:
            return updates
        gathered: list[JSON] = [*updates]
        return [{collect: gathered}]


def gate_key(node: str, visit: int, item: int | None = None) -> tuple[str, int]:
    """A gate's key in `ViewData.gates`: (node, visit), or for the gate of item ``item``
    of a mapped node's visit, ``(f"{node}[{item}]", visit)``."""
    return (node, visit) if item is None else (f"{node}[{item}]", visit)


@dataclass(slots=True)
class Gate:
    """A visit waiting for (or given) a human decision."""

    node: str
    visit: int
    kind: str  # "approval" | "confirm" | "tool" (ctx.confirm inside a node, e.g. an agent's tool)
    requested_at: float
    show: JSONObject
    decisions: list[str]
    deadline: float | None = None
    decision: str | None = None  # approved | rejected | modified | timed_out
    body_started: bool = False  # a confirmed node's body has started
    key: str | None = None  # for kind "tool": the key the node asked under ("workflow": the child)
    # the JSON Schema a decision must satisfy: an approval's ``input:`` (its ``data``), a
    # guarded tool's arguments (a ``modify`` patch); None when the gate takes neither
    input: JSONObject | None = None
    path: str | None = None  # for kind "workflow": the nodes down to the child's gate
    item: int | None = None  # a mapped gate's item (its index, from 0): ``NODE[i]``
    child_kind: str | None = None  # for kind "workflow": the kind of the child's gate
    # for kind "workflow": every gate the child waits at (its ``waiting.pending``), each
    # named by its path from this run -- what this run's ``waiting.pending`` lists
    children: list[JSONObject] | None = None

    def encode(self) -> list[object]:
        """Its snapshot encoding: its fields, in order (``Gate(*encoded)`` restores it)."""
        return [self.node, self.visit, self.kind, self.requested_at, self.show,
                self.decisions, self.deadline, self.decision, self.body_started, self.key,
                self.input, self.path, self.item, self.child_kind, self.children]

    @property
    def slot(self) -> tuple[str, int]:
        """Its key in `ViewData.gates`: (node, visit); a mapped item's ``(NODE[i], visit)``."""
        return gate_key(self.node, self.visit, self.item)

    def waiting(self) -> JSONObject:
        """The ``waiting`` object of a waiting run (a child run's gate: ``node`` is its path;
        a map item's, ``NODE[i]`` and ``item``)."""
        name = self.path or (self.node if self.item is None else f"{self.node}[{self.item}]")
        out: JSONObject = {"node": name, "kind": self.child_kind or self.kind,
                           "show": self.show, "decisions": [*self.decisions],
                           "requested_at": self.requested_at,
               "deadline": self.deadline}
        if self.item is not None:
            out["item"] = self.item
        if self.key is not None:
            out["key"] = self.key
        if self.input is not None:
            out["input"] = self.input
        return out


class Writer(NamedTuple):
    """The last completion that wrote a field. (A named tuple: one per completion.)"""

    node: str
    completed_seq: int


@dataclass(slots=True)
class ViewData:
    """A run's view as data (see the module's docstring); `_fold.RunView` folds into it."""

    plan: Plan
    state: JSONObject = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    running: dict[tuple[str, int], Visit] = field(default_factory=dict)
    due: dict[tuple[int, str], Due] = field(default_factory=dict)
    visits: Counter[str] = field(default_factory=Counter)  # completed visits per node
    started: Counter[str] = field(default_factory=Counter)  # visit numbers handed out
    takes: Counter[int] = field(default_factory=Counter)  # edge index -> times taken
    steps: int = 0
    tokens: int = 0
    seq: int = 0
    config: JSONObject = field(default_factory=dict)  # effective, with every override
    limits: dict[str, int] = field(default_factory=dict)
    parent: tuple[str, int] | None = None  # (run, seq) this run was forked from
    status: str = "PENDING"
    error: JSONObject | None = None
    waiting: JSONObject | None = None
    writers: dict[str, Writer] = field(default_factory=dict)
    # a `ctx.once` result by (node, visit, key) -- key (item, key) for a mapped node's item
    effects: dict[tuple[str, int, str | tuple[int, str]], JSON] = field(default_factory=dict)
    # mapped nodes' visits (map) by (node, visit), and the item lists of map
    # edges taken, by target, until its visit starts
    maps: dict[tuple[str, int], MapRun] = field(default_factory=dict)
    map_items: dict[str, deque[list[JSON]]] = field(default_factory=dict)
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
    # the latest ``run.migrated`` (its ``to_hash``, ``at_node`` and ``code``),
    # and how a definition it moves to becomes a plan (the loader's: executable or for
    # reading); a view never migrated has neither
    migration: dict[str, Any] | None = None
    plans: Callable[[JSONObject], Plan] | None = None
    format: int = 1  # the log's format (`_log.FORMAT`), as its ``run.started`` says
    # the seq the log's latest snapshot covers, as the load found it (not in a snapshot:
    # the journal that continues the run takes its next one `_snapshot.EVERY` after it)
    snapshot_at: int = 0

    def __post_init__(self) -> None:
        # every node is present in ``visits`` so that ``run.visits.x`` is 0, not missing
        self.visits.update(self.plan.no_visits)
        self.flow = Flow(self.plan, self.ready, self.running, self.due)

    # -- reading -------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.ready and not self.running and not self.due

    def pending_gates(self) -> list[Gate]:
        return [g for g in self.gates.values() if g.decision is None]

    # -- the snapshot codec (``_snapshot`` adds the version and binds it to the chain) ---

    def dump(self) -> dict[str, object]:
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
            # a migrated view is not restored (`_snapshot.load`): its plan is not the row's
            **({"migration": self.migration} if self.migration is not None else {}),
            **({"format": self.format} if self.format != 1 else {}),
        }

    @classmethod
    def restore(cls, plan: Plan, seq: int, d: dict[str, Any]) -> Self:
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
        v.gates = {gate.slot: gate for gate in (Gate(*g) for g in d["gates"])}
        v.confirmations = {(n, vis, key): dec for n, vis, key, dec in d["confirmations"]}
        v.routed = d["routed"]
        v.route_wait = Counter(d["route_wait"])
        v.maps = {(n, vis): MapRun(items, {int(i): u for i, u in done},
                                   {int(i): Visit(*r) for i, r in zip(idx, running, strict=True)})
                  for n, vis, items, done, running, idx in d["maps"]}
        v.map_items = {t: deque(q) for t, q in d["map_items"].items()}
        v.format = d.get("format", 1)
        v.flow = Flow(plan, v.ready, v.running, v.due)  # on the restored containers
        v.flow.restore(d)
        return v
