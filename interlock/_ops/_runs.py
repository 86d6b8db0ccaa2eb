"""Operations on stored runs: resume, trace, fork, list, append a note -- all from the log.

Every function here reads a run's records and folds them with the same
`RunView` the executor uses; none keeps a second account of a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _log as L
from .._definition._bounds import check_config, check_run_id
from .._definition._model import WorkflowSpec, check_limits
from .._engine._fold import RunResult, RunView, result_of
from .._engine._journal import Journal
from .._engine._view import gate_key
from .._errors import ClaimError, ClaimLost, ConflictError, LogError, RunNotFound, UsageError
from .._hints import decide_hint
from .._store import RunRow, Store, Summary, release_store
from ._children import (
    _child_gate,
    _decide_child,
    _expired_children,
    _slots,
    _unblocked,
    continued,
    head,
)
from ._claims import LEASE_SECONDS, _claim_of, make_owner, make_run_id
from ._code import CodeChanged, check_code, strict_code
from ._execute import Listener, _traced, drive
from ._final import final_failure, refusal, unknown_note
from ._gate_closed import closed_refusal, raise_closed, refuse_closed
from ._gate_refusals import check_named, decided_text
from ._load import (
    _BROKEN_LOG_ADVICE,
    RESUMABLE,
    TERMINAL_STATUSES,
    TRACE_PAGE,
    Functions,
    Loaded,
    expander,
    imply,
    load_resumable,
    load_run,
    open_store_arg,
)
from ._orphans import close_stranded
from ._outcomes import unknown_outcomes
from ._verify import ChildLinks

if TYPE_CHECKING:
    from .._engine._approvals import Decision


async def resume(run_id: str, decision: Decision | None = None, *,
                 store: str | Store | None = None, workflow: Functions | None = None,
                 config: Mapping[str, object] | None = None,
                 limits: Mapping[str, object] | None = None, force: bool = False,
                 listener: Listener | None = None, detach: bool = False) -> RunResult:
    """Continue a run from its log: interrupted visits run again, nothing completed does.

    A run waiting for a human needs a `Decision` (`approve`, `reject`, `modify`),
    unless a gate's deadline has passed: then the engine decides, and says so.
    ``detach``: record the decision (and the resume) and return without executing: the
    run is PENDING until a worker (``interlock worker``) claims and continues it.
    A decision on a run another process is executing is recorded for that process,
    which continues the gate's branch: the run is returned as it stands.
    """
    result, _ = await resume_gate(run_id, decision, store=store, workflow=workflow,
                                  config=config, limits=limits, force=force,
                                  listener=listener, detach=detach)
    return result


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What `decide_gate` did: the run as it stands after, and -- when another process
    was executing the run -- that process's owner name (it folds the decision in and
    continues the gate's branch; the decision is recorded all the same)."""

    result: RunResult
    handed_over: str | None = None


async def decide_gate(run_id: str, gate: str | None, decision: Decision, *,
                      by: str | None = None, via: str | None = None,
                      store: str | Store | None = None, workflow: Functions | None = None,
                      listener: Listener | None = None, detach: bool = False
                      ) -> GateDecision:
    """Decide one gate of a run: ``gate`` is its name in ``waiting.pending``
    (a node, ``NODE[i]`` for a map item's, ``parent_node/child_gate`` for a child run's;
    None: the oldest waiting), ``decision`` an `approve`/`reject`/`modify`, ``by`` who
    decides (default: the decision's), ``via`` where (``"cli"``, ``"api"``,
    ``"dashboard"``, ``"slack"``, ... -- recorded with it).

    Exactly one decision per gate wins: another on the same gate is refused
    (`GateTaken`, a UsageError: exit 2, a 409), as is a decision the gate does not accept
    (UsageError; `NotAnApprover` for a decider its ``approvers:`` do not list). Decided
    here, the run executes on to its next stop (``detach``: recorded only, for a
    worker); while another process executes the run, the decision is recorded for it
    and ``handed_over`` names it."""
    from dataclasses import replace

    decision = replace(decision, node=gate if gate is not None else decision.node,
                       by=by if by is not None else decision.by,
                       via=via if via is not None else decision.via)
    result, owner = await resume_gate(run_id, decision, store=store, workflow=workflow,
                                      listener=listener, detach=detach)
    return GateDecision(result, owner)


