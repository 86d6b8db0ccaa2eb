"""Human decisions: what a decision is, who may make it, and the records it becomes.

A gate is a visit waiting for a human -- an ``approval:`` node, or a node
declared ``confirm: true`` whose body must not run unasked (SPEC §3). The
executor logs ``approval.requested`` and the run stops in WAITING_APPROVAL;
`decide` turns a `Decision` into the records that continue it:

    approve  approval.decided + node.completed {gate: {decision: approved, by, ...}}
    reject   approval.decided + node.completed {gate: {decision: rejected, ...}}
             (only edges reading <gate>.decision are followed; none -> REJECTED)
    modify   approval.decided + state.patched + node.completed {..., reenter: node}
    confirm  approve: approval.decided, then the body runs;
             reject: approval.decided + run.rejected, and the body never runs

Exactly one decision wins: these records are appended at the next seq of the
run's log, which a store accepts once; the loser gets a clear refusal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from . import _log as L
from . import _records as R
from ._bounds import check_data
from ._errors import UsageError
from ._fold import Gate, RunView
from ._model import WorkflowSpec
from ._state import check_whole_values

ENGINE = "interlock (deadline)"


@dataclass(frozen=True, slots=True)
class Decision:
    """A human's decision on a waiting gate. Build one with `approve`, `reject`, `modify`."""

    kind: Literal["approve", "reject", "modify"]
    by: str | None = None
    comment: str | None = None
    patch: dict[str, Any] = field(default_factory=dict)
    at: str | None = None  # modify: the node to re-enter at
    node: str | None = None  # which gate, when several are waiting
    # the decider's roles, as an authenticating tool (a server) vouches for them: an
    # ``approvers:`` entry ``role:NAME`` admits a decider with the role NAME
    roles: tuple[str, ...] = ()


def approve(by: str | None = None, comment: str | None = None, *,
            node: str | None = None) -> Decision:
    return Decision("approve", by, comment, node=node)


def reject(by: str | None = None, comment: str | None = None, *,
           node: str | None = None) -> Decision:
    return Decision("reject", by, comment, node=node)


def modify(patch: dict[str, Any], at: str | None = None, *, by: str | None = None,
           comment: str | None = None, node: str | None = None) -> Decision:
    if not isinstance(patch, dict) or not patch:
        raise UsageError("modify takes a non-empty JSON object of state fields to replace")
    return Decision("modify", by, comment, dict(patch), at, node)


Items = list[tuple[str, dict[str, Any]]]


def _now_iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), UTC).isoformat()


def expire(spec: WorkflowSpec, view: RunView) -> Items:
    """The engine's decisions for gates whose deadline has passed."""
    now = time.time()
    items: Items = []
    for gate in view.pending_gates():
        if gate.deadline is None or gate.deadline > now:
            continue
        ns = spec.nodes[gate.node]
        on_timeout = ns.approval.on_timeout if ns.approval is not None else "reject"
        comment = f"no decision before the deadline ({_now_iso(gate.deadline)})"
        if gate.kind == "confirm" or on_timeout == "reject":
            items += _records(spec, gate, "rejected", ENGINE, comment, timed_out=True)
        else:
            items += _records(spec, gate, "timed_out", ENGINE, comment, reenter=on_timeout,
                              timed_out=True)
    return items


