"""Property-based tests of the scheduler's semantics (SPEC §1).

Hypothesis generates random DAGs (5-25 nodes; every node with several
predecessors is reached by one join; edges plain, ``when`` or ``otherwise``,
some fanning out, some to END, declared in random order; conditions over the
run's input flags and over ``run.visits`` of upstream nodes) and random inputs.
An oracle written independently of the engine propagates the run through the
graph in topological order:

- a plain edge is taken iff its source ran and its condition holds;
- an ``otherwise`` edge iff its source ran and none of the source's own
  ``when`` edges holds (a join's ``when`` is not one of them: it is decided
  later, once the join settles);
- a join is decided once every source has run or been ruled out, and fires iff
  at least one source ran; it is then taken iff its ``when`` (if any) holds;
- a node runs once per incoming edge taken: at most once, except the terminal
  join-less "multi" nodes (the diamond without a join) generated on purpose;
- a node that ran, has outgoing edges and none of them taken -- the join edge
  included -- is a dead end: the run fails with ``no_route`` (SPEC "No silent
  dead ends").

Every example runs twice with different random node delays (async and sync
nodes), so completion order varies while the outcome must not. Each run is
checked against the oracle -- which nodes ran and how often, every
``edge.taken`` / ``edge.skipped`` record (with its expression and value), the
final state, ``steps``, the status -- against the causal order of its own log,
and against the store: ``interlock.status`` (the run folded back from its log)
equals the live result and ``interlock.verify`` accepts the chain.

The loop property: a back edge with ``max: K`` (or a ``run.visits`` guard) is
taken exactly K times, a join inside the loop re-arms each iteration (also when
a branch is dead in some iterations), and a conditional exit from inside the
loop is taken in the iteration its guard names, or ruled out once the loop ends.

Known engine bug (kept failing on purpose, minimal case as an ``@example``):
a join whose ``when`` is false, from sources with no other outgoing edge,
ends the run COMPLETED -- a silent dead end -- instead of failing ``no_route``.
See `test_join_whose_condition_is_false_is_not_a_silent_dead_end`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

import interlock
from interlock import END, START, RunResult, Workflow
from interlock._store import open_store

# ---------------------------------------------------------------------------------------
# conditions: a tiny boolean language, rendered to CEL
# ---------------------------------------------------------------------------------------

# ("flag", i, positive)    flags.f<i> / !flags.f<i>                 (the run's input)
# ("ran", node, positive)  run.visits.<node> > 0 / run.visits.<node> == 0
# ("and" | "or", c, c)
#
# A "ran" atom only names the edge's source or one of its ancestors: those have
# completed or been ruled out before the edge is decided, so the value is the
# same whatever the timing.
Cond = tuple[Any, ...]


def cel(c: Cond) -> str:
    if c[0] == "flag":
        return f"flags.f{c[1]}" if c[2] else f"!flags.f{c[1]}"
    if c[0] == "ran":
        return f"run.visits.{c[1]} {'>' if c[2] else '=='} 0"
    op = " && " if c[0] == "and" else " || "
    return f"({cel(c[1])}{op}{cel(c[2])})"


def holds(c: Cond, flags: dict[str, bool], runs: Counter[str]) -> bool:
    if c[0] == "flag":
        return flags[f"f{c[1]}"] == c[2]
    if c[0] == "ran":
        return (runs[c[1]] > 0) == c[2]
    a, b = holds(c[1], flags, runs), holds(c[2], flags, runs)
    return (a and b) if c[0] == "and" else (a or b)


def pick(draw: st.DrawFn, seq: Sequence[Any]) -> Any:
    """``draw(st.sampled_from(seq))`` without building a strategy per call (generation
    speed: a 25-node graph makes a few hundred draws)."""
    return seq[draw(st.integers(0, len(seq) - 1))]


def draw_cond(draw: st.DrawFn, nflags: int, upstream: Sequence[str]) -> Cond:
    """A condition over the flags and over whether ``upstream`` nodes ran."""

    def literal() -> Cond:
        if upstream and draw(st.integers(0, 2)) == 0:
            return ("ran", pick(draw, upstream), draw(st.booleans()))
        return ("flag", draw(st.integers(0, nflags - 1)), draw(st.booleans()))

    if draw(st.integers(0, 3)) < 3:
        return literal()
    return (pick(draw, ["and", "or"]), literal(), literal())


# ---------------------------------------------------------------------------------------
# the generated graph
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EdgeDef:
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    when: Cond | None = None
    otherwise: bool = False

    @property
    def join(self) -> bool:
        return len(self.sources) > 1

    def builder(self) -> str:
        src = repr(list(self.sources)) if self.join else repr(self.sources[0])
        dst = repr(list(self.targets)) if len(self.targets) > 1 else repr(self.targets[0])
        extra = ""
        if self.when is not None:
            extra = f", when={cel(self.when)!r}"
        elif self.otherwise:
            extra = ", otherwise=True"
        return f"wf.edge({src}, {dst}{extra})"


@dataclass(frozen=True)
class GraphDef:
    nodes: tuple[str, ...]  # in topological order
    preds: dict[str, tuple[str, ...]]  # what each node reads (its declared predecessors)
    edges: tuple[EdgeDef, ...]  # in declaration order
    sync: frozenset[str]  # nodes with a sync function (the rest are async)
    multi: frozenset[str]  # terminal nodes reached by several plain edges (no join)
    nflags: int

    def builder(self) -> str:
        """The workflow as builder calls: what a failing example prints."""
        lines = [f"# nodes: {', '.join(self.nodes)}; sync: {sorted(self.sync)}; "
                 f"multi (join-less, add reducer): {sorted(self.multi)}"]
        lines += [e.builder() for e in self.edges]
        return "\n".join(lines)


_SINGLE_KINDS = ["plain", "plain", "plain", "when", "when", "otherwise"]
_FIRST_KINDS = ["plain", "plain", "plain", "plain", "when", "otherwise"]
_END_EDGES = [None, None, None, None, "otherwise", "otherwise", "when", "plain"]


Incoming = dict[str, list[tuple[str, str, "Cond | None"]]]  # target -> (source, kind, cond)


@st.composite
def graphs(draw: st.DrawFn, min_nodes: int = 5, max_nodes: int = 25) -> GraphDef:
    n = draw(st.integers(min_nodes, max_nodes))
    nflags = draw(st.integers(1, 4))
    names = [f"n{i}" for i in range(n)]
    preds = {name: _draw_preds(draw, names, i) for i, name in enumerate(names)}
    upstream: dict[str, set[str]] = {START: set()}  # a node and its ancestors
    for name in names:
        upstream[name] = {name}.union(*(upstream[p] for p in preds[name]))

    def cond(*sources: str) -> Cond:
        seen = set().union(*(upstream[s] for s in sources))
        return draw_cond(draw, nflags, sorted(seen, key=names.index))

    incoming: Incoming = {}  # plain edges, by target (END included)
    joins: dict[str, Cond | None] = {}  # join target -> its condition

    def single(target: str, source: str) -> None:
        # (the first node's START edge is mostly plain: the rest of the graph gets a run)
        kind = pick(draw, _FIRST_KINDS if target == "n0" else _SINGLE_KINDS)
        incoming.setdefault(target, []).append(
            (source, kind, cond(source) if kind == "when" else None))

    for name in names:
        if len(preds[name]) == 1:
            single(name, preds[name][0])
        else:
            joins[name] = cond(*preds[name]) if draw(st.integers(0, 4)) == 0 else None
    # A terminal node with several predecessors may instead be reached by one plain
    # edge from each: it then runs once per edge taken (SPEC: the join-less diamond).
    used = {p for ps in preds.values() for p in ps}
    multi = set()
    for name in list(joins):
        if name not in used and draw(st.booleans()):
            multi.add(name)
            del joins[name]
            for s in preds[name]:
                single(name, s)
    # extra edges to END (conditional, otherwise or plain) on some non-multi nodes
    for name in names:
        kind = pick(draw, _END_EDGES) if name not in multi else None
        if kind is not None:
            incoming.setdefault(END, []).append(
                (name, kind, cond(name) if kind == "when" else None))
    edges = _plain_edges(draw, incoming)
    edges += [EdgeDef(preds[target], (target,), when=c) for target, c in joins.items()]
    edges = draw(st.permutations(edges))
    sync = frozenset(name for name in names if draw(st.integers(0, 2)) == 0)
    return GraphDef(tuple(names), preds, tuple(edges), sync, frozenset(multi), nflags)


def _draw_preds(draw: st.DrawFn, names: list[str], i: int) -> tuple[str, ...]:
    """1..3 distinct predecessors of node ``i`` among the earlier nodes (or START)."""
    if i == 0:
        return (START,)
    k = draw(st.integers(1, min(3, i)))
    if k == 1:
        # START may feed a few early nodes too (the first node is not the only root)
        return (pick(draw, [START, *names[:i]] if i < 4 else names[:i]),)
    pool = names[:i]
    srcs = [pool.pop(draw(st.integers(0, len(pool) - 1))) for _ in range(k)]
    return tuple(sorted(srcs, key=names.index))


def _plain_edges(draw: st.DrawFn, incoming: Incoming) -> list[EdgeDef]:
    """One edge per (source, target), or a fan-out for targets sharing source and guard."""
    by_source: dict[tuple[str, str, Cond | None], list[str]] = {}
    for target, lst in incoming.items():
        for source, kind, c in lst:
            by_source.setdefault((source, kind, c), []).append(target)
    edges: list[EdgeDef] = []
    for (source, kind, c), targets in by_source.items():
        fan_out = len(targets) > 1 and draw(st.booleans())
        for group in [targets] if fan_out else [[t] for t in targets]:
            edges.append(EdgeDef((source,), tuple(group), when=c,
                                 otherwise=kind == "otherwise"))
    return edges


def flag_inputs(nflags: int) -> st.SearchStrategy[dict[str, bool]]:
    return st.fixed_dictionaries({f"f{i}": st.booleans() for i in range(nflags)})


# ---------------------------------------------------------------------------------------
# the oracle
# ---------------------------------------------------------------------------------------


def node_value(name: str, seen: list[str], values: list[Any]) -> dict[str, Any]:
    """What a (non-multi) node writes: the predecessors it saw and a digest of their values."""
    blob = json.dumps([name, seen, values], sort_keys=True).encode()
    return {"seen": seen, "h": hashlib.sha256(blob).hexdigest()[:16]}


@dataclass
class Expected:
    runs: Counter[str]  # node -> number of runs
    decisions: dict[tuple[int, str], bool]  # (edge index, "from") -> taken; joins: "*"
    dead_ends: set[str | None]  # nodes that ran and routed nowhere (None: START)
    state: dict[str, Any]

    @property
    def status(self) -> str:
        return "FAILED" if self.dead_ends else "COMPLETED"


def oracle(g: GraphDef, flags: dict[str, bool]) -> Expected:
    out: dict[str, list[int]] = {n: [] for n in (START, *g.nodes)}
    into: dict[str, list[int]] = {n: [] for n in g.nodes}
    for i, e in enumerate(g.edges):
        for s in e.sources:
            out[s].append(i)
        for t in e.targets:
            if t != END:
                into[t].append(i)

    runs: Counter[str] = Counter({START: 1})
    decisions: dict[tuple[int, str], bool] = {}
    # a field with the add reducer starts at 0 (SPEC §7), run or not
    state: dict[str, Any] = {"flags": flags, **{f"hits_{m}": 0 for m in g.multi}}
    for node in (START, *g.nodes):  # topological order
        if node != START:
            runs[node] = _arrivals(g, flags, into[node], runs, decisions)
            if runs[node] and node in g.multi:
                state[f"hits_{node}"] = runs[node]
            elif runs[node]:
                seen = [p for p in g.preds[node] if p != START and runs[p]]
                state[f"out_{node}"] = node_value(node, seen,
                                                  [state[f"out_{p}"] for p in seen])
        if runs[node]:
            _decide(g, flags, runs, node, out[node], decisions)

    dead_ends: set[str | None] = set()
    for node in (START, *g.nodes):
        if not runs[node] or not out[node]:
            continue  # did not run, or terminal
        routed = any(decisions[(i, "*" if g.edges[i].join else node)] for i in out[node])
        if not routed:
            dead_ends.add(None if node == START else node)
    del runs[START]
    return Expected(+runs, decisions, dead_ends, state)


def _arrivals(g: GraphDef, flags: dict[str, bool], edges: list[int], runs: Counter[str],
              decisions: dict[tuple[int, str], bool]) -> int:
    """How many of ``edges`` (all into one node) are taken; decides the joins among them."""
    count = 0
    for i in edges:
        e = g.edges[i]
        if not e.join:
            count += decisions.get((i, e.sources[0]), False)
        elif any(runs[s] for s in e.sources):  # all sources precede the target: resolved
            decisions[(i, "*")] = e.when is None or holds(e.when, flags, runs)
            count += decisions[(i, "*")]
    return count


def _decide(g: GraphDef, flags: dict[str, bool], runs: Counter[str], node: str,
            edges: list[int], decisions: dict[tuple[int, str], bool]) -> None:
    """The decisions of the plain edges out of ``node``, which ran."""
    plain = [i for i in edges if not g.edges[i].join]
    when_held = any(g.edges[i].when is not None and holds(g.edges[i].when, flags, runs)
                    for i in plain)
    for i in plain:
        e = g.edges[i]
        if e.otherwise:
            decisions[(i, node)] = not when_held
        else:
            decisions[(i, node)] = e.when is None or holds(e.when, flags, runs)


# ---------------------------------------------------------------------------------------
# building and running
# ---------------------------------------------------------------------------------------


@dataclass
class Trace:
    """What the node functions saw in one run."""

    delays: dict[str, float] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)


def make_node(name: str, preds: tuple[str, ...], *, sync: bool, multi: bool,
              trace: Trace) -> Callable[..., Any]:
    def body(state: dict[str, Any]) -> dict[str, Any]:
        if multi:
            return {f"hits_{name}": 1}
        seen = [p for p in preds if f"out_{p}" in state]
        return {f"out_{name}": node_value(name, seen, [state[f"out_{p}"] for p in seen])}

    if sync:
        def sync_fn(state: dict[str, Any]) -> dict[str, Any]:
            trace.calls.append(name)
            time.sleep(trace.delays.get(name, 0.0))
            return body(state)

        return sync_fn

    async def async_fn(state: dict[str, Any]) -> dict[str, Any]:
        trace.calls.append(name)
        await asyncio.sleep(trace.delays.get(name, 0.0))
        return body(state)

    return async_fn


def build(g: GraphDef, trace: Trace) -> Workflow:
    wf = Workflow("prop", input=["flags"], state={f"hits_{m}": "add" for m in g.multi})
    for name in g.nodes:
        wf.node(name, make_node(name, g.preds[name], sync=name in g.sync,
                                multi=name in g.multi, trace=trace))
    for e in g.edges:
        wf.edge(list(e.sources) if e.join else e.sources[0],
                list(e.targets) if len(e.targets) > 1 else e.targets[0],
                when=cel(e.when) if e.when is not None else None, otherwise=e.otherwise)
    return wf


# log format 2: ``node.visited`` is a visit's start and its completion in one record
STARTS = ("node.started", "node.visited")
ENDS = ("node.completed", "node.visited")


@dataclass
class Run:
    result: RunResult
    # as the listener saw them: each record, then the records log format 2 implies (with
    # its seq, ``implied: true``: `_engine._expand`)
    records: list[dict[str, Any]]
    calls: list[str]
    folded: RunResult  # ``interlock.status``: the run rebuilt from its stored log
    stored: list[dict[str, Any]]  # ``interlock.trace``
    verified: bool  # ``interlock.verify``

    def of(self, *rtypes: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] in rtypes]

    def started(self) -> Counter[str]:
        return Counter(r["node"] for r in self.of(*STARTS))

    def decisions(self) -> dict[tuple[int, str], bool]:
        out: dict[tuple[int, str], bool] = {}
        for r in self.records:
            if r["type"] in ("edge.taken", "edge.skipped"):
                key = (r["edge"], r.get("from", "*"))
                assert key not in out, f"edge {key} decided twice in one run"
                out[key] = r["type"] == "edge.taken"
        return out


def execute(wf: Workflow, flags: dict[str, Any], trace: Trace | None = None,
            delays: dict[str, float] | None = None) -> Run:
    """Run ``wf`` on ``{"flags": flags}``, then read the run back from the store."""
    trace = trace or Trace()
    trace.delays = delays or {}
    trace.calls = []
    records: list[dict[str, Any]] = []

    async def go() -> Run:
        store = open_store("memory://")
        result = await wf.run({"flags": flags}, store=store,
                              listener=lambda rec, view: records.append(rec))
        folded = await interlock.status(result.run_id, store=store)
        stored = await interlock.trace(result.run_id, store=store)
        verified = await interlock.verify(result.run_id, store=store)
        return Run(result, records, list(trace.calls), folded, stored, verified.ok)

    return asyncio.run(go())


def check_stored(run: Run) -> None:
    """The log alone gives the same run (what resume relies on), and its chain verifies."""
    assert run.verified
    # trace gives the stored records, each with what it implies (`implies`): the listener
    # saw the same, in the same order
    assert [(r["seq"], r["type"], "implied" in r) for rec in run.stored
            for r in (rec, *rec.get("implies", ()))] == \
        [(r["seq"], r["type"], "implied" in r) for r in run.records]
    res, folded = run.result, run.folded
    assert (folded.status, folded.state, folded.steps, folded.error) == \
        (res.status, res.state, res.steps, res.error)


def random_delays(names: tuple[str, ...], seed: int) -> dict[str, float]:
    rnd = random.Random(seed)
    return {n: rnd.choice([0.0, 0.0, 0.0, 0.001, 0.002, 0.003]) for n in names}


# ---------------------------------------------------------------------------------------
# checks of one run
# ---------------------------------------------------------------------------------------


def check_causality(g: GraphDef, run: Run) -> None:
    """Oracle-free invariants of the log's order."""
    # (the order the records came in: a record format 2 implies has the seq of the one
    # that implies it, and comes right after it)
    seqs = {id(r): i for i, r in enumerate(run.records)}
    completed: dict[str, list[int]] = {}
    for r in run.of(*ENDS):
        completed.setdefault(r["node"], []).append(seqs[id(r)])
    # every node.started is preceded by an edge.taken delivering to it, one per start
    deliveries: Counter[str] = Counter()
    for r in run.records:
        if r["type"] == "edge.taken":
            deliveries.update(t for t in r["to"] if t != END)
        elif r["type"] in STARTS:
            assert deliveries[r["node"]] > 0, f"{r['node']} started without an edge taken to it"
            deliveries[r["node"]] -= 1
    # a decision from a node comes after that node completed; a join's after all its
    # sources that ran completed
    for r in run.records:
        if r["type"] not in ("edge.taken", "edge.skipped"):
            continue
        e = g.edges[r["edge"]]
        sources = e.sources if r.get("from", "*") == "*" else (r["from"],)
        for s in sources:
            if s != START:
                assert all(c < seqs[id(r)] for c in completed.get(s, [])), (
                    f"edge {r['edge']} ({e.builder()}) decided before {s} completed")
    # the join invariant, read off the log alone: a join target runs exactly once iff
    # some source ran and the join was taken
    started = run.started()
    dec = run.decisions()
    for i, e in enumerate(g.edges):
        if not e.join:
            continue
        any_ran = any(started[s] for s in e.sources)
        if run.result.status == "COMPLETED":
            assert ((i, "*") in dec) == any_ran, (
                f"join {e.builder()}: sources ran={any_ran}, decided={(i, '*') in dec}")
            assert started[e.targets[0]] == int(dec.get((i, "*"), False)), (
                f"join target {e.targets[0]} ran {started[e.targets[0]]} times")
        else:
            assert started[e.targets[0]] <= 1


