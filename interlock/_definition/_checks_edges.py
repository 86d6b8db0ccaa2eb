"""The checks of the edges one by one: names (unknown nodes, START and END, repeats),
routers and choices, compiled conditions, on_error edges, ``otherwise`` beside an
unconditional edge, map edges (``as``, ``collect``)."""

from __future__ import annotations

from collections import Counter

from ._checking import CheckContext, _did_you_mean
from ._edge import EdgeSpec
from ._expr import ExpressionSyntaxError, compile_expression
from ._model import END, START, NodeSpec
from ._values import NAME_RE


def check_error_edges(checker: CheckContext) -> None:
    """An on_error edge leaves a node whose body can fail (not START, not an approval
    gate)."""
    for i, e in enumerate(checker.spec.edges):
        if e.catches is None:
            continue
        src = e.source[0]
        if src == START:
            checker.add("error", f"edge {e.describe()}: START cannot fail; an on_error edge "
                        "leaves the node whose failure it catches", ("edges", i, "from"),
                        "on-error")
        elif checker.spec.nodes[src].approval is not None:
            checker.add("error", f"edge {e.describe()}: {src!r} is an approval gate, which "
                        "does not fail; route on its decision instead (when: "
                        f"'{src}.decision == \"rejected\"')", ("edges", i, "on_error"),
                        "on-error")
        for name in e.catches:
            hint = _misspelled_exception(name)
            if hint:
                checker.add("warning", f"edge {e.describe()}: on_error names {name!r}, which "
                            f"is no built-in or interlock exception class{hint}; a class of "
                            "your own is matched by its name along the error's class "
                            "hierarchy, so a misspelled one never catches anything",
                            ("edges", i, "on_error"), "on-error-class")


def check_otherwise(checker: CheckContext) -> None:
    """An ``otherwise`` edge beside an edge of the same node that has no ``when``: the
    otherwise edge is taken whenever no *when* edge is, so both are taken (a warning:
    the way "loop N times" is most often miswritten)."""
    by_source: dict[str, list[int]] = {}
    for i, e in enumerate(checker.spec.edges):
        if len(e.source) == 1 and e.catches is None:
            by_source.setdefault(e.source[0], []).append(i)
    for src, indexes in by_source.items():
        edges = [(i, checker.spec.edges[i]) for i in indexes]
        other = [(i, e) for i, e in edges if e.otherwise]
        if not other:
            continue
        free = [e for _, e in edges if not e.otherwise and e.when is None]
        if not free:
            continue
        i, oe = other[0]
        first = free[0]
        loop = first.targets[0] if first.kind == "plain" else "<target>"
        n = first.max + 1 if first.max is not None else "N"
        checker.add("warning", f"edge {oe.describe()} (otherwise) and edge "
                    f"{first.describe()} both leave {src!r}, and the latter has no 'when': "
                    f"'otherwise' is taken when no 'when' edge from {src!r} is, so BOTH "
                    f"edges are taken each time {src!r} completes. To loop a fixed number "
                    f"of times, give the loop edge a condition on the visit count, e.g. "
                    f"{{from: {src}, to: {loop}, when: 'run.visits.{src} < {n}'}}, and keep "
                    "the otherwise edge as the way out", ("edges", i), "otherwise")


def check_edge_names(checker: CheckContext) -> bool:
    ok = True
    nodes = checker.spec.nodes
    for i, e in enumerate(checker.spec.edges):
        for s in e.source:
            if s == END:
                checker.add("error", f"edge {e.describe()}: END cannot be a source",
                            ("edges", i, "from"), "unknown-node")
                ok = False
            elif s != START and s not in nodes:
                checker.add("error", f"edge {e.describe()}: unknown node {s!r} in 'from'"
                            + _did_you_mean(s, [START, *nodes]), ("edges", i, "from"),
                            "unknown-node")
                ok = False
        if START in e.source and e.is_join:
            checker.add("error", "START cannot be part of a join", ("edges", i, "from"),
                        "unknown-node")
            ok = False
        ok = check_repeats(checker, i, e) and ok
        key = {"switch": "cases", "choose": "choose"}.get(e.kind, "to")
        for t in e.targets:
            if t == START:
                checker.add("error", f"edge {e.describe()}: START cannot be a target",
                            ("edges", i, key), "unknown-node")
                ok = False
            elif t != END and t not in nodes:
                checker.add("error", f"edge {e.describe()}: unknown node {t!r}"
                            + _did_you_mean(t, [*nodes, END]), ("edges", i, key),
                            "unknown-node")
                ok = False
        if e.kind == "router" and e.router is not None:
            checker.resolve(e.router, ("edges", i, "router"), f"edge {e.describe()}")
        if e.kind == "choose":
            src = e.source[0]
            agent = nodes[src].agent if src != START else None
            # an agent chooses by its output's agent.choose field or by a tool's goto
            # (its kind checks that it has one of them)
            if src == START or (nodes[src].call is None and not isinstance(agent, dict)):
                checker.add("error", f"edge {e.describe()}: only a call node (or an agent node "
                            "with agent.choose or tools) can choose its successor",
                            ("edges", i, "choose"), "choose")
    if not any(START in e.source for e in checker.spec.edges):
        checker.add("error", "no edge from START: add {from: START, to: <first node>}",
                    ("edges",), "start")
        ok = False
    return ok