# how long a decision on a run another process executes waits for that process to fold
# it in (or to let the run go, when this one records it itself) before it returns
HANDOVER_SECONDS = 2 * LEASE_SECONDS
HANDOVER_POLL = 0.05


async def resume_gate(run_id: str, decision: Decision | None = None, *,
                      store: str | Store | None = None, workflow: Functions | None = None,
                      config: Mapping[str, Any] | None = None,
                      limits: Mapping[str, Any] | None = None, force: bool = False,
                      listener: Listener | None = None, detach: bool = False
                      ) -> tuple[RunResult, str | None]:
    """`resume`, and whether the decision was handed over: the owner executing the run
    it was recorded for (None when this call recorded it and executed the run, or there
    was no decision).

    A decision on a gate of this run is first offered (`Store.offer_decision`: exactly
    one per gate wins, refused for the others), then recorded under the run's claim --
    here, or by the process executing the run, which folds offered decisions in."""
    st, owned = open_store_arg(store)
    try:
        offered_gate: tuple[str, int, str | None, float] | None = None
        if decision is not None:
            offered_gate = await _offer(st, run_id, decision, workflow)
        if offered_gate is not None:
            decision = None  # the offer is folded in with the others (`_resume`)
        elif decision is not None:  # a child run's gate, while another process executes
            handed = await _offer_child(st, run_id, decision, workflow)
            if handed is not None:
                return await _handover(st, run_id, handed[0], handed[1], workflow=workflow,
                                       config=config, limits=limits, listener=listener,
                                       detach=detach)
        try:
            result = await _resume(st, run_id, decision, workflow=workflow, config=config,
                                   limits=limits, force=force, listener=listener,
                                   detach=detach)
            if offered_gate is not None and result.status == "REJECTED":
                await refuse_closed(st, run_id, offered_gate, workflow)
            return result, None
        except (ClaimError, ConflictError) as exc:
            # executed elsewhere, or changed since it was read (another decision recorded
            # first): the offer stands -- folded in there, or recorded here once free
            if offered_gate is None or isinstance(exc, ClaimLost | CodeChanged):
                raise
            owner = exc.owner if isinstance(exc, ClaimError) else "another process"
            return await _handover(st, run_id, offered_gate, owner, workflow=workflow,
                                   config=config, limits=limits, listener=listener,
                                   detach=detach)
        except UsageError:
            # e.g. the run ended meanwhile: the process that ended it may have folded our
            # offer in first (decisions on two gates of one run both win)
            folded = await _folded(st, run_id, offered_gate, workflow) \
                if offered_gate is not None else None
            if folded is None:
                raise
            return folded, "another process"
    finally:
        if owned:
            await release_store(st)


