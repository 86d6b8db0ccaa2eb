"""The plan: a validated `WorkflowSpec` compiled for execution.

Compiling resolves every ``module:function``, compiles every CEL expression
once, and finds the graph facts the scheduler needs (back edges, cyclic
components, the forward "ports" through which a node can be reached). The
plan is immutable and shared by every run of the workflow.

Ports
-----
A *port* is one way a node can be reached by a forward edge: a pair (edge,
target) whose edge is not a back edge for that target. A node's activation
is settled once every one of its ports has been resolved (taken or dead);
if none was taken the node is ruled out (dead) for that activation, and
that ruling flows downstream. Back edges have no port: taking one starts a
new iteration of its target, and not taking it rules nothing out.

A join edge (``from: [a, b]``) has a *barrier* over its forward sources;
the barrier settles when each has completed (arrived) or been ruled out.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from ._edge import EdgeSpec
from ._expr import Expression
from ._graph import Concurrency, back_edges, sccs
from ._kinds import NodeKind
from ._model import END, START, NodeSpec, WorkflowSpec
from ._signature import param_count

DEFAULT_TIMEOUT = 300.0
_NO_ARGS: Mapping[str, object] = MappingProxyType({})


@dataclass(slots=True, eq=False)
class Port:
    id: int
    edge: int
    target: str
    exit_scc: int | None  # cyclic component this port leaves, if any


@dataclass(slots=True, eq=False)
class PlanEdge:
    index: int
    spec: EdgeSpec
    kind: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]  # END included when declared
    cond: Expression | None = None
    switch: Expression | None = None
    router: Callable[..., Any] | None = None
    router_async: bool = False
    mapping: Expression | None = None  # a map edge's list expression
    max: int | None = None
    otherwise: bool = False
    barrier: tuple[str, ...] = ()  # forward sources a join waits for ()
    back_sources: frozenset[str] = frozenset()  # sources for which this edge is a back edge
    back_targets: frozenset[str] = frozenset()  # targets reached through a back edge
    ports: dict[str, Port] = field(default_factory=dict)  # target -> port (forward only)
    barrier_exit: dict[str, int] = field(default_factory=dict)  # source -> scc it leaves
    is_join: bool = False  # more than one source
    # an error edge (``on_error``): the exception class names it catches, () for any;
    # kept in `PlanNode.errors`, not `PlanNode.out` (decided only when its source fails)
    catches: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self.is_join = len(self.sources) > 1

    def name(self) -> str:
        return self.spec.describe()


ISOLATED, ASYNC, CTX, RETRY, ON_RAY = 1, 2, 4, 8, 16  # the bits of a `guard_kind`
GUARD_KINDS = 32


def guard_kind(isolated: bool, is_async: bool, needs_ctx: bool, retry: bool,
               on_ray: bool = False) -> int:
    """Which guards a node's call goes through (`_call.NodeCall` composes one stack per
    kind): a small int, so that finding a node's stack is indexing a list."""
    return ((ISOLATED * isolated) | (ASYNC * is_async) | (CTX * needs_ctx) | (RETRY * retry)
            | (ON_RAY * on_ray))


@dataclass(slots=True, eq=False)
class PlanNode:
    name: str
    spec: NodeSpec
    fn: Callable[..., Any] | None
    is_async: bool
    wants_ctx: bool
    reads: tuple[str, ...] | None
    writes: frozenset[str] | None
    timeout: float
    out: list[PlanEdge] = field(default_factory=list)
    ports: list[Port] = field(default_factory=list)
    scc: int = -1
    cyclic: bool = False
    joins_out: int = 0  # outgoing join edges that wait for this node (its barrier)
    gate: bool = False  # an approval node or ``confirm: true``: a human decides first
    isolated: bool = False  # ``isolation: process``
    needs_ctx: bool = False  # gets a Context: it takes ``ctx`` or runs in a worker process
    # below a branch of a fork: it may run concurrently with another node (a field both
    # write needs a reducer; `Plan.concurrency` says with which)
    branched: bool = False
    guards: int = 0  # the kind of its guard stack (`guard_kind`): which guards its call has
    mapped: PlanEdge | None = None  # the map edge that runs it once per item
    errors: list[PlanEdge] = field(default_factory=list)  # its on_error edges, in order
    args: Mapping[str, object] = field(default_factory=lambda: _NO_ARGS)  # ``args:``, read-only


