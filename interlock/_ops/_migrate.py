"""`interlock migrate`: move a stored run onto another definition, on purpose
and on the record.

A run is pinned to the definition it started with. ``migrate`` moves a waiting, failed
or pending run onto a new one after a static check that it can continue there:

- the run is where a move is sound: waiting at a gate (or, a conversation, for its next
  message), failed, or pending; no join
  half-arrived, no mapped visit in flight (the flow machine's bookkeeping is the old
  graph's);
- the gate it waits at, the node that failed (or ``--at NODE``) exists in the new graph;
- every state field the rest of the new graph reads (a node's ``reads:``, a condition,
  a switch, a map) is present in the run's state, declared (``input:``, ``state:``),
  or written by a node still to run that says so (``writes:``, an approval's, an
  agent's output);
- the reducer of every field the run holds is unchanged.

Every difference between the two definitions is listed (nodes added, removed or
changed; edges; state fields and reducers; fields read that nothing provides), and
every reason to refuse. Refused, nothing is recorded; otherwise ``run.migrated {from_hash,
to_hash, by, comment, at_node, definition, code}`` is committed under the run's claim.
A migration onto the definition the run is on records the code as it is now (its
modules' digests changed: a deploy of code only); with the same code it is refused. One
onto a new definition lists the modules whose code changed and keeps their recorded
digests: a continuation treats them as code drift (`_code`) until the former accepts.
Nothing runs: a waiting run now waits on the new definition, a pending run is continued
by a worker, a failed one by ``resume``. The fold reads each segment of the log under
its own definition (`_migration.migrate`, in the fold).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import _log as L
from .._definition._digest import CodeDigests, code_digests
from .._definition._edge import EdgeSpec
from .._definition._model import END, ERROR_FIELD, START, WorkflowSpec
from .._definition._plan import Plan
from .._engine._fold import RunView
from .._engine._gates import gate_name
from .._engine._journal import Journal
from .._errors import UsageError
from .._plugins._compile import reading_plan
from .._store import Store, release_store
from ._claims import LEASE_SECONDS, _claim_of, make_owner
from ._code import nodes_to_run, recorded_code
from ._load import Loaded, load_run, open_store_arg

MIGRATABLE = ("WAITING_APPROVAL", "WAITING_INPUT", "FAILED", "PENDING")


@dataclass
class Migration:
    """What ``migrate`` found and did: the differences, the reasons it refused (none:
    it may go ahead), whether ``run.migrated`` was recorded (and at which seq)."""

    run_id: str
    workflow: str
    status: str
    from_hash: str
    to_hash: str
    at_node: str | None
    differences: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    dry_run: bool = False
    recorded: int | None = None  # the seq of run.migrated

    @property
    def ok(self) -> bool:
        return not self.refusals

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "status": self.status,
                "from_hash": self.from_hash, "to_hash": self.to_hash,
                "at_node": self.at_node, "differences": self.differences,
                "refusals": self.refusals, "dry_run": self.dry_run,
                "recorded": self.recorded}


class MigrationRefused(UsageError):
    """The static check refused the move; nothing was recorded. ``migration`` lists every
    reason (and every difference)."""

    def __init__(self, migration: Migration) -> None:
        reasons = "\n".join(f"  - {r}" for r in migration.refusals)
        super().__init__(f"run {migration.run_id!r} cannot be migrated onto the definition "
                         f"{migration.to_hash[:12]} (nothing was recorded):\n{reasons}")
        self.migration = migration


def differences(old: WorkflowSpec, new: WorkflowSpec) -> list[str]:
    """Every difference between two definitions, one line each, in declaration order:
    nodes, edges, state fields and their reducers, input, config, limits."""
    out = [f"node {name!r} removed" for name in old.nodes if name not in new.nodes]
    out += [f"node {name!r} added" for name in new.nodes if name not in old.nodes]
    for name in (n for n in old.nodes if n in new.nodes):
        a = old.nodes[name].model_dump(mode="json", exclude_defaults=True)
        b = new.nodes[name].model_dump(mode="json", exclude_defaults=True)
        if a != b:
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            out.append(f"node {name!r} changed ({', '.join(keys)})")
    before, after = _edges(old), _edges(new)
    out += [f"edge {d} removed" for d in before if d not in after]
    out += [f"edge {d} added" for d in after if d not in before]
    out += [f"state field {n!r} no longer declared" for n in old.state if n not in new.state]
    out += [f"state field {n!r} declared" for n in new.state if n not in old.state]
    for name in (n for n in old.state if n in new.state):
        was, now = old.state[name], new.state[name]
        if was.reducer != now.reducer:
            out.append(f"state field {name!r} changed (reducer {was.reducer} -> {now.reducer})")
        elif was != now:
            a, b = was.model_dump(mode="json"), now.model_dump(mode="json")
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            out.append(f"state field {name!r} changed ({', '.join(keys)})")
    if list(old.input) != list(new.input):
        out.append(f"input {list(old.input)} -> {list(new.input)}")
    for what in ("config", "limits"):
        if getattr(old, what) != getattr(new, what):
            out.append(f"{what} changed")
    return out


def _edges(spec: WorkflowSpec) -> list[str]:
    return [_edge(e) for e in spec.edges]


def _edge(e: EdgeSpec) -> str:
    what = e.describe()
    for key in ("when", "switch", "map"):
        value = getattr(e, key)
        if value:
            what += f" [{key}: {value}]"
    return what


def _reducer(spec: WorkflowSpec, name: str) -> str:
    fs = spec.state.get(name)
    return fs.reducer if fs is not None else "replace"


def refusals(view: RunView, old: WorkflowSpec, new: WorkflowSpec, plan: Plan,
             at: str | None) -> list[str]:
    """Every reason the run cannot continue on ``new`` (its ``plan``) from where it is."""
    out: list[str] = []
    if view.status not in MIGRATABLE:
        out.append(f"the run is {view.status}: only a waiting (for a decision or a "
                   "conversation's next message), failed or pending run is migrated (one "
                   "that is running moves at its next stop)")
    if new.workflow != old.workflow:
        out.append(f"the new definition is the workflow {new.workflow!r}, not "
                   f"{old.workflow!r}: a run stays a run of its workflow")
    if at is not None and at not in new.nodes:
        out.append(f"--at {at!r}: the new definition has no such node (its nodes: "
                   f"{', '.join(new.nodes)})")
    if at is None:
        out += _in_flight(view, new)
    else:
        out += _several_places(view, at)
    flow = view.flow
    half = sorted({old.edges[i].describe() for i, q in flow.barriers.items() if q})
    if half or any(flow.acts.values()) or flow.deferred:
        out.append("the run is between parallel branches (a join has had only some of its "
                   f"arrivals{': ' + '; '.join(half) if half else ''}); migrate it once it "
                   "waits or stops outside them")
    if view.maps:
        out.append(f"a mapped visit of {sorted(n for n, _ in view.maps)[0]!r} is in flight; "
                   "migrate the run once it is over")
    out += _reducers(view, old, new)
    out += _unprovided(view, new, plan, at)
    return out


def _reducers(view: RunView, old: WorkflowSpec, new: WorkflowSpec) -> list[str]:
    out = []
    for name in sorted(view.state):
        if name in old.state or name in new.state:
            a, b = _reducer(old, name), _reducer(new, name)
            if a != b:
                out.append(f"the reducer of the field {name!r} changed ({a} -> {b}): the "
                           "values the run already merged would mean something else; keep "
                           f"{a}, or give the new behaviour a new field")
    return out


def _in_flight(view: RunView, new: WorkflowSpec) -> list[str]:
    """Where the run is (its gate, the visits to run again, the nodes ready) that the new
    definition does not have."""
    out: list[str] = []
    for gate in view.pending_gates():
        ns = new.nodes.get(gate.node)
        if ns is None:
            out.append(f"the run waits at the gate {gate.node!r}, which the new definition "
                       "does not have; name where the run continues with --at NODE")
        elif gate.kind == "message" and new.chat != gate.node:
            out.append(f"the conversation waits for its next message to {gate.node!r}, but "
                       f"the new definition's chat: is {new.chat!r}; keep chat: "
                       f"{gate.node}")
        elif gate.kind == "approval" and ns.approval is None:
            out.append(f"the run waits at the gate {gate.node!r}, which is no longer an "
                       "approval in the new definition; name where the run continues "
                       "with --at NODE")
    waiting = {g.node for g in view.pending_gates()}
    for node, _ in view.running:
        if node not in new.nodes and node not in waiting:
            out.append(f"the node {node!r} is to run again ({view.status.lower()}), but "
                       "the new definition does not have it; name where the run "
                       "continues with --at NODE")
    for node in view.ready:
        if node not in new.nodes:
            out.append(f"the node {node!r} is ready to run, but the new definition does "
                       "not have it; name where the run continues with --at NODE")
    return out


def _several_places(view: RunView, at: str) -> list[str]:
    """``--at`` continues the run at one node: refused when the run is at more than one
    place (several gates waiting, or a gate beside branches still to run), where it
    would drop the others -- a gate would be passed without anyone's decision."""
    places = [f"the gate {gate_name(g)!r}" for g in view.pending_gates()]
    gated = {g.node for g in view.pending_gates()}
    places += [f"the node {n!r}" for n, _ in view.running if n not in gated]
    places += [f"the node {n!r} (ready)" for n in view.ready if n not in gated]
    if len(places) < 2:
        return []
    return [f"--at {at!r} continues the run at one node, but it is at {len(places)} places "
            f"({', '.join(places)}): the others would be dropped, and a gate passed with no "
            "decision. Keep each of them in the new definition under its name and migrate "
            "without --at, or let the run go on on this definition "
            "(`interlock resume RUN_ID --gate NODE --approve|--reject`)"]


