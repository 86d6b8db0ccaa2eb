"""The checks of the graph's shape: reachability from START and of END, unguarded cycles,
nodes that run concurrently (write conflicts, the join-less diamond, a join fed from
inside a loop)."""

from __future__ import annotations

from ._checking import CheckContext
from ._graph import Concurrency, back_edges, reachable, reverse, sccs
from ._model import END, START


def adjacency(checker: CheckContext) -> dict[str, list[str]]:
    # successors in declaration order, each once (a dict keeps both: no list scans)
    succ: dict[str, dict[str, None]] = {START: {}, **{n: {} for n in checker.spec.nodes}}
    for e in checker.spec.edges:
        targets = dict.fromkeys(e.targets)
        for s in e.source:
            succ[s].update(targets)
    return {n: list(ts) for n, ts in succ.items()}


def check_reachability(checker: CheckContext, adj: dict[str, list[str]]) -> None:
    # a modify decision re-enters the graph at a node of the gate's on_modify:
    # such a node is reachable through the gate even with no edge into it
    seen = reachable(_with_reentries(checker, adj), START)
    for name in checker.spec.nodes:
        if name not in seen:
            checker.add("error", f"node {name!r} is unreachable: no edge path from START "
                        "leads to it", ("nodes", name), "unreachable")
    # a node with no outgoing edge is terminal: it reaches END
    # (an error edge is no exit: a node that succeeds without another edge ends)
    exits = {s for e in checker.spec.edges if e.catches is None for s in e.source}
    ends = {n for n in checker.spec.nodes if n not in exits} | {END}
    rev = reverse(adj)
    can_end: set[str] = set()
    todo = list(ends)
    while todo:
        n = todo.pop()
        if n in can_end:
            continue
        can_end.add(n)
        todo.extend(rev.get(n, ()))
    for name in checker.spec.nodes:
        if name in seen and name not in can_end:
            checker.add("error", f"node {name!r} can never reach END: every path from it "
                        "loops forever; add an exit edge", ("nodes", name), "no-end")


def _with_reentries(checker: CheckContext, adj: dict[str, list[str]]) -> dict[str, list[str]]:
    out = adj
    for name, ns in checker.spec.nodes.items():
        if ns.approval is not None and ns.approval.on_modify:
            if out is adj:
                out = dict(adj)
            out[name] = [*adj[name], *(t for t in ns.approval.on_modify
                                       if t in checker.spec.nodes)]
    return out


def check_cycles(checker: CheckContext) -> None:
    """Every cycle needs a guard: a when/otherwise/switch/router/choose edge or a max."""
    plain: dict[str, list[str]] = {n: [] for n in checker.spec.nodes}
    where: dict[tuple[str, str], int] = {}
    for i, e in enumerate(checker.spec.edges):
        guarded = (e.kind != "plain" or e.when is not None or e.otherwise
                   or e.max is not None or e.catches is not None)
        if guarded:
            continue
        for s in e.source:
            if s == START:
                continue
            for t in e.targets:
                if t != END:
                    plain[s].append(t)
                    where.setdefault((s, t), i)
    for s, t in sorted(back_edges(plain, checker.spec.nodes), key=lambda p: where[p]):
        cycle = _cycle_through(plain, t, s)
        checker.add("error", f"unguarded cycle {' -> '.join([*cycle, t])}: it would loop "
                    "forever; give one of its edges a 'when' condition or a 'max'",
                    ("edges", where[(s, t)]), "cycle")


def check_concurrency(checker: CheckContext, adj: dict[str, list[str]]) -> None:
    """Static conflicting writes, and the join-less diamond."""
    back = back_edges(adj, checker.spec.nodes)
    fwd = {n: [t for t in succ if t != END and (n, t) not in back]
           for n, succ in adj.items()}
    conc = Concurrency(fwd, unconditional(checker, back)[0].values())
    checker.result.concurrency = conc
    check_conflicts(checker, conc)
    check_diamonds(checker, conc, back)
    check_joins_from_loops(checker, adj)