@dataclass(slots=True, eq=False)
class Plan:
    spec: WorkflowSpec
    nodes: dict[str, PlanNode]
    edges: list[PlanEdge]
    start_edges: list[PlanEdge]
    ports: list[Port]
    reducers: dict[str, str]
    back: frozenset[tuple[str, str]]
    # nodes whose every outgoing edge is plain and unconditional (no when, max, otherwise,
    # join) and that are no human gate: their edges are always taken, nothing to evaluate
    always_taken: frozenset[str] = frozenset()
    no_visits: dict[str, int] = field(default_factory=dict)  # every node: 0 (a run's start)
    single_port: frozenset[str] = frozenset()  # nodes with exactly one way in
    concurrency: Concurrency | None = None  # from validation (None: a plan for reading)
    # nodes whose outgoing edges, in declaration order, already have their ``otherwise``
    # edges last: the order their edges are decided in (no sorting needed)
    in_decision_order: frozenset[str] = frozenset()
    approvals: frozenset[str] = frozenset()  # approval nodes (a rejection changes routing)
    async_routers: bool = False  # an edge has an ``async def`` router (awaited by the loop)
    guard_kinds: frozenset[int] = frozenset()  # its nodes' `PlanNode.guards`
    # log format 2 (`_log.FORMAT`): the ``otherwise`` edges a ``when`` edge's record
    # implies, by that edge's index -- a node (no gate) whose edges are one plain ``when``
    # and its ``otherwise`` edges, none a join: taken exactly when the ``when`` was not
    implied_otherwise: dict[int, tuple[PlanEdge, ...]] = field(default_factory=dict)
    # the same nodes' ``when`` edge (a 1-tuple), by node: in format 2 the only decision
    # their completion owes (the fold makes no due of the ``otherwise`` edges it implies)
    implied_when: dict[str, tuple[PlanEdge]] = field(default_factory=dict)
    # nodes whose body is an ``async def`` run in the event loop (`_guards.in_loop`, which
    # says when it first waits): an inline visit of one may be one ``node.visited``
    in_loop: frozenset[str] = frozenset()


def callable_params(fn: Callable[..., object]) -> int:
    """How many positional parameters ``fn`` takes (2 = it wants ``ctx``)."""
    return _remembered(_PARAMS, fn, param_count)


def is_async_callable(fn: Callable[..., object]) -> bool:
    return _remembered(_ASYNC, fn, _is_async_callable)


def _is_async_callable(fn: Callable[..., object]) -> bool:
    if asyncio.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - async __call__ on instances
    return call is not None and asyncio.iscoroutinefunction(call)


# what a function's signature says, while the function lives: a plan is built for each
# run a process loads, and a process may make its functions as it goes (a lambda per
# workflow it builds); a plain cache kept every one of them, and whatever they close
# over, for good
_PARAMS: weakref.WeakKeyDictionary[Callable[..., object], int] = weakref.WeakKeyDictionary()
_ASYNC: weakref.WeakKeyDictionary[Callable[..., object], bool] = weakref.WeakKeyDictionary()
_T = TypeVar("_T")


def _remembered(known: weakref.WeakKeyDictionary[Callable[..., object], _T],
                fn: Callable[..., object], compute: Callable[[Callable[..., object]], _T]
                ) -> _T:
    try:
        return known[fn]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable, or one no weak reference can point to
        return compute(fn)
    value = known[fn] = compute(fn)
    return value


def _adjacency(spec: WorkflowSpec) -> dict[str, list[str]]:
    # successors in declaration order, each once (a dict keeps both: no list scans)
    succ: dict[str, dict[str, None]] = {START: {}, **{n: {} for n in spec.nodes}}
    for e in spec.edges:
        targets = [t for t in e.targets if t != END]
        for s in e.source:
            succ.setdefault(s, {}).update(dict.fromkeys(targets))
    return {n: list(ts) for n, ts in succ.items()}