def check_run(g: GraphDef, exp: Expected, run: Run) -> None:
    res = run.result
    started = run.started()
    note(f"status={res.status} error={res.error}")
    note(f"started={dict(started)} expected runs={dict(exp.runs)}")
    check_stored(run)
    # (an aborted run may cancel a started visit before its function is called)
    assert not Counter(run.calls) - started, "a node function ran without node.started"
    if res.status == "COMPLETED":
        assert Counter(run.calls) == started, "node functions called != node.started"
    for n in g.nodes:
        if n not in g.multi:
            assert started[n] <= 1, f"{n} ran {started[n]} times"
    check_causality(g, run)
    decided = run.decisions()
    wrong = {k: v for k, v in decided.items() if exp.decisions.get(k) != v}
    for r in run.records:  # each decision records what it evaluated
        if r["type"] in ("edge.taken", "edge.skipped"):
            e = g.edges[r["edge"]]
            if e.otherwise:
                assert (r.get("expr"), r.get("value")) == ("otherwise", r["type"] == "edge.taken")
            elif e.when is not None:
                assert (r.get("expr"), r.get("value")) == (cel(e.when), r["type"] == "edge.taken")
    word = {True: "taken", False: "skipped", None: "no decision"}
    assert not wrong, "edge decisions differ from the oracle: " + "; ".join(
        f"edge {i} {g.edges[i].builder()} from {s}: logged {word[v]}, "
        f"expected {word[exp.decisions.get((i, s))]}" for (i, s), v in sorted(wrong.items()))
    if exp.status == "COMPLETED":
        assert res.status == "COMPLETED", f"expected COMPLETED, got {res.status}: {res.error}"
        assert res.error is None
        assert started == exp.runs, (
            f"ran {sorted(started.elements())}, expected {sorted(exp.runs.elements())}")
        missing = {k: v for k, v in exp.decisions.items() if k not in decided}
        assert not missing, f"edge decisions missing from the log: {missing}"
        assert res.state == exp.state
        assert res.steps == sum(exp.runs.values())
        assert run.records[-1]["type"] == "run.completed"
    else:
        assert res.status == "FAILED", (
            f"expected FAILED (no route from {sorted(map(str, exp.dead_ends))}), "
            f"got {res.status}")
        assert res.error is not None and res.error["type"] == "no_route", res.error
        assert res.error["node"] in exp.dead_ends, (
            f"no_route names {res.error['node']!r}, dead ends are {exp.dead_ends}")
        # whatever ran before the abort is what the oracle says would run
        assert not started - exp.runs, f"ran {started}, oracle allows {exp.runs}"
        for key, value in res.state.items():
            if key.startswith("hits_"):  # a multi node may not have run every time yet
                assert 0 <= value <= exp.state.get(key, 0), f"state[{key!r}]"
            else:
                assert exp.state.get(key) == value, f"state[{key!r}]"
        assert run.records[-1]["type"] == "run.failed"


