"""Static checks of a workflow: everything that can be known before a run starts.

`check(spec)` returns diagnostics (errors and warnings, each with its
``file:line:col``) together with what it resolved along the way -- imported
callables and compiled expressions -- so that the plan reuses them rather
than doing the work twice.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import Diagnostic, Severity
from ._callables import import_callable
from ._expr import Expression, ExpressionSyntaxError, compile_expression
from ._graph import Concurrency, back_edges, reachable, reverse, sccs
from ._kinds import NodeKind
from ._model import END, ERROR_FIELD, NAME_RE, START, EdgeSpec, NodeSpec, WorkflowSpec
from ._spec import locate


@dataclass
class CheckResult:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    callables: dict[str, Callable[..., Any]] = field(default_factory=dict)
    expressions: dict[str, Expression] = field(default_factory=dict)
    # which nodes can run concurrently (also the run-time write-conflict check's)
    concurrency: Concurrency | None = None

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]


class _Checker:
    def __init__(self, spec: WorkflowSpec, provided: dict[str, Callable[..., Any]],
                 kinds: Sequence[NodeKind]) -> None:
        self.spec = spec
        self.provided = provided
        self.kinds = kinds
        self.result = CheckResult()
        # check_repeats: unconditional plain edges seen so far, by their set of sources
        self._plain_targets: dict[frozenset[str], dict[str, int]] = {}

    def add(self, severity: Severity, message: str, path: tuple[Any, ...], code: str) -> None:
        self.result.diagnostics.append(
            Diagnostic(severity, message, locate(self.spec, path), code))

    # -- the checks ------------------------------------------------------------------

    def run(self) -> CheckResult:
        self.check_nodes()
        self.check_triggers()
        self.check_reserved()
        self.check_expressions()
        if not self.check_edge_names():
            return self.result  # the graph checks below need known names
        self.check_error_edges()
        self.check_otherwise()
        self.check_gate_data()
        adj = self.adjacency()
        self.check_maps()
        self.check_reachability(adj)
        self.check_cycles()
        self.check_fed()
        self.check_concurrency(adj)
        self.result.diagnostics.sort(
            key=lambda d: (d.location.line or 0, d.location.col or 0, d.severity))
        return self.result

    def check_triggers(self) -> None:
        """``triggers:``: a cron that parses, a poll function that imports, the input the
        workflow declares, ids that differ (they make the runs' ids)."""
        if not self.spec.triggers:
            return
        from .._worker._triggers import check_schedule, trigger_id

        seen: dict[str, int] = {}
        for i, t in enumerate(self.spec.triggers):
            if t.schedule is not None:
                problem = check_schedule(t.schedule)
                if problem is not None:
                    self.add("error", f"trigger {i + 1}: schedule {t.schedule!r} is not a cron "
                             f"expression: {problem} (five fields: minute hour day month "
                             "weekday, in UTC; or six with seconds first)",
                             ("triggers", i, "schedule"), "trigger")
            if t.poll is not None:
                self.resolve(t.poll, ("triggers", i, "poll"), f"trigger {i + 1}")
            else:
                missing = [n for n in self.spec.input if n not in (t.input or {})]
                if missing:
                    self.add("error", f"trigger {i + 1}: the workflow declares input "
                             f"{missing}, which this trigger's input: does not give; its runs "
                             "would be refused (add them, e.g. input: {"
                             + ", ".join(f"{n}: ..." for n in missing) + "})",
                             ("triggers", i, "input") if t.input is not None
                             else ("triggers", i), "trigger")
            tid = trigger_id(t)
            if tid in seen:
                self.add("error", f"trigger {i + 1} has the same id as trigger {seen[tid] + 1} "
                         f"({tid!r}): their runs' ids would collide; give one an id: of its "
                         "own", ("triggers", i), "trigger")
            seen.setdefault(tid, i)

    def check_nodes(self) -> None:
        for name, ns in self.spec.nodes.items():
            if ns.call is not None:
                self.resolve(ns.call, ("nodes", name, "call"), f"node {name!r}")
            if ns.executor == "ray" and importlib.util.find_spec("ray") is None:
                self.add("error", f"node {name!r}: executor: ray runs its body on Ray, which "
                         "is not installed here: pip install 'interlock[ray]' (or run the "
                         "workflow where Ray is)", ("nodes", name, "executor"), "import")
            for kind in self.kinds:
                if kind.owns(ns):
                    kind.check(self, name, ns)
            if ns.approval is not None:
                tgt = ns.approval.on_timeout
                if tgt != "reject" and tgt not in self.spec.nodes:
                    self.add("error", f"node {name!r}: on_timeout must be 'reject' or a node; "
                             f"{tgt!r} is neither", ("nodes", name, "approval", "on_timeout"),
                             "unknown-node")
                if ns.confirm:
                    self.add("error", f"node {name!r}: an approval node is a gate already; "
                             "'confirm' belongs on call nodes", ("nodes", name, "confirm"),
                             "confirm")
                for target in ns.approval.on_modify:
                    if target not in self.spec.nodes:
                        self.add("error", f"node {name!r}: on_modify names unknown node "
                                 f"{target!r}", ("nodes", name, "approval", "on_modify"),
                                 "unknown-node")
                if ns.approval.input is not None:
                    self.check_input_schema(name, ns.approval.input)

    def check_input_schema(self, name: str, schema: dict[str, Any]) -> None:
        """An approval's ``input:`` must be a JSON Schema (2020-12) a decision can meet."""
        from jsonschema import Draft202012Validator, SchemaError

        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            at = "".join(f"[{p!r}]" for p in exc.path)
            self.add("error", f"node {name!r}: approval.input is not a valid JSON Schema "
                     f"(2020-12): {exc.message}" + (f" at {at}" if at else "") + "; it is "
                     "the schema a decision's --data must satisfy, e.g. {type: object, "
                     "properties: {amount: {type: number}}, required: [amount]}",
                     ("nodes", name, "approval", "input"), "approval-input")

    def check_gate_data(self) -> None:
        """A condition reading ``<gate>.data`` needs the gate to declare ``input:`` (else
        its record has no data: an evaluation error at run time); a field the schema's
        ``properties`` do not name is a warning (a typo, or a schema to extend)."""
        nodes = self.spec.nodes
        for i, e in enumerate(self.spec.edges):
            for key in ("when", "switch"):
                src = getattr(e, key)
                expr = self.result.expressions.get(src) if src is not None else None
                for path in expr.paths if expr is not None else ():
                    gate, _, rest = path.partition(".data")
                    ns = nodes.get(gate)
                    if ns is None or ns.approval is None or rest[:1] not in ("", "."):
                        continue
                    schema = ns.approval.input
                    if schema is None:
                        self.add("error", f"edge {e.describe()}: {key} reads {path}, but gate "
                                 f"{gate!r} declares no approval.input, so its record has no "
                                 "data; declare approval.input (the JSON Schema of what a "
                                 "decider sends with --data)", ("edges", i, key), "gate-data")
                        continue
                    props = schema.get("properties")
                    field = rest[1:].partition(".")[0]
                    if field and isinstance(props, dict) and field not in props:
                        self.add("warning", f"edge {e.describe()}: {key} reads {path}, but the "
                                 f"input schema of gate {gate!r} has no property {field!r} "
                                 f"(its properties: {', '.join(props) or 'none'})",
                                 ("edges", i, key), "gate-data")

    def check_reserved(self) -> None:
        """The ``error`` field is the engine's (an error edge's target reads the caught
        error there): a workflow may read it, not declare or write it."""
        f = ERROR_FIELD
        why = (f"{f!r} is reserved: the engine writes the error an on_error edge caught "
               f"there ({{node, type, message, attempt}}); name the field otherwise")
        if f in self.spec.input:
            self.add("error", f"input: {why}", ("input",), "reserved")
        if f in self.spec.state:
            self.add("error", f"state: {why}", ("state", f), "reserved")
        for name, ns in self.spec.nodes.items():
            if ns.writes is not None and f in ns.writes:
                self.add("error", f"node {name!r}: writes: {why}", ("nodes", name, "writes"),
                         "reserved")
            # an approval writes its decision under its name, an agent its reply and a
            # sub-workflow its result under its output_key (default: its name)
            if ns.output_field(name) == f:
                what = {"approval": "decision", "agent": "reply"}.get(ns.kind, "result")
                self.add("error", f"node {name!r} would write its {what} to {f!r}: {why}",
                         ("nodes", name), "reserved")

    def check_error_edges(self) -> None:
        """An on_error edge leaves a node whose body can fail (not START, not an approval
        gate)."""
        for i, e in enumerate(self.spec.edges):
            if e.catches is None:
                continue
            src = e.source[0]
            if src == START:
                self.add("error", f"edge {e.describe()}: START cannot fail; an on_error edge "
                         "leaves the node whose failure it catches", ("edges", i, "from"),
                         "on-error")
            elif self.spec.nodes[src].approval is not None:
                self.add("error", f"edge {e.describe()}: {src!r} is an approval gate, which "
                         "does not fail; route on its decision instead (when: "
                         f"'{src}.decision == \"rejected\"')", ("edges", i, "on_error"),
                         "on-error")
            for name in e.catches:
                hint = _misspelled_exception(name)
                if hint:
                    self.add("warning", f"edge {e.describe()}: on_error names {name!r}, which "
                             f"is no built-in or interlock exception class{hint}; a class of "
                             "your own is matched by its name along the error's class "
                             "hierarchy, so a misspelled one never catches anything",
                             ("edges", i, "on_error"), "on-error-class")

    def check_otherwise(self) -> None:
        """An ``otherwise`` edge beside an edge of the same node that has no ``when``: the
        otherwise edge is taken whenever no *when* edge is, so both are taken (a warning:
        the way "loop N times" is most often miswritten)."""
        by_source: dict[str, list[int]] = {}
        for i, e in enumerate(self.spec.edges):
            if len(e.source) == 1 and e.catches is None:
                by_source.setdefault(e.source[0], []).append(i)
        for src, indexes in by_source.items():
            edges = [(i, self.spec.edges[i]) for i in indexes]
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
            self.add("warning", f"edge {oe.describe()} (otherwise) and edge "
                     f"{first.describe()} both leave {src!r}, and the latter has no 'when': "
                     f"'otherwise' is taken when no 'when' edge from {src!r} is, so BOTH "
                     f"edges are taken each time {src!r} completes. To loop a fixed number "
                     f"of times, give the loop edge a condition on the visit count, e.g. "
                     f"{{from: {src}, to: {loop}, when: 'run.visits.{src} < {n}'}}, and keep "
                     "the otherwise edge as the way out", ("edges", i), "otherwise")

    def resolve(self, path: str, where: tuple[Any, ...], what: str) -> None:
        if path in self.result.callables:
            return
        fn = self.provided.get(path)
        if fn is None:
            try:
                fn = import_callable(path)
            except (ImportError, AttributeError, TypeError) as exc:
                self.add("error", f"{what}: call target {path!r} does not import: {exc}",
                         where, "import")
                return
            except (Exception, SystemExit) as exc:  # importing user code may raise anything
                self.add("error", f"{what}: importing {path!r} raised {type(exc).__name__}: "
                         f"{exc}", where, "import")
                return
        self.result.callables[path] = fn

    def check_edge_names(self) -> bool:
        ok = True
        nodes = self.spec.nodes
        for i, e in enumerate(self.spec.edges):
            for s in e.source:
                if s == END:
                    self.add("error", f"edge {e.describe()}: END cannot be a source",
                             ("edges", i, "from"), "unknown-node")
                    ok = False
                elif s != START and s not in nodes:
                    self.add("error", f"edge {e.describe()}: unknown node {s!r} in 'from'"
                             + _did_you_mean(s, nodes), ("edges", i, "from"), "unknown-node")
                    ok = False
            if START in e.source and e.is_join:
                self.add("error", "START cannot be part of a join", ("edges", i, "from"),
                         "unknown-node")
                ok = False
            ok = self.check_repeats(i, e) and ok
            key = {"switch": "cases", "choose": "choose"}.get(e.kind, "to")
            for t in e.targets:
                if t == START:
                    self.add("error", f"edge {e.describe()}: START cannot be a target",
                             ("edges", i, key), "unknown-node")
                    ok = False
                elif t != END and t not in nodes:
                    self.add("error", f"edge {e.describe()}: unknown node {t!r}"
                             + _did_you_mean(t, nodes), ("edges", i, key), "unknown-node")
                    ok = False
            if e.kind == "router" and e.router is not None:
                self.resolve(e.router, ("edges", i, "router"), f"edge {e.describe()}")
            if e.kind == "choose":
                src = e.source[0]
                agent = nodes[src].agent if src != START else None
                # an agent chooses by its output's agent.choose field or by a tool's goto
                # (its kind checks that it has one of them)
                if src == START or (nodes[src].call is None and not isinstance(agent, dict)):
                    self.add("error", f"edge {e.describe()}: only a call node (or an agent node "
                             "with agent.choose or tools) can choose its successor",
                             ("edges", i, "choose"), "choose")
        if not any(START in e.source for e in self.spec.edges):
            self.add("error", "no edge from START: add {from: START, to: <first node>}",
                     ("edges",), "start")
            ok = False
        return ok

    def check_maps(self) -> None:
        """Map edges (SPEC §7): what the mapped node may be, ``as`` and ``collect``."""
        spec = self.spec
        into: Counter[str] = Counter(t for e in spec.edges for t in e.targets)
        reducers: dict[str, str] = {k: v.reducer for k, v in spec.state.items()}
        for i, e in enumerate(spec.edges):
            if e.kind != "map":
                continue
            target = e.targets[0]
            ns = spec.nodes.get(target)
            if ns is None:  # END (an unknown node is reported by check_edge_names)
                if target == END:
                    self.add("error", f"edge {e.describe()}: a map edge runs a node per "
                             "item; END is not one", ("edges", i, "to"), "map")
                continue
            what = f"edge {e.describe()}"
            if ns.approval is not None or ns.confirm:
                self.add("error", f"{what}: {target!r} is a human gate; a map runs a call or "
                         "agent node per item (put the approval after the mapped node)",
                         ("edges", i, "to"), "map")
            guarded = [t.get("call") for t in (ns.agent or {}).get("tools") or ()
                       if isinstance(t, dict) and t.get("confirm")]
            if guarded:
                self.add("error", f"{what}: agent {target!r} has tools a human confirms "
                         f"({', '.join(map(str, guarded))}); the items of a mapped node "
                         "cannot wait for a human: confirm before or after the map, or "
                         "drop confirm: true from the tool", ("edges", i, "to"), "map")
            if into[target] > 1:
                self.add("error", f"{what}: {target!r} is also the target of another edge; a "
                         "mapped node is reached only through its map edge (map into a node "
                         "of its own, or route the other edge to the map's source)",
                         ("edges", i, "to"), "map")
            for j, out in enumerate(spec.edges):
                if target in out.source and out.kind == "choose":
                    self.add("error", f"edge {out.describe()}: {target!r} is mapped (edge "
                             f"{e.describe()}), and a per-item choice has no single answer; "
                             "decide after the map with a when/switch edge on the collected "
                             "field", ("edges", j, "choose"), "map")
            item = e.item_name
            if not NAME_RE.match(item) or item in ("config", "run", "error"):
                self.add("error", f"{what}: 'as: {item}' must be a field name (letters, "
                         "digits, _) other than config, run and error", ("edges", i, "as"),
                         "map")
            elif item in spec.state or item in spec.input:
                self.add("error", f"{what}: 'as: {item}' names a field the workflow declares "
                         f"({'input' if item in spec.input else 'state'}); each item's visit "
                         "would not see it: choose another name for the item",
                         ("edges", i, "as"), "map")
            if e.collect is not None:
                self._check_collect(e, i, ns, reducers)
            else:
                shared = sorted(f for f in ns.writes or () if reducers.get(f, "replace")
                                == "replace")
                if shared:
                    self.add("error", f"{what}: the items of {target!r} run concurrently and "
                             f"each writes {', '.join(map(repr, shared))}, which has no "
                             "reducer: declare one under state: (append, extend, merge, add), "
                             f"or gather the items' updates with 'collect: FIELD'",
                             ("nodes", target, "writes"), "write-conflict")

    def _check_collect(self, e: EdgeSpec, i: int, ns: NodeSpec,
                       reducers: dict[str, str]) -> None:
        what, field_name = f"edge {e.describe()}", e.collect
        assert field_name is not None
        if not NAME_RE.match(field_name):
            self.add("error", f"{what}: 'collect: {field_name}' must be a field name",
                     ("edges", i, "collect"), "map")
            return
        reducer = reducers.get(field_name, "replace")
        if reducer not in ("replace", "extend"):
            self.add("error", f"{what}: 'collect: {field_name}' writes the list of the items' "
                     f"updates, and {field_name!r} has reducer {reducer}; use replace (each "
                     "map sets it) or extend (a map in a loop adds to it)",
                     ("edges", i, "collect"), "map")
        if ns.writes is not None and field_name in ns.writes:
            self.add("error", f"{what}: {e.targets[0]!r} declares writes: [{field_name}], "
                     f"which is the map's 'collect' field; 'writes' lists what one item "
                     "returns (not merged), 'collect' the field the list of them goes to",
                     ("nodes", e.targets[0], "writes"), "map")

    def check_repeats(self, i: int, e: EdgeSpec) -> bool:
        """A name twice in one edge (an error: a join lists each source once, or it would
        fire twice), and an unconditional edge declared twice (a warning)."""
        ok = True
        repeated = sorted(n for n, k in Counter(e.source).items() if k > 1)
        if repeated:
            self.add("error", f"edge {e.describe()}: {', '.join(map(repr, repeated))} named "
                     "more than once in 'from'; a join lists each source once",
                     ("edges", i, "from"), "duplicate")
            ok = False
        targets = list(e.targets)
        for t in sorted(t for t, k in Counter(targets).items() if k > 1):
            self.add("error", f"edge {e.describe()}: {t!r} named more than once in its "
                     "targets", ("edges", i, "to"), "duplicate")
            ok = False
        if e.kind == "plain" and e.when is None and not e.otherwise and e.catches is None:
            # the earlier unconditional edges, by source set: target -> the first edge
            # to it (a dict look-up per target, not a scan of every earlier edge)
            seen = self._plain_targets.setdefault(frozenset(e.source), {})
            earlier = [seen[t] for t in targets if t in seen]
            if earlier:
                first = self.spec.edges[min(earlier)]
                self.add("warning", f"edge {e.describe()} repeats edge {first.describe()}: "
                         "each taken edge runs its target once more (remove one)",
                         ("edges", i), "duplicate")
            for t in targets:
                seen.setdefault(t, i)
        return ok

    def check_expressions(self) -> None:
        for i, e in enumerate(self.spec.edges):
            for key in ("when", "switch", "map"):
                src = getattr(e, key)
                if src is None or src in self.result.expressions:
                    continue
                try:
                    self.result.expressions[src] = compile_expression(src)
                except ExpressionSyntaxError as exc:
                    col = f" (column {exc.col} of the expression)" if exc.col else ""
                    self.add("error", f"edge {e.describe()}: {key} {src!r} {exc}{col}",
                             ("edges", i, key), "expression")

    def adjacency(self) -> dict[str, list[str]]:
        # successors in declaration order, each once (a dict keeps both: no list scans)
        succ: dict[str, dict[str, None]] = {START: {}, **{n: {} for n in self.spec.nodes}}
        for e in self.spec.edges:
            targets = dict.fromkeys(e.targets)
            for s in e.source:
                succ[s].update(targets)
        return {n: list(ts) for n, ts in succ.items()}

    def check_reachability(self, adj: dict[str, list[str]]) -> None:
        # a modify decision re-enters the graph at a node of the gate's on_modify (SPEC
        # §3): such a node is reachable through the gate even with no edge into it
        seen = reachable(self._with_reentries(adj), START)
        for name in self.spec.nodes:
            if name not in seen:
                self.add("error", f"node {name!r} is unreachable: no edge path from START "
                         "leads to it", ("nodes", name), "unreachable")
        # a node with no outgoing edge is terminal: it reaches END
        # (an error edge is no exit: a node that succeeds without another edge ends)
        exits = {s for e in self.spec.edges if e.catches is None for s in e.source}
        ends = {n for n in self.spec.nodes if n not in exits} | {END}
        rev = reverse(adj)
        can_end: set[str] = set()
        todo = list(ends)
        while todo:
            n = todo.pop()
            if n in can_end:
                continue
            can_end.add(n)
            todo.extend(rev.get(n, ()))
        for name in self.spec.nodes:
            if name in seen and name not in can_end:
                self.add("error", f"node {name!r} can never reach END: every path from it "
                         "loops forever; add an exit edge", ("nodes", name), "no-end")

    def _with_reentries(self, adj: dict[str, list[str]]) -> dict[str, list[str]]:
        out = adj
        for name, ns in self.spec.nodes.items():
            if ns.approval is not None and ns.approval.on_modify:
                if out is adj:
                    out = dict(adj)
                out[name] = [*adj[name], *(t for t in ns.approval.on_modify
                                           if t in self.spec.nodes)]
        return out

    def check_cycles(self) -> None:
        """Every cycle needs a guard: a when/otherwise/switch/router/choose edge or a max."""
        plain: dict[str, list[str]] = {n: [] for n in self.spec.nodes}
        where: dict[tuple[str, str], int] = {}
        for i, e in enumerate(self.spec.edges):
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
        for s, t in sorted(back_edges(plain, self.spec.nodes), key=lambda p: where[p]):
            cycle = _cycle_through(plain, t, s)
            self.add("error", f"unguarded cycle {' -> '.join([*cycle, t])}: it would loop "
                     "forever; give one of its edges a 'when' condition or a 'max'",
                     ("edges", where[(s, t)]), "cycle")

    def check_fed(self) -> None:
        """SPEC §4: a condition reading a field that no node writes and neither ``input:``
        nor ``state:`` declares is an error; one declared but never fed, a warning."""
        written, all_known = self._written()
        for i, e in enumerate(self.spec.edges):
            for key in ("when", "switch", "map"):
                src = getattr(e, key)
                expr = self.result.expressions.get(src) if src else None
                if expr is None:
                    continue
                for field_name in expr.names:
                    problem = self._unfed(field_name, written, all_known)
                    if problem is not None:
                        level, why = problem
                        known = written | set(self.spec.input) | set(self.spec.state)
                        self.add(level, f"edge {e.describe()}: {key} reads {field_name!r}"
                                 + _did_you_mean(field_name, known) + f", {why}",
                                 ("edges", i, key), "never-fed")
            cfg = self.spec.config
            for src in (e.when, e.switch, e.map):
                if src and "config." in src:
                    for key_name in _config_keys(src):
                        if key_name not in cfg:
                            self.add("warning", f"edge {e.describe()}: reads config.{key_name}"
                                     + _did_you_mean(key_name, cfg) + ", which 'config:' does "
                                     "not declare (a run must --set it)", ("edges", i),
                                     "config")

    def _written(self) -> tuple[set[str], bool]:
        """The fields nodes are known to write, and whether that is all of them: a node's
        are known when it declares ``writes`` (an approval writes its own name, an agent
        its output key); one that does not may write anything."""
        written: set[str] = set()
        all_known = True
        for name, ns in self.spec.nodes.items():
            writes = ns.written(name)
            if writes is None:
                all_known = False
            else:
                written |= writes
        # a map's collect field: the list of its items' updates
        written |= {e.collect for e in self.spec.edges if e.collect is not None}
        return written, all_known

    def _unfed(self, name: str, written: set[str], all_known: bool
               ) -> tuple[Severity, str] | None:
        if name in ("config", "run") or name in written or name in self.spec.input:
            return None
        if name == ERROR_FIELD:
            if any(e.catches is not None for e in self.spec.edges):
                return None  # written by the engine when an error edge catches
            return ("warning", "which only an on_error edge's catch writes, and this "
                    "workflow has none")
        if name in self.spec.state:
            return None if not all_known else (
                "warning", "which 'state' declares but no node writes (declared but never "
                "fed): it stays empty unless a patch sets it")
        if all_known:
            return ("error", "which no node writes (every node declares 'writes') and "
                    "neither 'input' nor 'state' declares; fix the name, or declare where "
                    "it comes from")
        return ("warning", "which no node declares in 'writes' and neither 'input' nor "
                "'state' declares; declare where it comes from (a node without 'writes' "
                "may write it)")

    def check_concurrency(self, adj: dict[str, list[str]]) -> None:
        """Static conflicting writes, and the join-less diamond."""
        back = back_edges(adj, self.spec.nodes)
        fwd = {n: [t for t in succ if t != END and (n, t) not in back]
               for n, succ in adj.items()}
        conc = Concurrency(fwd, self.unconditional(back)[0].values())
        self.result.concurrency = conc
        self.check_conflicts(conc)
        self.check_diamonds(conc, back)
        self.check_joins_from_loops(adj)

    def check_conflicts(self, conc: Concurrency) -> None:
        """Nodes that can run concurrently and declare writes of one field without a
        reducer (only the pairs that share such a field are asked about)."""
        spec = self.spec
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
            self.add("error", f"nodes {x!r} and {y!r} can run concurrently and both "
                     f"write {f!r}, which has no reducer: declare one under state: "
                     "(append, extend, merge, add) or write different fields",
                     ("nodes", y, "writes"), "write-conflict")

    def unconditional(self, back: set[tuple[str, str]]
                      ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Forward single-source edges without a condition: by source, and by target."""
        out: dict[str, list[str]] = {}
        into: dict[str, list[str]] = {}
        for e in self.spec.edges:
            if e.kind != "plain" or e.when is not None or e.otherwise or e.is_join \
                    or e.catches is not None:
                continue
            source = e.source[0]
            for t in e.targets:
                if t != END and (source, t) not in back:
                    out.setdefault(source, []).append(t)
                    into.setdefault(t, []).append(source)
        return out, into

    def check_diamonds(self, conc: Concurrency, back: set[tuple[str, str]]) -> None:
        """A node reached by plain edges from branches that run together, without a join."""
        if not conc.forks:
            return
        for name, all_sources in self.unconditional(back)[1].items():
            sources = [n for n in all_sources if n in conc.branched]
            for a_i, a in enumerate(sources):
                for b in sources[a_i + 1:]:
                    if conc.parallel(a, b):
                        self.add("warning", f"node {name!r} is reached from {a!r} and {b!r}, "
                                 "which run concurrently, without a join: it will run once per "
                                 f"edge (twice). To run it once after both, use "
                                 f"{{from: [{a}, {b}], to: {name}}}", ("nodes", name),
                                 "diamond")
                        break
                else:
                    continue
                break


    def check_joins_from_loops(self, adj: dict[str, list[str]]) -> None:
        """A join whose source is inside a loop the join is outside of: every iteration
        of that source arrives at it (a join settles per arrival), so its target runs
        once per iteration, not once after the loop."""
        comp = sccs(adj, self.spec.nodes)
        size: dict[int, int] = {}
        for c in comp.values():
            size[c] = size.get(c, 0) + 1
        for i, e in enumerate(self.spec.edges):
            if len(e.source) < 2:
                continue
            for s in e.source:
                scc = comp.get(s)
                looped = scc is not None and (size[scc] > 1 or s in adj.get(s, ()))
                if looped and any(comp.get(t) != scc for t in e.targets if t != END):
                    self.add("warning", f"join {e.describe()}: source {s!r} is inside a loop "
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


def _config_keys(src: str) -> list[str]:
    import re

    return re.findall(r"(?<![\w.])config\.([A-Za-z_]\w*)", src)


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


def _did_you_mean(name: str, known: Any) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check(spec: WorkflowSpec, provided: dict[str, Callable[..., Any]] | None = None, *,
          kinds: Sequence[NodeKind] = ()) -> CheckResult:
    """Run every static check on ``spec``; ``kinds`` check the nodes they own."""
    return _Checker(spec, provided or {}, kinds).run()