def build_plan(spec: WorkflowSpec, *, callables: dict[str, Callable[..., object]],
               expressions: dict[str, Expression],
               concurrency: Concurrency | None = None,
               kinds: Sequence[NodeKind] = ()) -> Plan:
    """Assemble the plan. ``callables`` maps every call path (nodes and routers) to its
    function and ``expressions`` every source text to its compiled form; both were
    resolved by validation, which also guaranteed the graph is well formed. ``kinds``
    build the bodies of the nodes they own."""
    adj = _adjacency(spec)
    back = frozenset(back_edges(adj, spec.nodes))
    comp, cyclic = _components(adj, spec)
    nodes = _plan_nodes(spec, callables, kinds, comp, cyclic)
    for name in concurrency.branched if concurrency is not None else ():
        nodes[name].branched = True
    edges, start_edges, ports = _wire_edges(spec, nodes, callables, expressions, back, comp,
                                            cyclic)
    implied = _implied_otherwise(nodes)
    return Plan(
        spec=spec, nodes=nodes, edges=edges, start_edges=start_edges, ports=ports,
        reducers={k: v.reducer for k, v in spec.state.items()},
        back=back,
        no_visits=dict.fromkeys(nodes, 0),
        single_port=frozenset(n for n, pn in nodes.items() if len(pn.ports) == 1),
        concurrency=concurrency,
        in_decision_order=frozenset(
            n for n, pn in nodes.items()
            if [e.otherwise for e in pn.out] == sorted(e.otherwise for e in pn.out)),
        approvals=frozenset(n for n, pn in nodes.items() if pn.spec.approval is not None),
        async_routers=any(e.router_async for e in edges),
        guard_kinds=frozenset(pn.guards for pn in nodes.values()),
        always_taken=frozenset(
            n for n, pn in nodes.items()
            if pn.out and not pn.gate and not pn.errors and all(
                e.kind == "plain" and e.cond is None and e.max is None and not e.otherwise
                and not e.is_join for e in pn.out)),
        implied_otherwise=implied,
        implied_when={edges[i].sources[0]: (edges[i],) for i in implied},
        in_loop=frozenset(n for n, pn in nodes.items()
                          if pn.guards & (ASYNC | ISOLATED | ON_RAY) == ASYNC),
    )


def _implied_otherwise(nodes: dict[str, PlanNode]) -> dict[int, tuple[PlanEdge, ...]]:
    """`Plan.implied_otherwise`: for each node whose edges are exactly one plain ``when``
    edge and ``otherwise`` edges (no join among them, no gate), the ``when`` edge's index
    and the ``otherwise`` edges, in declaration order (the order they are decided in)."""
    out: dict[int, tuple[PlanEdge, ...]] = {}
    for pn in nodes.values():
        whens = [e for e in pn.out if not e.otherwise]
        others = tuple(e for e in pn.out if e.otherwise)
        if pn.gate or len(whens) != 1 or not others or any(e.is_join for e in pn.out):
            continue
        when = whens[0]
        if when.kind == "plain" and when.cond is not None:
            out[when.index] = others
    return out


def _components(adj: dict[str, list[str]], spec: WorkflowSpec
                ) -> tuple[dict[str, int], set[int]]:
    """Each node's strongly connected component, and which components are cycles (more
    than one node, or one node with an edge to itself): a loop's body. A port or a
    barrier that leaves one is where a loop is exited (`Port.exit_scc`)."""
    comp = sccs(adj, spec.nodes)
    members: dict[int, set[str]] = {}
    for n, c in comp.items():
        members.setdefault(c, set()).add(n)
    cyclic = {c for c, m in members.items()
              if len(m) > 1 or any(n in adj.get(n, ()) for n in m)}
    return comp, cyclic


def _plan_nodes(spec: WorkflowSpec, callables: dict[str, Callable[..., object]],
                kinds: Sequence[NodeKind], comp: dict[str, int], cyclic: set[int]
                ) -> dict[str, PlanNode]:
    """Each node with its body (a call's function, or what its kind builds), how it is
    called (async, with ``ctx``, which guard stack) and its place in the graph."""
    limit_timeout = spec.limits.timeout or DEFAULT_TIMEOUT
    nodes: dict[str, PlanNode] = {}
    for name, ns in spec.nodes.items():
        fn = callables.get(ns.call) if ns.call else None
        for kind in kinds:  # an async fn(state, ctx) built from the node's block
            if kind.owns(ns):
                fn = kind.build(name, ns, callables=callables, workflow=spec)
        nodes[name] = PlanNode(
            name=name, spec=ns, fn=fn,
            is_async=bool(fn and is_async_callable(fn)),
            wants_ctx=bool(fn and callable_params(fn) >= 2),
            reads=tuple(ns.reads) if ns.reads is not None else None,
            writes=frozenset(ns.writes) if ns.writes is not None else None,
            timeout=ns.timeout or limit_timeout,
            scc=comp.get(name, -1), cyclic=comp.get(name, -1) in cyclic,
            gate=ns.approval is not None or ns.confirm,
            isolated=ns.isolation == "process",
        )
        pn = nodes[name]
        if ns.args:
            pn.args = MappingProxyType(ns.args)
        pn.needs_ctx = pn.wants_ctx or pn.isolated
        pn.guards = guard_kind(pn.isolated, pn.is_async, pn.needs_ctx, ns.retry is not None,
                               ns.executor == "ray")
    return nodes