# ---------------------------------------------------------------------------------------
# the properties
# ---------------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[GraphDef, dict[str, bool], int, int]:
    g = draw(graphs())
    flags = draw(flag_inputs(g.nflags))
    seeds = draw(st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)))
    return g, flags, seeds[0], seeds[1]


def classify(g: GraphDef, exp: Expected) -> list[str]:
    """What an example exercises (shown by ``pytest --hypothesis-show-statistics``)."""
    labels = [f"expected {exp.status}"]
    if None in exp.dead_ends:
        labels.append("no route from START")
    for i, e in enumerate(g.edges):
        if not e.join:
            continue
        ran = [s for s in e.sources if exp.runs[s]]
        if not ran:
            labels.append("a join ruled out (no source ran)")
        elif len(ran) < len(e.sources):
            labels.append("a join fired with a dead source")
        if exp.decisions.get((i, "*")) is False:
            labels.append("a join fired and its condition was false")
    if any(exp.runs[m] > 1 for m in g.multi):
        labels.append("a join-less node ran more than once")
    if len(exp.runs) < len(g.nodes) // 2:
        labels.append("most nodes ruled out")
    return sorted(set(labels))


# Shrunk failures, replayed first: an explicit example that fails stops the test before
# the (slow to shrink) random phase, so a known engine bug fails the suite fast.
_JOIN_WHEN_FALSE = (  # see test_join_whose_condition_is_false_is_not_a_silent_dead_end
    GraphDef(nodes=("n0", "n1", "n2"),
             preds={"n0": (START,), "n1": (START,), "n2": ("n0", "n1")},
             edges=(EdgeDef((START,), ("n0",)), EdgeDef((START,), ("n1",)),
                    EdgeDef(("n0", "n1"), ("n2",), when=("flag", 0, False))),
             sync=frozenset(), multi=frozenset(), nflags=1),
    {"f0": True}, 0, 0)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