def check_conflicts(checker: CheckContext, conc: Concurrency) -> None:
    """Nodes that can run concurrently and declare writes of one field without a
    reducer (only the pairs that share such a field are asked about)."""
    spec = checker.spec
    reducers = {k: v.reducer for k, v in spec.state.items()}
    writers: dict[str, list[str]] = {}
    for name, ns in spec.nodes.items():
        for f in ns.writes or ():
            if reducers.get(f, "replace") == "replace":
                writers.setdefault(f, []).append(name)
    found: set[tuple[str, str, str]] = set()
    for f, all_names in writers.items():
        # only nodes below a fork can run beside another: the pairs of the others
        # (every node of a 10 000-node chain writing one field) need no asking
        names = [n for n in all_names if n in conc.branched]
        for i, x in enumerate(names):
            for y in names[i + 1:]:
                if conc.parallel(x, y):
                    a, b = sorted((x, y))
                    found.add((a, b, f))
    for x, y, f in sorted(found):
        checker.add("error", f"nodes {x!r} and {y!r} can run concurrently and both "
                    f"write {f!r}, which has no reducer: declare one under state: "
                    "(append, extend, merge, add) or write different fields",
                    ("nodes", y, "writes"), "write-conflict")


def unconditional(checker: CheckContext, back: set[tuple[str, str]]
                  ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Forward single-source edges without a condition: by source, and by target."""
    out: dict[str, list[str]] = {}
    into: dict[str, list[str]] = {}
    for e in checker.spec.edges:
        if e.kind != "plain" or e.when is not None or e.otherwise or e.is_join \
                or e.catches is not None:
            continue
        source = e.source[0]
        for t in e.targets:
            if t != END and (source, t) not in back:
                out.setdefault(source, []).append(t)
                into.setdefault(t, []).append(source)
    return out, into


def check_diamonds(checker: CheckContext, conc: Concurrency, back: set[tuple[str, str]]) -> None:
    """A node reached by plain edges from branches that run together, without a join."""
    if not conc.forks:
        return
    for name, all_sources in unconditional(checker, back)[1].items():
        sources = [n for n in all_sources if n in conc.branched]
        for a_i, a in enumerate(sources):
            for b in sources[a_i + 1:]:
                if conc.parallel(a, b):
                    checker.add("warning", f"node {name!r} is reached from {a!r} and {b!r}, "
                                "which run concurrently, without a join: it will run once per "
                                f"edge (twice). To run it once after both, use "
                                f"{{from: [{a}, {b}], to: {name}}}", ("nodes", name),
                                "diamond")
                    break
            else:
                continue
            break


def check_joins_from_loops(checker: CheckContext, adj: dict[str, list[str]]) -> None:
    """A join whose source is inside a loop the join is outside of: every iteration
    of that source arrives at it (a join settles per arrival), so its target runs
    once per iteration, not once after the loop."""
    comp = sccs(adj, checker.spec.nodes)
    size: dict[int, int] = {}
    for c in comp.values():
        size[c] = size.get(c, 0) + 1
    for i, e in enumerate(checker.spec.edges):
        if len(e.source) < 2:
            continue
        for s in e.source:
            scc = comp.get(s)
            looped = scc is not None and (size[scc] > 1 or s in adj.get(s, ()))
            if looped and any(comp.get(t) != scc for t in e.targets if t != END):
                checker.add("warning", f"join {e.describe()}: source {s!r} is inside a loop "
                            "the join is outside of, so each of its iterations arrives at "
                            "the join and its target runs once per iteration; to run it "
                            "once after the loop, join from the node the loop exits to",
                            ("edges", i), "join-in-loop")
                break


def _cycle_through(adj: dict[str, list[str]], start: str, end: str) -> list[str]:
    """A path start -> ... -> end (used to name an unguarded cycle)."""
    from collections import deque

    prev: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        n = todo.popleft()
        if n == end:
            break
        for t in adj.get(n, ()):
            if t not in prev:
                prev[t] = n
                todo.append(t)
    path = [end]
    while prev.get(path[-1]) is not None:
        path.append(prev[path[-1]])  # type: ignore[arg-type]
    return list(reversed(path))