async def _offer(st: Store, run_id: str, decision: Decision, workflow: Functions | None
                 ) -> tuple[str, int, str | None, float] | None:
    """Check ``decision`` against the run's gate it is for and offer it: the gate it was
    offered for, or None for a decision this run does not take by an offer (a gate of a
    child run, a run waiting for nothing: `_resume` decides or refuses it as before).
    Raises UsageError when refused (checked, or another decision won the gate)."""
    from .._engine._approvals import decide, expire, offer_of
    from .._engine._gates import gate_name, gate_slot

    loaded = await load_run(st, run_id, workflow=workflow, executable=strict_code())
    view = loaded.view
    pending = view.pending_gates()
    if view.status == "REJECTED" and decision.node is not None:
        closed = closed_refusal(loaded, run_id, lambda g: gate_name(g) == decision.node)
        if closed is not None:  # a rejection closed it a moment ago
            raise closed
    if decision.node is not None and view.status != "WAITING_INPUT" and (
            pending or view.status in TERMINAL_STATUSES or view.status == "PENDING"):
        # a gate named: does it wait? (a PENDING run: decided, for a worker to continue)
        await check_named(st, run_id, loaded, decision.node, via=decision.via,
                          asked=decision.requested_at)
    if not pending or view.status in TERMINAL_STATUSES or view.status == "WAITING_INPUT":
        return None  # (a conversation: `_resume` refuses)
    if strict_code():  # refused before anything is offered (`CodeChanged`)
        await check_code(st, run_id, loaded.plan, view)
    expired = expire(loaded.spec, view)
    if _child_gate(view, decision, []) is not None or \
            (decision.node is not None and "/" in decision.node):
        return None
    records = decide(loaded.spec, view, decision, expired=expired)  # (raises: refused)
    decided = records[0][1]
    gate = view.gates[gate_key(decided["node"], decided["visit"], decided.get("item"))]
    won = await st.offer_decision(run_id, gate_slot(gate), offer_of(gate, decision))
    if won is not None:
        raise GateTaken(f"the decision is refused: gate {gate_name(gate)!r} of run "
                        f"{run_id!r} was decided already: {decided_text(won)}; exactly one "
                        f"decision per gate wins -- see `interlock status {run_id}`")
    return gate.slot[0], gate.visit, gate.key, gate.requested_at


async def _offer_child(st: Store, run_id: str, decision: Decision, workflow: Functions | None
                       ) -> tuple[tuple[str, int, str | None, float], str] | None:
    """A decision on a gate of a child run while another process executes this run (its
    other branches running): decided in the child (parked, unclaimed: exactly one
    decision per gate wins there, the child's log refusing the second), then offered to
    the executor for this run's gate that waits through the child -- it runs the node
    again, which continues the child. The gate offered for and the executor; None when
    the run is not executed elsewhere or the decision is not for a child's gate."""
    from dataclasses import replace

    from .._engine._approvals import offer_of
    from .._engine._gates import gate_name, gate_slot
    from .._store import owner_gone

    row = await st.get_run(run_id)
    if row.owner is None or (row.lease_until or 0.0) <= time.time() or owner_gone(row.owner):
        return None
    loaded = await load_run(st, run_id, workflow=workflow)
    child = _child_gate(loaded.view, decision, await _unblocked(st, run_id, loaded.view))
    if child is None or loaded.view.status in TERMINAL_STATUSES:
        return None
    gate, below = child
    await _decide_child(st, str(gate.key), below, f"{head(gate)}/")  # (raises: refused)
    # (a taken slot: another of the child's gates was offered first -- the node runs
    # again either way, and finds the child with both decisions)
    await st.offer_decision(run_id, gate_slot(gate), offer_of(gate, replace(
        decision, kind="reject" if decision.kind == "reject" else "approve",
        node=gate_name(gate), data=None, patch={}, at=None)))
    return (gate.slot[0], gate.visit, gate.key, gate.requested_at), str(row.owner)


class GateTaken(UsageError):
    """Another decision won the gate (a server answers 409)."""


async def _folded(st: Store, run_id: str, gate: tuple[str, int, str | None, float],
                  workflow: Functions | None) -> RunResult | None:
    """The run as it stands if the decision offered for ``gate`` is in its log (folded in
    by whichever process executed it), else None."""
    loaded = await load_run(st, run_id, workflow=workflow)
    g = loaded.view.gates.get(gate[:2])
    if g is not None and g.decision is None and g.key == gate[2] \
            and g.requested_at == gate[3]:
        return None  # still waiting: not folded in
    raise_closed(loaded, run_id, gate)
    offers = await st.decisions(run_id)
    mine = [d for d in offers.values() if gate_key(str(d.get("node")), int(d.get("visit") or 0),
                                                    d.get("item")) == gate[:2]
            and d.get("requested_at") == gate[3]]
    return result_of(run_id, loaded.row.workflow, loaded.view) if mine else None