@example(_JOIN_WHEN_FALSE)
def test_random_dag_matches_oracle(scenario: tuple[GraphDef, dict[str, bool], int, int]) -> None:
    g, flags, seed1, seed2 = scenario
    note(g.builder())
    note(f"input: {{'flags': {flags}}}")
    exp = oracle(g, flags)
    for label in classify(g, exp):
        event(label)
    trace = Trace()
    wf = build(g, trace)
    first = execute(wf, flags, trace, random_delays(g.nodes, seed1))
    check_run(g, exp, first)
    second = execute(wf, flags, trace, random_delays(g.nodes, seed2))
    check_run(g, exp, second)
    # the same workflow and input give the same outcome, whatever the timing
    assert second.result.status == first.result.status
    if exp.status == "COMPLETED":
        assert second.result.state == first.result.state
        assert second.decisions() == first.decisions()
        assert second.started() == first.started()


@st.composite
def small_graph_inputs(draw: st.DrawFn) -> tuple[GraphDef, list[dict[str, bool]]]:
    g = draw(graphs(min_nodes=5, max_nodes=12))
    return g, draw(st.lists(flag_inputs(g.nflags), min_size=3, max_size=3))


@settings(max_examples=60, deadline=None)
@given(small_graph_inputs())
@example((_JOIN_WHEN_FALSE[0], [{"f0": False}, {"f0": True}, {"f0": False}]))
def test_one_workflow_many_inputs(case: tuple[GraphDef, list[dict[str, bool]]]) -> None:
    """One workflow object, several runs with different inputs: no run leaks into the next."""
    g, inputs = case
    trace = Trace()
    wf = build(g, trace)
    note(g.builder())
    for i, flags in enumerate(inputs):
        note(f"run {i}: input {{'flags': {flags}}}")
        check_run(g, oracle(g, flags), execute(wf, flags, trace, random_delays(g.nodes, i)))