def _still_to_run(view: RunView, plan: Plan, at: str | None) -> set[str]:
    """The nodes of the new graph the run may still execute, from where it will be."""
    probe = RunView(plan)
    if at is not None:
        probe.ready.append(at)
        return nodes_to_run(plan, probe)
    probe.ready.extend(n for n in view.ready if n in plan.nodes)
    for (node, visit), v in view.running.items():
        if node in plan.nodes:
            probe.running[(node, visit)] = v
    if any(src == START for _, src in view.due):
        probe.ready.extend(t for e in plan.start_edges for t in e.targets if t != END)
    # where the run is has no place in the new graph (refused for that too): what all
    # of it reads is checked
    return nodes_to_run(plan, probe) or set(plan.nodes)


def _unprovided(view: RunView, new: WorkflowSpec, plan: Plan, at: str | None) -> list[str]:
    """The fields the rest of the new graph reads that are neither in the run's state,
    nor declared, nor written by a node still to run that says it writes them."""
    todo = _still_to_run(view, plan, at)
    provided = set(view.state) | set(new.input) | set(new.state) | {"config", "run"}
    for name in todo:
        provided |= set(new.nodes[name].written(name) or ())
    provided |= {e.collect for e in new.edges if e.collect is not None}
    if any(e.catches is not None for e in plan.edges):
        provided.add(ERROR_FIELD)
    out = []
    for name in sorted(todo):
        for f in new.nodes[name].reads or ():
            if f not in provided:
                out.append(f"node {name!r} reads the field {f!r}, which the run does not "
                           "hold and nothing still to run provides; declare it under "
                           "'state:' (with a default) or in the 'writes:' of a node before it")
    for e in plan.edges:
        if not any(s in todo for s in e.sources):
            continue
        for key, expr in (("when", e.cond), ("switch", e.switch), ("map", e.mapping)):
            for f in expr.names if expr is not None else ():
                if f not in provided:
                    out.append(f"edge {e.spec.describe()}: {key} reads the field {f!r}, "
                               "which the run does not hold and nothing still to run "
                               "provides; declare it under 'state:' (with a default) or "
                               "in the 'writes:' of a node before it")
    return out