def decide(spec: WorkflowSpec, view: RunView, decision: Decision, *,
           expired: Items | None = None) -> Items:
    """Check ``decision`` against the waiting gate and return the records it becomes.

    ``expired``: the records `expire` made for gates whose deadline has passed -- a
    decision on one of those comes too late. Raises UsageError (a refused decision)
    naming what is wrong and what is allowed.
    """
    timed_out = {(f["node"], f["visit"]) for t, f in expired or () if t == L.APPROVAL_DECIDED}
    waiting = view.pending_gates()
    late = [g for g in waiting if (g.node, g.visit) in timed_out]
    pending = [g for g in waiting if (g.node, g.visit) not in timed_out]
    too_late = [g for g in late if g.node == decision.node] if decision.node is not None \
        else (late if not pending else [])
    if too_late:
        gate = too_late[0]
        ns = spec.nodes[gate.node]
        then = ns.approval.on_timeout if ns.approval is not None else "reject"
        outcome = "rejects it" if then == "reject" or gate.kind == "confirm" \
            else f"re-enters the run at {then!r}"
        deadline = _now_iso(gate.deadline) if gate.deadline is not None else "its deadline"
        raise UsageError(f"the decision is refused: {gate.node!r} passed its deadline "
                         f"({deadline}) undecided, and its on_timeout {outcome}; resume the "
                         "run without a decision to apply that")
    if not pending:
        raise UsageError("the decision is refused: nothing is waiting")
    gate = _pick(pending, decision.node)
    ns = spec.nodes[gate.node]
    verb = {"approve": "approve", "reject": "reject", "modify": "modify"}[decision.kind]
    if verb not in gate.decisions:
        why = ""
        if verb == "modify":
            why = (" (a confirmation is approved or rejected; modify is for an approval: "
                   "node that declares on_modify)" if gate.kind != "approval"
                   else " (declare approval.on_modify to allow modify)")
        raise UsageError(f"{gate.node!r} accepts {', '.join(gate.decisions)}; not {verb}{why}")
    refused = approvers_refuse(spec, gate.node, decision.by, decision.roles)
    if refused is not None:
        raise UsageError(refused)
    if decision.kind == "approve":
        return _records(spec, gate, "approved", decision.by, decision.comment)
    if decision.kind == "reject":
        return _records(spec, gate, "rejected", decision.by, decision.comment)
    assert ns.approval is not None
    allowed = list(ns.approval.on_modify)
    target = decision.at or allowed[0]
    if target not in allowed:
        raise UsageError(f"re-entry at {target!r} is refused: {gate.node!r} allows modify to "
                         f"re-enter at {', '.join(allowed)} (approval.on_modify)")
    check_patch(spec, view, decision.patch)
    return _records(spec, gate, "modified", decision.by, decision.comment,
                    patch=L.to_json_value(decision.patch), reenter=target)


def approvers_refuse(spec: WorkflowSpec, node: str, by: str | None,
                     roles: tuple[str, ...] = ()) -> str | None:
    """Why ``by`` (with ``roles``) may not decide the gate ``node``, or None if they may:
    ``approvers:`` lists names and ``role:NAME`` entries."""
    ns = spec.nodes[node]
    approvers = list(ns.approval.approvers) if ns.approval is not None else []
    if not approvers or by in approvers or any(f"role:{r}" in approvers for r in roles):
        return None
    who = repr(by) if by else "an anonymous decider (no --by)"
    return f"{who} may not decide {node!r}; its approvers are: {', '.join(approvers)}"


def _pick(pending: list[Gate], node: str | None) -> Gate:
    if node is None:
        return pending[0]
    for gate in pending:
        if gate.node == node:
            return gate
    names = ", ".join(g.node for g in pending)
    raise UsageError(f"no decision is pending at {node!r}; waiting: {names}")


def known_fields(spec: WorkflowSpec, view: RunView) -> set[str]:
    known = set(spec.input) | set(spec.state) | set(view.state)
    for name, ns in spec.nodes.items():
        known |= set(ns.writes or ())
        if ns.approval is not None or ns.agent is not None:
            known.add(name)
    return known


def check_patch(spec: WorkflowSpec, view: RunView, patch: dict[str, Any]) -> None:
    known = known_fields(spec, view)
    unknown = sorted(k for k in patch if k not in known)
    if unknown:
        raise UsageError(f"the patch names field(s) the workflow does not know: "
                         f"{', '.join(unknown)}; known fields: {', '.join(sorted(known))}")
    check_data(patch, "the patch")  # its depth, before it is converted
    plain = L.to_json_value(patch)
    check_data(None, "the patch", len(L.dumps(plain)))
    # a patch replaces whole fields, bypassing reducers: a reducer field gets its kind
    check_whole_values(plain, {k: v.reducer for k, v in spec.state.items()},
                       "the patch")


def _records(spec: WorkflowSpec, gate: Gate, decision: str, by: str | None,
             comment: str | None, *, patch: dict[str, Any] | None = None,
             reenter: str | None = None, timed_out: bool = False) -> Items:
    base = {"node": gate.node, "visit": gate.visit, "kind": gate.kind, "decision": decision,
            "by": by, "comment": comment, "patch": patch, "reenter": reenter,
            "timed_out": timed_out or None, "key": gate.key}
    items: Items = [(L.APPROVAL_DECIDED, base)]
    if gate.kind == "tool":
        return items  # the node runs again and reads the decision from ctx.confirm
    if gate.kind == "confirm":
        if decision != "approved":
            msg = f"{gate.node!r} needed confirmation and was {decision} by {by}"
            items.append(R.run_rejected(gate.node, msg + (f": {comment}" if comment else "")))
        return items
    record: dict[str, Any] = {"decision": decision, "by": by, "comment": comment,
                              "at": _now_iso()}
    if patch is not None:
        record["patch"] = patch
        items.append((L.STATE_PATCHED, {"node": gate.node, "patch": patch}))
    if reenter is not None:
        record["reenter"] = reenter
    items.append(R.gate_completed(gate.node, gate.visit, {gate.node: record}, reenter))
    return items