def _wire_edges(spec: WorkflowSpec, nodes: dict[str, PlanNode],
                callables: dict[str, Callable[..., object]], expressions: dict[str, Expression],
                back: frozenset[tuple[str, str]], comp: dict[str, int], cyclic: set[int]
                ) -> tuple[list[PlanEdge], list[PlanEdge], list[Port]]:
    """Every edge planned and hung on its nodes: the edges, those from START, the ports.

    Invariants the flow machine (`_engine._flow`) relies on: a port exists for each
    (edge, target) that is not a back edge and not END, numbered in declaration order
    (`Port.id` is its index in ``ports``); a node's ``ports`` are every forward way in,
    so its activation settles once each is taken or dead. An error edge hangs on its
    source's ``errors``, never its ``out``: it is decided only when the source fails.
    ``joins_out`` counts the joins whose barrier waits for the node."""
    ports: list[Port] = []
    edges: list[PlanEdge] = []
    start_edges: list[PlanEdge] = []
    for i, es in enumerate(spec.edges):
        pe = _plan_edge(i, es, callables, expressions, back, comp, cyclic)
        for t in pe.targets:
            if t == END or t in pe.back_targets:
                continue
            # a port that leaves a loop's component: a dead signal on it waits until
            # nothing in the loop is ready or running (`_flow`, "Loop exits"), since a
            # later iteration may still take it
            src_scc = comp.get(pe.sources[0], -1) if not pe.is_join else -1
            exit_scc = src_scc if src_scc in cyclic and comp.get(t) != src_scc else None
            port = Port(len(ports), i, t, exit_scc)
            ports.append(port)
            pe.ports[t] = port
            nodes[t].ports.append(port)
        edges.append(pe)
        if pe.mapping is not None:
            nodes[pe.targets[0]].mapped = pe
        for s in pe.sources:
            if s == START:
                start_edges.append(pe)
            elif pe.catches is not None:
                nodes[s].errors.append(pe)
            else:
                nodes[s].out.append(pe)
                if pe.is_join and s in pe.barrier:
                    nodes[s].joins_out += 1
    return edges, start_edges, ports


def _plan_edge(i: int, es: EdgeSpec, callables: dict[str, Callable[..., object]],
               expressions: dict[str, Expression], back: frozenset[tuple[str, str]],
               comp: dict[str, int], cyclic: set[int]) -> PlanEdge:
    """One edge with its expressions, router, back-edge facts and join barrier."""
    pe = PlanEdge(index=i, spec=es, kind=es.kind, sources=tuple(es.source),
                  targets=tuple(es.targets), max=es.max, otherwise=es.otherwise,
                  catches=es.catches)
    if es.when is not None:
        pe.cond = expressions[es.when]
    if es.switch is not None:
        pe.switch = expressions[es.switch]
    if es.map is not None:
        pe.mapping = expressions[es.map]
    if es.router is not None and es.router in callables:
        pe.router = callables[es.router]
        pe.router_async = is_async_callable(pe.router)
    pe.back_sources = frozenset(s for s in pe.sources
                                if any((s, t) in back for t in pe.targets))
    pe.back_targets = frozenset(t for t in pe.targets
                                if all((s, t) in back for s in pe.sources))
    if pe.is_join:
        pe.barrier = tuple(s for s in pe.sources if s not in pe.back_sources)
        for s in pe.barrier:
            c = comp.get(s, -1)
            if c in cyclic and any(comp.get(t) != c for t in pe.targets if t != END):
                pe.barrier_exit[s] = c
    return pe