def test_join_whose_condition_is_false_is_not_a_silent_dead_end() -> None:
    """SPEC: "a node with outgoing edges of which none is taken fails the run with a
    'no route' error". Here the only edge out of ``a`` and ``b`` is the join, and it
    is skipped (its ``when`` is false): nothing routes them anywhere, so the run must
    fail with ``no_route`` -- exactly as it does when the edge is a plain ``a -> c``."""
    wf = Workflow("join-dead-end", input=["go"])
    for name in ("a", "b", "c"):
        wf.node(name, _counter(name))
    wf.edge(START, ["a", "b"])
    wf.edge(["a", "b"], "c", when="go")
    records: list[dict[str, Any]] = []
    res = wf.run_sync({"go": False}, store="memory://",
                      listener=lambda rec, view: records.append(rec))
    assert [r["node"] for r in records if r["type"] in ENDS] in (["a", "b"],
                                                                             ["b", "a"])
    assert res.status == "FAILED", f"completed with {sorted(res.state)}: a silent dead end"
    assert res.error is not None and res.error["type"] == "no_route"
    assert res.error["node"] in ("a", "b")


# -- loops -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopDef:
    """A loop with a bounded back edge::

        START -> [pre ->] l0 -> ... -> l{m-1} --(back: when true, max K)--> l{j}
                                       l{m-1} --(otherwise)--> exit | END

    ``branch`` puts a fan-out and a join inside the body, right after ``l{j}``
    (``l{j} -> p, l{j} -> q, [p, q] -> joined``): ``p`` always taken ("fan"),
    never ("never": a dead branch each iteration) or on odd visits of ``l{j}``
    ("odd"). ``side`` adds a conditional exit from a node inside the loop,
    ``-> side when run.visits.<node> == v``, taken in iteration v if there is
    one; with ``join`` the two ways out meet again: ``[exit, side] -> final``.
    """

    length: int  # loop nodes l0..l{m-1}
    back_to: int  # j
    k: int
    guard: str  # "max" | "visits" | "both"
    pre: bool
    exit_node: bool
    branch: str  # "none" | "fan" | "never" | "odd"
    side: int | None  # index among the loop's nodes (the back edge's source excluded)
    side_visit: int
    join: bool