async def _handover(st: Store, run_id: str, gate: tuple[str, int, str | None, float],
                    owner: str, *,
                    workflow: Functions | None, config: Mapping[str, Any] | None,
                    limits: Mapping[str, Any] | None, listener: Listener | None,
                    detach: bool) -> tuple[RunResult, str | None]:
    """Another process executes the run: it folds the decision offered for ``gate`` in
    within its poll interval. Wait for that -- or for the run to be let go, then record
    it here (`_resume`) -- up to `HANDOVER_SECONDS`; the run as it stands, and the owner
    it was handed over to."""
    loop = asyncio.get_running_loop()
    until = loop.time() + HANDOVER_SECONDS
    while True:
        loaded = await load_run(st, run_id, workflow=workflow)
        g = loaded.view.gates.get(gate[:2])
        if g is None or g.decision is not None or g.key != gate[2] \
                or g.requested_at != gate[3]:  # folded in (or asked again since)
            raise_closed(loaded, run_id, gate)  # (or closed by a rejection)
            return result_of(run_id, loaded.row.workflow, loaded.view), owner
        if loop.time() >= until:  # still offered: whoever executes the run next folds it
            return result_of(run_id, loaded.row.workflow, loaded.view), owner
        await asyncio.sleep(HANDOVER_POLL)
        try:
            result = await _resume(st, run_id, None, workflow=workflow, config=config,
                                   limits=limits, listener=listener, detach=detach)
        except ClaimLost:
            raise
        except (ClaimError, ConflictError, UsageError):  # executed there, or moved on: again
            continue
        if result.status == "REJECTED":  # (our gate closed by a rejection folded first?)
            await refuse_closed(st, run_id, gate, workflow)
        return result, None


async def _resume(st: Store, run_id: str, decision: Decision | None, *,
                  workflow: Functions | None, config: Mapping[str, Any] | None,
                  limits: Mapping[str, Any] | None, force: bool = False,
                  listener: Listener | None, detach: bool) -> RunResult:
    loaded = await load_resumable(st, run_id, workflow)
    view = loaded.view
    fields = _overrides(config, limits)
    first: list[tuple[str, dict[str, Any]]] = []
    if view.status == "WAITING_INPUT":  # a conversation
        raise UsageError(f"run {run_id!r} is a conversation waiting for its next message, "
                         f"not for a decision: send one (interlock send {run_id} TEXT); "
                         "there is nothing to resume or decide")
    stopped = await unknown_outcomes(st, run_id, view) \
        if view.gates and view.status not in TERMINAL_STATUSES else []
    if stopped:  # approved actions that started and have no outcome: a person decides
        if decision is not None:
            raise UsageError(f"run {run_id!r} is not waiting for a decision yet: "
                             f"{stopped[0][1]['node']!r} was approved and started, and its "
                             "outcome is unknown (the process running it stopped); resume it "
                             "without a decision: it then waits at an unknown_outcome gate")
        first += stopped
    elif view.pending_gates() and view.status not in TERMINAL_STATUSES:
        first += await _decisions(st, run_id, loaded, decision)
    elif decision is not None:
        raise UsageError(f"run {run_id!r} is {view.status}, not waiting for a decision; "
                         "the decision is refused")
    elif view.status == "FAILED" and final_failure(view.error) is not None:
        raise UsageError(refusal(run_id, str(final_failure(view.error))))  # nothing recorded
    elif view.status not in RESUMABLE:
        raise UsageError(f"run {run_id!r} is {view.status}; only a failed, interrupted or "
                         "waiting run can be resumed")
    resumed = dict(fields, by=decision.by if decision else _by(first))
    if detach:
        resumed["detached"] = True
    spans, listener = await _traced(st, run_id, loaded.row.workflow, listener)
    try:
        result = await drive(loaded.plan, st, run_id, view, loaded.writer(),
                             first=[(L.RUN_RESUMED, resumed), *first], force=force,
                             listener=listener, execute=not detach)
    finally:
        if spans is not None:
            spans.end()
    link = loaded.row.options.get("parent")
    if link is not None:  # a child run resumed on its own: its parent goes on too
        await _continue_parent(st, run_id, link, detach=detach)
    return result