def _check_mapped_gate(checker: CheckContext, e: EdgeSpec, i: int, what: str, target: str,
                       ns: NodeSpec) -> None:
    """A map edge to a human gate: an approval's or a confirm: true node's items each
    wait for their own decision, gathered with ``collect``; an approval's ``on_modify``
    and an agent's guarded tools are refused."""
    kind = "an approval" if ns.approval is not None else "a confirm: true node" \
        if ns.confirm else None
    if kind is not None and e.collect is None:
        outcome = "its decision record" if ns.approval is not None else \
            "its result, or the record of its rejection"
        checker.add("error", f"{what}: {target!r} is {kind}: each item waits for its own "
                    f"decision and its outcome ({outcome}) is gathered in a list -- declare "
                    "collect: FIELD on the map edge", ("edges", i, "to"), "map")
    if ns.approval is not None and ns.approval.on_modify:
        checker.add("error", f"{what}: {target!r} declares on_modify; a mapped "
                    "approval's items are approved or rejected (re-entering the graph "
                    "from one item has no single answer): drop on_modify, or map a "
                    "sub-workflow whose child holds the approval with on_modify",
                    ("edges", i, "to"), "map")
    guarded = [_guarded_label(t) for t in (ns.agent or {}).get("tools") or ()
               if isinstance(t, dict) and t.get("confirm")]
    if guarded:
        checker.add("error", f"{what}: agent {target!r} has tools a human confirms "
                    f"({', '.join(map(str, guarded))}); an agent's items cannot wait for a "
                    "human in the middle of their turns. A mapped node's items can wait at "
                    "an approval node, a confirm: true node or a sub-workflow's gates: put "
                    "the agent in a sub-workflow and map that (workflow: FILE), or confirm "
                    "before or after the map, or drop confirm: true from the tool",
                    ("edges", i, "to"), "map")


def check_maps(checker: CheckContext) -> None:
    """Map edges: what the mapped node may be, ``as`` and ``collect``."""
    spec = checker.spec
    into: Counter[str] = Counter(t for e in spec.edges for t in e.targets)
    reducers: dict[str, str] = {k: v.reducer for k, v in spec.state.items()}
    for i, e in enumerate(spec.edges):
        if e.kind != "map":
            continue
        target = e.targets[0]
        ns = spec.nodes.get(target)
        if ns is None:  # END (an unknown node is reported by check_edge_names)
            if target == END:
                checker.add("error", f"edge {e.describe()}: a map edge runs a node per "
                            "item; END is not one", ("edges", i, "to"), "map")
            continue
        what = f"edge {e.describe()}"
        _check_mapped_gate(checker, e, i, what, target, ns)
        if into[target] > 1:
            checker.add("error", f"{what}: {target!r} is also the target of another edge; a "
                        "mapped node is reached only through its map edge (map into a node "
                        "of its own, or route the other edge to the map's source)",
                        ("edges", i, "to"), "map")
        for j, out in enumerate(spec.edges):
            if target in out.source and out.kind == "choose":
                checker.add("error", f"edge {out.describe()}: {target!r} is mapped (edge "
                            f"{e.describe()}), and a per-item choice has no single answer; "
                            "decide after the map with a when/switch edge on the collected "
                            "field", ("edges", j, "choose"), "map")
        item = e.item_name
        if not NAME_RE.match(item) or item in ("config", "run", "error"):
            checker.add("error", f"{what}: 'as: {item}' must be a field name (letters, "
                        "digits, _) other than config, run and error", ("edges", i, "as"),
                        "map")
        elif item in spec.state or item in spec.input:
            checker.add("error", f"{what}: 'as: {item}' names a field the workflow declares "
                        f"({'input' if item in spec.input else 'state'}); each item's visit "
                        "would not see it: choose another name for the item",
                        ("edges", i, "as"), "map")
        if e.collect is not None:
            _check_collect(checker, e, i, ns, reducers)
        else:
            shared = sorted(f for f in ns.writes or () if reducers.get(f, "replace")
                            == "replace")
            if shared:
                checker.add("error", f"{what}: the items of {target!r} run concurrently and "
                            f"each writes {', '.join(map(repr, shared))}, which has no "
                            "reducer: declare one under state: (append, extend, merge, add), "
                            f"or gather the items' updates with 'collect: FIELD'",
                            ("nodes", target, "writes"), "write-conflict")