async def migrate(run_id: str, spec: WorkflowSpec, *, store: str | Store | None = None,
                  at: str | None = None, by: str | None = None, comment: str | None = None,
                  dry_run: bool = False) -> Migration:
    """Check that the run can continue on ``spec`` and record ``run.migrated`` (not with
    ``dry_run``). Raises `MigrationRefused` (a `UsageError`) listing every reason,
    nothing recorded. Nothing is executed."""
    st, owned = open_store_arg(store)
    try:
        if dry_run:
            return (await _check(st, run_id, spec, at, dry_run=True))[0]
        # claimed while it is checked and recorded: no one continues or decides the run
        # between the check and the record (a run being executed is refused: ClaimError)
        owner = make_owner()
        generation = await st.claim(run_id, owner, LEASE_SECONDS)
        try:
            found, loaded, kept = await _check(st, run_id, spec, at, dry_run=False)
            fields: dict[str, object] = {
                "from_hash": found.from_hash, "to_hash": found.to_hash, "by": by,
                "comment": comment, "at_node": at, "definition": spec.definition()}
            code = {**code_digests(spec), **kept}
            if code:
                fields["code"] = code  # what the run's code is compared with from now on
            journal = Journal(st, run_id, loaded.view, loaded.writer(),
                              claim=_claim_of(owner, generation))
            recs = await journal.commit([(L.RUN_MIGRATED, L.to_json_value(fields))])
            found.recorded = recs[0]["seq"]
            found.status = loaded.view.status
            return found
        finally:
            await st.release(run_id, owner)
    finally:
        if owned:
            await release_store(st)