@st.composite
def loops(draw: st.DrawFn) -> LoopDef:
    length = draw(st.integers(1, 4))
    k = draw(st.integers(1, 6))
    return LoopDef(length=length, back_to=draw(st.integers(0, length - 1)), k=k,
                   guard=draw(st.sampled_from(["max", "visits", "both"])),
                   pre=draw(st.booleans()), exit_node=draw(st.booleans()),
                   branch=draw(st.sampled_from(["none", "fan", "never", "odd"])),
                   side=draw(st.none() | st.integers(0, 5)),
                   side_visit=draw(st.integers(0, k + 2)), join=draw(st.booleans()))


@dataclass
class LoopPlan:
    wf: Workflow
    edges: list[str]  # declared edges, by index
    back: int  # the back edge's index
    side_edge: int | None
    runs: Counter[str]  # expected runs per node


def build_loop(d: LoopDef) -> LoopPlan:
    loop = [f"l{i}" for i in range(d.length)]
    body = list(loop)
    if d.branch != "none":
        body[d.back_to + 1:d.back_to + 1] = ["p", "q", "joined"]
    chain = (["pre"] if d.pre else []) + body
    before = chain[:chain.index(loop[d.back_to])]
    inside = chain[len(before):]
    last = inside[-1]
    exits = inside[:-1]
    side = exits[d.side % len(exits)] if d.side is not None and exits else None
    after = (["exit"] if d.exit_node else []) + (["side"] if side else [])
    if side and d.join and d.exit_node:
        after.append("final")
    runs = _loop_runs(d, before, inside, after, side)
    wf = Workflow("loop", input=["flags"],
                  state={f"count_{n}": "add" for n in [*before, *inside, *after]})
    for n in [*before, *inside, *after]:
        wf.node(n, _counter(n))
    declared: list[str] = []  # edges are numbered in declaration order

    def edge(src: Any, dst: Any, **kw: Any) -> int:
        wf.edge(src, dst, **kw)
        declared.append(f"wf.edge({src!r}, {dst!r}, **{kw})")
        return len(declared) - 1

    edge(START, chain[0])
    for a, b in itertools.pairwise(chain):
        if d.branch != "none" and a in (loop[d.back_to], "p", "q"):
            continue  # wired through the branch below
        edge(a, b)
    if d.branch != "none":
        fork = loop[d.back_to]
        if d.branch == "fan":
            edge(fork, ["p", "q"])
        else:
            edge(fork, "p", when="flags.off" if d.branch == "never"
                 else f"run.visits.{fork} % 2 == 1")
            edge(fork, "q")
        edge(["p", "q"], "joined")
    visits = f"run.visits.{last} <= {d.k}"
    if d.guard == "max":
        back = edge(last, inside[0], when="flags.on", max=d.k)
    elif d.guard == "visits":
        back = edge(last, inside[0], when=visits)
    else:
        back = edge(last, inside[0], when=f"{visits} || flags.on", max=d.k)
    edge(last, "exit" if d.exit_node else END, otherwise=True)
    side_edge = None
    if side is not None:
        side_edge = edge(side, "side", when=f"run.visits.{side} == {d.side_visit}")
        if "final" in after:
            edge(["exit", "side"], "final")
    return LoopPlan(wf, declared, back, side_edge, runs)