def _check_collect(checker: CheckContext, e: EdgeSpec, i: int, ns: NodeSpec,
                   reducers: dict[str, str]) -> None:
    what, field_name = f"edge {e.describe()}", e.collect
    assert field_name is not None
    if not NAME_RE.match(field_name):
        checker.add("error", f"{what}: 'collect: {field_name}' must be a field name",
                    ("edges", i, "collect"), "map")
        return
    reducer = reducers.get(field_name, "replace")
    if reducer not in ("replace", "extend"):
        checker.add("error", f"{what}: 'collect: {field_name}' writes the list of the items' "
                    f"updates, and {field_name!r} has reducer {reducer}; use replace (each "
                    "map sets it) or extend (a map in a loop adds to it)",
                    ("edges", i, "collect"), "map")
    if ns.writes is not None and field_name in ns.writes:
        checker.add("error", f"{what}: {e.targets[0]!r} declares writes: [{field_name}], "
                    f"which is the map's 'collect' field; 'writes' lists what one item "
                    "returns (not merged), 'collect' the field the list of them goes to",
                    ("nodes", e.targets[0], "writes"), "map")


def check_repeats(checker: CheckContext, i: int, e: EdgeSpec) -> bool:
    """A name twice in one edge (an error: a join lists each source once, or it would
    fire twice), and an unconditional edge declared twice (a warning)."""
    ok = True
    repeated = sorted(n for n, k in Counter(e.source).items() if k > 1)
    if repeated:
        checker.add("error", f"edge {e.describe()}: {', '.join(map(repr, repeated))} named "
                    "more than once in 'from'; a join lists each source once",
                    ("edges", i, "from"), "duplicate")
        ok = False
    targets = list(e.targets)
    for t in sorted(t for t, k in Counter(targets).items() if k > 1):
        checker.add("error", f"edge {e.describe()}: {t!r} named more than once in its "
                    "targets", ("edges", i, "to"), "duplicate")
        ok = False
    if e.kind == "plain" and e.when is None and not e.otherwise and e.catches is None:
        # the earlier unconditional edges, by source set: target -> the first edge
        # to it (a dict look-up per target, not a scan of every earlier edge)
        seen = checker._plain_targets.setdefault(frozenset(e.source), {})
        earlier = [seen[t] for t in targets if t in seen]
        if earlier:
            first = checker.spec.edges[min(earlier)]
            checker.add("warning", f"edge {e.describe()} repeats edge {first.describe()}: "
                        "each taken edge runs its target once more (remove one)",
                        ("edges", i), "duplicate")
        for t in targets:
            seen.setdefault(t, i)
    return ok


def check_expressions(checker: CheckContext) -> None:
    for i, e in enumerate(checker.spec.edges):
        for key in ("when", "switch", "map"):
            src = getattr(e, key)
            if src is None or src in checker.result.expressions:
                continue
            try:
                checker.result.expressions[src] = compile_expression(src)
            except ExpressionSyntaxError as exc:
                col = f" (column {exc.col} of the expression)" if exc.col else ""
                checker.add("error", f"edge {e.describe()}: {key} {src!r} {exc}{col}",
                            ("edges", i, key), "expression")


def _misspelled_exception(name: str) -> str:
    """`` (did you mean 'ValueError'?)`` when ``name`` is close to, and not, the name of a
    built-in or interlock exception class; "" otherwise (a class of the user's own)."""
    import builtins

    from .. import _errors

    known = {n for space in (vars(builtins), vars(_errors)) for n, v in space.items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    if name in known:
        return ""
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.85)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _guarded_label(tool: dict[str, object]) -> str:
    """How an error names a tool entry a human confirms: its ``call``, its ``name``, or
    for an MCP server's entry the tools it lists under ``confirm``."""
    confirm = tool.get("confirm")
    if "mcp" in tool and isinstance(confirm, list):
        return "MCP tools " + ", ".join(map(str, confirm))
    return str(tool.get("call") or tool.get("name") or tool.get("workflow") or "a tool")
