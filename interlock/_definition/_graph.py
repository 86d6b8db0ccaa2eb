"""Graph facts found once at load: back edges, strongly connected components, reachability.

These are pure functions over an adjacency map ``{node: [successor, ...]}`` in
declaration order (``START`` included, ``END`` as a sink). Everything is
iterative: a 10 000-node chain must not hit Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ._model import END, START

Adjacency = Mapping[str, Sequence[str]]


def back_edges(adj: Adjacency, nodes: Iterable[str]) -> set[tuple[str, str]]:
    """Edges ``(u, v)`` that close a cycle: ``v`` is on the DFS stack when ``u`` reaches it.

    The DFS starts at START and follows edges in declaration order, so "the edge
    that closes a loop" is the one a reader of the file would name: in
    ``a -> b -> c -> b`` it is ``c -> b``. Nodes not reachable from START are
    visited afterwards so that every edge is classified.
    """
    state: dict[str, int] = {}  # 1 = on stack, 2 = done
    back: set[tuple[str, str]] = set()
    for root in [START, *nodes]:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, i = stack[-1]
            succ = adj.get(node, ())
            if i < len(succ):
                stack[-1] = (node, i + 1)
                nxt = succ[i]
                st = state.get(nxt)
                if st == 1:
                    back.add((node, nxt))
                elif st is None:
                    state[nxt] = 1
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                stack.pop()
    return back


def sccs(adj: Adjacency, nodes: Iterable[str]) -> dict[str, int]:
    """Tarjan's strongly connected components (iterative): node -> component id."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comp: dict[str, int] = {}
    counter = 0
    ncomp = 0
    inner: dict[str, list[str]] = {}  # successors without START/END, made once per node
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work[-1]
            if i == 0 and node not in index:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succ = inner.get(node)
            if succ is None:
                succ = inner[node] = [s for s in adj.get(node, ()) if s != END and s != START]
            if i < len(succ):
                work[-1] = (node, i + 1)
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp[member] = ncomp
                    if member == node:
                        break
                ncomp += 1
    return comp


def reachable(adj: Adjacency, start: str) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        node = todo.pop()
        for nxt in adj.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def reverse(adj: Adjacency) -> dict[str, list[str]]:
    rev: dict[str, list[str]] = {}
    for node, succ in adj.items():
        for s in succ:
            rev.setdefault(s, []).append(node)
    return rev


class Concurrency:
    """Which nodes can run at the same time, asked pair by pair.

    ``x`` and ``y`` can when neither reaches the other and some fork has one
    unconditional branch that reaches ``x`` but not ``y`` and another that reaches
    ``y`` but not ``x``. ``fwd`` is the forward adjacency (no back edges, no END);
    ``forks`` the unconditional targets of every node that has two or more. Answers
    are computed on demand and kept, so a 1000-branch fan-out costs what its pairs
    actually asked about, not a million pairs up front.
    """

    def __init__(self, fwd: Adjacency, forks: Iterable[Sequence[str]]) -> None:
        self.forks = [list(dict.fromkeys(f)) for f in forks]
        self.forks = [f for f in self.forks if len(f) > 1]
        self._rev = reverse(fwd)
        self._ancestors: dict[str, set[str]] = {}
        self._answers: dict[frozenset[str], bool] = {}
        # nodes below some branch of a fork: the only ones that can have a partner
        self.branched: frozenset[str] = frozenset(
            n for f in self.forks for t in f for n in reachable(fwd, t))

    def ancestors(self, node: str) -> set[str]:
        """Every node that reaches ``node`` (itself included)."""
        found = self._ancestors.get(node)
        if found is None:
            found = self._ancestors[node] = reachable(self._rev, node)
        return found

    def parallel(self, x: str, y: str) -> bool:
        if x == y or x not in self.branched or y not in self.branched:
            return False
        key = frozenset((x, y))
        answer = self._answers.get(key)
        if answer is None:
            ax, ay = self.ancestors(x), self.ancestors(y)
            answer = x not in ay and y not in ax and any(
                any(t in ax and t not in ay for t in f) and any(t in ay and t not in ax
                                                                for t in f)
                for f in self.forks)
            self._answers[key] = answer
        return answer
