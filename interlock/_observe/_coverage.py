"""Branch coverage of a workflow across its stored runs: what was declared and
never executed.

An *edge* here is one declared (source, target) pair: each target of a fan-out, each
case of a switch and its default, each declared target of a router or a ``choose``, a
map edge once, ``START`` edges included; a join is one source. For every stored run of
the workflow, each ``edge.taken``/``edge.skipped`` record is mapped through that run's
own stored definition to those pairs -- so runs of an older version of the file count
for the edges it still declares; a migrated run's records after its ``run.migrated``,
through the definition it moved to -- and counted as taken or skipped. Conditions
(``when``) count the values they gave, gates the decisions made, nodes their visits.
Nothing here evaluates anything: the counts are the log's.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import _log as L
from .._definition._edge import EdgeSpec, case_key
from .._definition._model import WorkflowSpec
from .._definition._plan import Plan
from .._definition._spec import load_spec, parse
from .._engine._expand import Expander
from .._errors import UsageError
from .._hints import without_password
from .._plugins._compile import reading_plan
from .._store import ALL_RUNS, Store, open_store


@dataclass(slots=True)
class EdgeCoverage:
    """One declared (source, target) pair and how often the runs took it."""

    index: int  # the edge's position in ``edges:``
    source: str  # a node, START, or ``[a, b]`` for a join
    target: str
    kind: str  # plain | switch | router | choose | map | error
    label: str  # the condition, the case, ``otherwise``, ... ("" for an unconditional edge)
    case: str | None = None  # a switch case's value (None for the default and other edges)
    taken: int = 0
    skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"edge": self.index, "from": self.source, "to": self.target, "kind": self.kind,
                "label": self.label, "case": self.case, "taken": self.taken,
                "skipped": self.skipped}


@dataclass(slots=True)
class Coverage:
    """The coverage report of one workflow (`coverage`)."""

    workflow: str
    runs: int
    definitions: int  # distinct definitions (hashes) among those runs
    edges: list[EdgeCoverage]
    nodes: dict[str, int]  # visits per declared node
    conditions: dict[str, dict[str, int]]  # a when edge's "true"/"false" counts, by its name
    gates: dict[str, dict[str, int]]  # decisions per approval node
    cases_unmatched: list[str] = field(default_factory=list)

    @property
    def taken_share(self) -> float:
        """The percentage of declared edges taken at least once (100 with no edges)."""
        if not self.edges:
            return 100.0
        return 100.0 * sum(1 for e in self.edges if e.taken) / len(self.edges)

    @property
    def never_taken(self) -> list[EdgeCoverage]:
        return [e for e in self.edges if not e.taken]

    @property
    def never_reached(self) -> list[str]:
        return [n for n, visits in self.nodes.items() if not visits]

    def never(self, value: str) -> list[str]:
        """The conditions evaluated at least once that never gave ``value`` ("true" or
        "false")."""
        return [name for name, seen in self.conditions.items()
                if not seen[value] and (seen["true"] or seen["false"])]

    @property
    def never_evaluated(self) -> list[str]:
        """The conditions no run ever evaluated (their source never completed)."""
        return [name for name, seen in self.conditions.items()
                if not seen["true"] and not seen["false"]]

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow, "runs": self.runs, "definitions": self.definitions,
            "coverage": round(self.taken_share, 2),
            "edges": [e.to_json() for e in self.edges],
            "never_taken": [f"{e.source} -> {e.target}" + (f" [{e.label}]" if e.label else "")
                            for e in self.never_taken],
            "nodes": self.nodes, "never_reached": self.never_reached,
            "conditions": self.conditions,
            "never_true": self.never("true"), "never_false": self.never("false"),
            "never_evaluated": self.never_evaluated,
            "cases_never_matched": self.cases_unmatched, "gates": self.gates,
        }


def declared_edges(spec: WorkflowSpec) -> list[EdgeCoverage]:
    """Every (source, target) pair ``spec`` declares, in declaration order."""
    return [EdgeCoverage(i, _source(e), target, kind, label, case)
            for i, e in enumerate(spec.edges) for target, kind, label, case in _pairs(e)]


Pair = tuple[str, str, str, str | None]  # target, kind, label, switch case


def _pairs(e: EdgeSpec) -> list[Pair]:
    """The (source, target) pairs one edge declares: each target, or each switch case
    and the default (case None)."""
    if e.kind == "switch":
        out: list[Pair] = [(target, "switch", f"{e.switch} == {value}", value)
                           for value, target in (e.cases or {}).items()]
        if e.default is not None:
            out.append((e.default, "switch", "default", None))
        return out
    return [(target, _kind(e), _label(e), None) for target in e.targets]


def _kind(e: EdgeSpec) -> str:
    return "error" if e.on_error is not False else e.kind


def _source(e: EdgeSpec) -> str:
    return e.source[0] if len(e.source) == 1 else "[" + ", ".join(e.source) + "]"


def _label(e: EdgeSpec) -> str:
    if e.on_error is not False:
        return "on error" + (": " + ", ".join(e.on_error) if isinstance(e.on_error, list)
                             else "")
    if e.kind == "router":
        return f"router {e.router}"
    if e.kind == "choose":
        return "choose"
    if e.kind == "map":
        return f"map {e.map}"
    return e.when or ("otherwise" if e.otherwise else "")


_STARTS = frozenset({L.NODE_STARTED, L.NODE_VISITED})  # (node.visited: started, completed)


class _Counts:
    """What the runs of one workflow did, keyed by what the current file declares."""

    def __init__(self, spec: WorkflowSpec) -> None:
        self.spec = spec
        self.edges = declared_edges(spec)
        # what identifies a declared pair across versions of the file: an edge whose
        # condition changed is another edge
        self.by_key = {(e.source, e.target, e.kind, e.label, e.case): e for e in self.edges}
        self.nodes: Counter[str] = Counter(dict.fromkeys(spec.nodes, 0))
        self.conditions = {e.describe() + f" [{e.when}]": Counter({"true": 0, "false": 0})
                           for e in spec.edges if e.when is not None}
        self.gates: dict[str, Counter[str]] = {
            n: Counter() for n, ns in spec.nodes.items() if ns.approval is not None}

    def record(self, run_spec: WorkflowSpec, rec: L.Record) -> None:
        rtype = rec["type"]
        if rtype in _STARTS and "item" not in rec and rec.get("attempt", 1) == 1:
            if rec["node"] in self.nodes:
                self.nodes[rec["node"]] += 1
        elif rtype in (L.EDGE_TAKEN, L.EDGE_SKIPPED):
            index = rec.get("edge")
            if isinstance(index, int) and 0 <= index < len(run_spec.edges):
                self._edge(run_spec.edges[index], rec)
        elif rtype == L.APPROVAL_DECIDED and rec.get("node") in self.gates:
            self.gates[rec["node"]][str(rec.get("decision"))] += 1

    def _edge(self, e: EdgeSpec, rec: L.Record) -> None:
        taken = set(rec.get("to") or ())
        source = _source(e)
        if e.when is not None and isinstance(rec.get("value"), bool):
            name = e.describe() + f" [{e.when}]"
            if name in self.conditions:
                self.conditions[name]["true" if rec["value"] else "false"] += 1
        matched = case_key(rec.get("value")) if "value" in rec else None
        cases = e.cases or {}
        for target, kind, label, case in _pairs(e):
            if kind != "switch":
                hit = target in taken
            elif case is not None:  # a case: the value matched it (and the edge went on)
                hit = case == matched and bool(taken)
            else:  # the default: no case matched
                hit = matched not in cases and bool(taken)
            self._count((source, target, kind, label, case), hit)

    def _count(self, key: tuple[str, str, str, str, str | None], taken: bool) -> None:
        entry = self.by_key.get(key)
        if entry is None:  # an edge the file no longer declares
            return
        if taken:
            entry.taken += 1
        else:
            entry.skipped += 1


async def coverage(workflow: Any, *, store: str | Store | None = None) -> Coverage:
    """The coverage of a workflow's declared edges by its stored runs.

    ``workflow``: a `Workflow` or `WorkflowSpec`, a workflow file's path, or the name of
    a workflow that has runs in the store (the definition of its newest run is used).
    """
    st = store if isinstance(store, Store) else open_store(store)
    try:
        return await coverage_of(await _spec_of(workflow, st), st)
    finally:
        if not isinstance(store, Store):
            await st.close()


async def workflows_in(store: Store) -> list[WorkflowSpec]:
    """The workflows that have runs in ``store``, each as its newest run defines it."""
    newest: dict[str, WorkflowSpec] = {}
    for row in await store.list_runs(limit=ALL_RUNS):  # newest first
        if row.workflow not in newest:
            newest[row.workflow] = parse(row.definition)
    return sorted(newest.values(), key=lambda s: s.workflow)


async def _spec_of(workflow: Any, store: Store) -> WorkflowSpec:
    if isinstance(workflow, WorkflowSpec):
        return workflow
    spec = getattr(workflow, "spec", None)  # a Workflow
    if isinstance(spec, WorkflowSpec):
        return spec
    text = os.fspath(workflow)
    if os.path.exists(text) or text.endswith((".yaml", ".yml", ".json")):
        return load_spec(text)
    rows = await store.list_runs(workflow=text, limit=1)
    if not rows:
        known = ", ".join(s.workflow for s in await workflows_in(store)) or "none"
        raise UsageError(f"no workflow file {text!r}, and no runs of a workflow named "
                         f"{text!r} in {without_password(store.url, '***')} (workflows "
                         f"with runs: {known})")
    return parse(rows[0].definition)


def _plan(plans: dict[str, Plan], digest: str, spec: WorkflowSpec) -> Plan:
    plan = plans.get(digest)
    if plan is None:
        plan = plans[digest] = reading_plan(spec)
    return plan


async def coverage_of(spec: WorkflowSpec, store: Store) -> Coverage:
    """The coverage of ``spec``'s declared edges by the stored runs of its workflow."""
    counts = _Counts(spec)
    rows = await store.list_runs(workflow=spec.workflow, limit=ALL_RUNS)
    specs: dict[str, WorkflowSpec] = {}
    plans: dict[str, Plan] = {}  # (log format 2: what its records imply, `_expand`)
    for row in rows:
        run_spec = specs.get(row.definition_hash)
        if run_spec is None:
            run_spec = specs[row.definition_hash] = parse(row.definition)
        expand = Expander(_plan(plans, row.definition_hash, run_spec))
        async for entries in store.iter_entries(row.run_id):
            for entry in entries:
                rec = entry.record()
                if rec["type"] == L.RUN_MIGRATED:  # the rest under its definition
                    to_hash = str(rec.get("to_hash"))
                    run_spec = specs.get(to_hash) or specs.setdefault(
                        to_hash, parse(rec["definition"]))
                    expand.plan = _plan(plans, to_hash, run_spec)
                for one in expand(rec):
                    counts.record(run_spec, one)
    unmatched = [f"{e.source} switch case {e.case} -> {e.target}" for e in counts.edges
                 if e.case is not None and not e.taken]
    return Coverage(
        workflow=spec.workflow, runs=len(rows), definitions=len(specs), edges=counts.edges,
        nodes=dict(counts.nodes),
        conditions={k: dict(v) for k, v in counts.conditions.items()},
        gates={k: dict(v) for k, v in counts.gates.items()}, cases_unmatched=unmatched)


__all__ = ["Coverage", "EdgeCoverage", "coverage", "coverage_of", "declared_edges",
           "workflows_in"]