async def _decisions(st: Store, run_id: str, loaded: Loaded, decision: Decision | None
                     ) -> list[tuple[str, dict[str, Any]]]:
    """What the resume of a run with waiting gates records before it goes on: the gates
    whose deadline passed, the child runs that wait no more, ``decision`` -- on a gate of
    the run's own, or forwarded to the child run it waits through -- and the
    decisions offered for its gates (`Store.offer_decision`; this call's among them)."""
    from .._engine._approvals import decide, expire, offered
    from .._engine._gates import gate_name, oldest

    view = loaded.view
    expired = expire(loaded.spec, view)
    moved = await _unblocked(st, run_id, view)  # child runs that wait no more
    first = expired + moved
    child = _child_gate(view, decision, moved) if decision is not None else None
    if moved and decision is not None and child is None:
        raise UsageError(
            f"run {run_id!r}: the child run {moved[0][1]['key']!r} it waited for "
            "does not wait there any more (decided or continued on its own, or "
            "not this run's: a fork's); resume it without a decision first, then "
            "decide what it waits for then")
    if child is not None:  # a gate inside a child run: it decides it
        gate, below = child
        await _decide_child(st, str(gate.key), below, f"{head(gate)}/")
        assert decision is not None
        first.append(continued(
            gate, _PAST[decision.kind], by=decision.by, comment=decision.comment,
            # the child's gate decided: named, or (none named) the one it waits at longest
            path=decision.node if decision.node and "/" in decision.node else gate.path))
    elif decision is not None:
        first += decide(loaded.spec, view, decision, expired=expired)
    else:  # a gate in a child run whose deadline passed: decided there
        first += await _expired_children(st, view, moved)
    # the decisions offered for gates still waiting
    done = _slots([(t, f) for t, f in first if t == L.APPROVAL_DECIDED])
    if not any(t == L.RUN_REJECTED for t, _ in first):
        offers = await st.decisions(run_id)
        if offers:
            first += offered(loaded.spec, view,
                             {k: d for k, d in offers.items()
                              if gate_key(str(d.get("node")), int(d.get("visit") or 0),
                                          d.get("item")) not in done},
                             expired=first)
    if decision is None and not first and view.status == "WAITING_APPROVAL":
        gate = oldest(view.pending_gates())
        hint = decide_hint(run_id, {"node": gate_name(gate), "kind": gate.kind,
                                    "decisions": gate.decisions})
        raise UsageError(f"run {run_id!r} is waiting for a decision at "
                         f"{gate_name(gate)!r}{unknown_note(gate.kind)}; decide it: {hint} "
                         "(interlock.approve/reject/modify in Python)")
    return first