def _loop_runs(d: LoopDef, before: list[str], inside: list[str], after: list[str],
               side: str | None) -> Counter[str]:
    """How often each node of the loop workflow runs."""
    runs = Counter({n: 1 for n in before}) + Counter({n: d.k + 1 for n in inside})
    if d.branch == "never":
        del runs["p"]
    elif d.branch == "odd":  # visits 1, 3, 5, ... of the fork
        runs["p"] = (d.k + 2) // 2
    for n in after:
        runs[n] = 1
    if side is not None and not 1 <= d.side_visit <= runs[side]:
        del runs["side"]  # ruled out once the loop is done
    return runs


def _counter(name: str) -> Callable[..., Any]:
    async def fn(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {f"count_{name}": 1}

    return fn


@settings(max_examples=80, deadline=None)
@given(loops())
def test_loop_back_edge_is_taken_exactly_k_times(d: LoopDef) -> None:
    note(f"{d}")
    lp = build_loop(d)
    note("\n".join(f"edge {i}: {e}" for i, e in enumerate(lp.edges)))
    note(f"expected runs: {dict(lp.runs)}")
    flags = {"on": True, "off": False}
    run = execute(lp.wf, flags)
    res, records = run.result, run.records
    assert res.status == "COMPLETED", res.error
    check_stored(run)
    decided = Counter((r["edge"], r["type"]) for r in records
                      if r["type"] in ("edge.taken", "edge.skipped"))
    assert decided[(lp.back, "edge.taken")] == d.k
    assert decided[(lp.back, "edge.skipped")] == 1  # the last iteration: max reached/guard false
    assert run.started() == lp.runs
    if lp.side_edge is not None:
        assert decided[(lp.side_edge, "edge.taken")] == lp.runs["side"]
    # every count_ field starts at 0 (an add reducer's start, SPEC §7), run or not
    counted = [f[len("count_"):] for f in lp.wf.spec.state]
    assert res.state == {"flags": flags, **{f"count_{n}": lp.runs.get(n, 0) for n in counted}}


# -- which nodes can run concurrently ------------------------------------------------------


@st.composite
def forward_graphs(draw: st.DrawFn) -> tuple[dict[str, list[str]], list[list[str]]]:
    """A random DAG over n0..n{k} (edges only forward) and its forks: each node's
    successors, some of which are its unconditional targets."""
    k = draw(st.integers(3, 14))
    names = [f"n{i}" for i in range(k)]
    fwd: dict[str, list[str]] = {n: [] for n in names}
    forks: list[list[str]] = []
    for i, n in enumerate(names[:-1]):
        succ = draw(st.lists(st.sampled_from(names[i + 1:]), max_size=4, unique=True))
        fwd[n] = succ
        uncond = [t for t in succ if draw(st.booleans())]
        if len(uncond) > 1:
            forks.append(uncond)
    return fwd, forks


@given(forward_graphs())
@settings(max_examples=200, deadline=None)
def test_concurrency_answers_as_the_definition_does(
        graph: tuple[dict[str, list[str]], list[list[str]]]) -> None:
    # the definition, pair by pair: below two different unconditional branches of one
    # fork (one reaching x and not y, the other y and not x), neither below the other
    from interlock._definition._graph import Concurrency, reachable

    fwd, forks = graph
    below = {n: reachable(fwd, n) for n in fwd}
    conc = Concurrency(fwd, forks)
    for x, y in itertools.combinations(fwd, 2):
        expected = x not in below[y] and y not in below[x] and any(
            x in below[a] and y not in below[a] and y in below[b] and x not in below[b]
            for f in forks for a in f for b in f if a != b)
        assert conc.parallel(x, y) == conc.parallel(y, x) == expected, (x, y)