async def _check(st: Store, run_id: str, spec: WorkflowSpec, at: str | None, *,
                 dry_run: bool) -> tuple[Migration, Loaded, CodeDigests]:
    """The migration found (refused: `MigrationRefused`), the run, and the recorded
    digests of its modules whose code changed that ``run.migrated`` keeps (a new
    definition does not accept changed code: `_code_moved`)."""
    loaded = await load_run(st, run_id)
    view = loaded.view
    current = view.migration["to_hash"] if view.migration else loaded.row.definition_hash
    definition = spec.definition()
    to_hash = L.definition_digest(definition)
    plan = reading_plan(spec)
    found = Migration(run_id, loaded.row.workflow, view.status, current, to_hash, at,
                      differences(loaded.spec, spec), dry_run=dry_run)
    found.refusals = refusals(view, loaded.spec, spec, plan, at)
    code, kept = await _code_moved(st, run_id, view, spec, same=to_hash == current)
    found.differences += code
    if to_hash == current and not code:
        found.refusals.insert(0, "the run is on this definition already (same hash), "
                                 "and its code is the code it was recorded with: "
                                 "nothing to migrate")
    if found.refusals:
        raise MigrationRefused(found)
    return found, loaded, kept


async def _code_moved(st: Store, run_id: str, view: RunView, spec: WorkflowSpec, *,
                      same: bool) -> tuple[list[str], CodeDigests]:
    """Each module whose digest differs from the one the run compares with (its last
    migration's, else its start's), one line each. A migration onto the definition the
    run is on (``same``) moves it onto the code as it is now -- none: there is nothing
    to migrate. One onto a new definition does not accept the changed code of a module
    the run ran: it keeps the recorded digest (returned), so that a continuation treats
    it as any code drift (said and recorded, or refused under --strict-code) until a
    migration onto the run's own file accepts it."""
    recorded = await recorded_code(st, run_id, view)
    if not recorded:  # (a log written before digests: nothing is compared)
        return [], {}
    now = code_digests(spec)
    if same:
        return [f"the code of module {m!r} changed ({_short(recorded.get(m))} -> "
                f"{_short(now.get(m))}): the run is moved onto the code as it is now"
                for m in sorted(recorded.keys() | now.keys())
                if recorded.get(m) != now.get(m)], {}
    kept = {m: d for m, d in sorted(recorded.items()) if m in now and now[m] != d}
    since = "recorded it" if view.migration is not None else "started"
    return [f"the code of module {m!r} changed since the run {since} ({_short(d)} -> "
            f"{_short(now[m])}): not accepted with the new definition -- continuing the run "
            "says so (run.code_changed) and --strict-code refuses it, until `interlock "
            f"migrate {run_id} --to FILE` (this file again, once migrated) accepts the code"
            for m, d in kept.items()], kept


def _short(digest: object) -> str:
    return str(digest).removeprefix("sha256:")[:12] if digest else "none"


__all__ = ["Migration", "MigrationRefused", "differences", "migrate", "refusals"]