def _by(first: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Who resumed the run: the decider of its first decision folded in, if any."""
    for rtype, fields in first:
        if rtype == L.APPROVAL_DECIDED and fields.get("decision") != "closed":
            by = fields.get("by")
            return by if isinstance(by, str) else None
    return None


_PAST = {"approve": "approved", "reject": "rejected", "modify": "modified"}


async def _continue_parent(store: Store, run_id: str, link: Mapping[str, object], *,
                           detach: bool = False) -> None:
    """A child run was resumed on its own: continue its parent if it waits for it (or was
    interrupted) -- the node runs again and finds the child as it now is."""
    parent_id = str(link["run"])
    try:
        parent = await load_run(store, parent_id)
    except RunNotFound:
        return
    view = parent.view
    waits = any(g.kind == "workflow" and g.key == run_id for g in view.pending_gates())
    if waits or view.status in ("RUNNING", "RETRYING"):
        with contextlib.suppress(ClaimError, UsageError, LogError):  # being executed: it will see
            await resume(parent_id, store=store, detach=detach)


def _overrides(config: Mapping[str, object] | None,
               limits: Mapping[str, object] | None) -> dict[str, object]:
    out: dict[str, object] = {}
    if config:
        check_config(config)
        out["config"] = L.to_json_value(dict(config))
    if limits:
        out["limits"] = check_limits(limits)
    return out


TRACE_KEYS = ("seq", "type", "node", "at", "duration_ms", "attempt", "tokens", "error")


async def trace(run_id: str, *, store: str | Store | None = None) -> list[dict[str, Any]]:
    """The run's records, oldest first, each with at least the trace keys; in log format
    2, a record the definition implies more of has them in ``implies`` (as format 1
    wrote them, with its seq and ``implied: true``: `_engine._expand`)."""
    return [rec async for page in trace_pages(run_id, store=store) for rec in page]


async def trace_pages(run_id: str, *, store: str | Store | None = None,
                      page: int | None = None, after: int = 0
                      ) -> AsyncIterator[list[dict[str, Any]]]:
    """`trace`'s records a page (default `TRACE_PAGE`) at a time: a long run's log is
    never held whole. ``after``: only the records with a greater seq."""
    st, owned = open_store_arg(store)
    try:
        async for records in _trace_pages(st, run_id, page or TRACE_PAGE, after, ()):
            yield records
    finally:
        if owned:
            await release_store(st)


async def _trace_pages(st: Store, run_id: str, page: int, after: int, above: tuple[str, ...]
                       ) -> AsyncIterator[list[dict[str, Any]]]:
    row = await st.get_run(run_id)
    links = ChildLinks(row, above)
    expand = await expander(st, row, after)
    async for entries in st.iter_entries(run_id, after=after, page=page):
        records = [trace_record(run_id, entry) for entry in entries]
        if expand is not None:  # log format 2: what each implies, in ``implies``
            imply(row, expand, records)
        for rec in records:  # a child run's records, nested under its start
            child = await links.follow(st, rec)
            if child is not None:
                rec["records"] = [{**r, "run_id": child} for pg in
                                  [p async for p in _trace_pages(st, child, page, 0,
                                                                 links.path)]
                                  for r in pg]
        yield records


def trace_record(run_id: str, entry: L.Entry) -> dict[str, Any]:
    """The stored entry as a trace shows it: the record, the trace keys, its hash."""
    try:
        rec = entry.record()
    except ValueError:  # orjson.JSONDecodeError: the stored text was changed
        raise LogError(f"run {run_id!r}: the log is broken at record {entry.seq} (its data "
                       f"is not valid JSON); {_BROKEN_LOG_ADVICE.format(run_id=run_id)}",
                       run_id=run_id) from None
    for key in TRACE_KEYS:
        rec.setdefault(key, None)
    rec["hash"] = entry.hash
    return rec


async def fork(run_id: str, at: int, *, store: str | Store | None = None,
               workflow: Functions | None = None, config: Mapping[str, object] | None = None,
               patch: Mapping[str, object] | None = None, new_run_id: str | None = None,
               limits: Mapping[str, object] | None = None,
               listener: Listener | None = None) -> RunResult:
    """Start a new run from the state at record ``at`` of ``run_id`` and run it.

    The new run's records 1..at are byte-identical copies of the original's (so
    their hashes match); record at+1 is ``run.forked`` with the parent, the config
    and limit overrides and the state patch (the other limits are the parent's, as
    they were at ``at``). The original run is not touched.
    """
    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id, workflow=workflow, executable=True, upto=at)
        if not 1 <= at <= len(loaded.entries):
            raise UsageError(f"run {run_id!r} has records 1..{len(loaded.entries)}; "
                             f"cannot fork at {at}")
        if patch is not None and not isinstance(patch, Mapping):
            raise UsageError("the patch is a JSON object of state fields")
        if patch:
            from .._engine._approvals import check_patch

            check_patch(loaded.spec, loaded.view, dict(patch))  # as modify's is
        prefix = loaded.entries[:at]
        fields = _overrides(config, limits)
        now = time.time()
        fields.update(parent_run=run_id, parent_seq=at,
                      patch=L.to_json_value(dict(patch)) if patch else None,
                      deadlines=_fresh_deadlines(loaded.spec, loaded.view, now) or None)
        rid = new_run_id or make_run_id()
        check_run_id(rid)
        row = loaded.row
        new_row = RunRow(run_id=rid, workflow=row.workflow, definition=row.definition,
                         definition_hash=row.definition_hash, input=row.input,
                         options=row.options, created_at=now,
                         summary=Summary(status="RUNNING", last_seq=at,
                                         last_hash=prefix[-1].hash, updated_at=now),
                         parent_run=run_id, parent_seq=at)
        await st.create_run(new_row, prefix)
        writer = L.LogWriter(at, prefix[-1].hash, key=loaded.key)
        spans, listener = await _traced(st, rid, row.workflow, listener)
        try:
            # run.forked re-opens the run at that point, whatever its status was there
            return await drive(loaded.plan, st, rid, loaded.view, writer,
                               first=[(L.RUN_FORKED, fields)], listener=listener)
        finally:
            if spans is not None:
                spans.end()
    finally:
        if owned:
            await release_store(st)


def _fresh_deadlines(spec: WorkflowSpec, view: RunView, now: float
                     ) -> list[dict[str, Any]]:
    """A fork that waits at an approval gives it its full ``timeout`` again, from now: the
    parent's deadline has usually passed, and a fork is a new run."""
    out = []
    for gate in view.pending_gates():
        ns = spec.nodes[gate.node]
        if gate.kind == "approval" and ns.approval is not None and ns.approval.timeout:
            out.append({"node": gate.node, "visit": gate.visit,
                        "deadline": round(now + ns.approval.timeout, 6)})
    return out


async def list_runs(*, store: str | Store | None = None, status: str | None = None,
                    workflow: str | None = None, limit: int = 100) -> list[RunRow]:
    st, owned = open_store_arg(store)
    try:
        rows = await st.list_runs(status=status, workflow=workflow, limit=limit)
        if status in (None, "WAITING_APPROVAL") and await close_stranded(st, rows):
            # waiting children of ended parents, closed by this look: listed as they are
            rows = await st.list_runs(status=status, workflow=workflow, limit=limit)
        return rows
    finally:
        if owned:
            await release_store(st)


async def append_note(run_id: str, rtype: str, fields: Mapping[str, object], *,
                      store: Store) -> None:
    """Append one record that changes nothing in the run (a tool's note, such as a
    server's ``notify.sent``) to its log, under the run's claim: claimed, read, chained,
    committed, released. `ClaimError` while another owner executes the run;
    `UsageError` once it has ended, unless ``rtype`` is one that may follow a run's
    final record (``notify.sent``, `_log.AFTER_END`)."""
    owner = make_owner()
    generation = await store.claim(run_id, owner, LEASE_SECONDS)
    try:
        loaded = await load_run(store, run_id)
        if loaded.view.status in TERMINAL_STATUSES and rtype not in L.AFTER_END:
            raise UsageError(f"run {run_id!r} has ended ({loaded.view.status}): no "
                             f"{rtype} is appended after its final record")
        journal = Journal(store, run_id, loaded.view, loaded.writer(),
                          claim=_claim_of(owner, generation))
        await journal.commit([(rtype, L.to_json_value(dict(fields)))])
    finally:
        await store.release(run_id, owner)
