"""Human decisions: what a decision is, who may make it, and the records it becomes.

A gate is a visit waiting for a human -- an ``approval:`` node, or a node
declared ``confirm: true`` whose body must not run unasked. The
executor logs ``approval.requested`` and the run stops in WAITING_APPROVAL;
`decide` turns a `Decision` into the records that continue it:

    approve  approval.decided + node.completed {gate: {decision: approved, by, ...}}
    reject   approval.decided + node.completed {gate: {decision: rejected, ...}}
             (only edges reading <gate>.decision are followed; none -> REJECTED)
    modify   approval.decided + state.patched + node.completed {..., reenter: node}
    confirm  approve: approval.decided, then the body runs;
             reject: approval.decided + run.rejected, and the body never runs
    tool     (``ctx.confirm`` inside a node: a guarded tool) approval.decided + the
             decision journaled for the node (`Context.decision`: its comment, and a
             modify's patch -- a tool call's edited arguments); the node runs again

A gate may take input: an approval's ``input:`` schema is what a decision's
``data`` must satisfy (the gate's record carries it), and a confirmation asked with
``edit=`` (a guarded tool's arguments) checks a modify's patch against that schema. A
decision that does not fit is refused before anything is recorded.

Exactly one decision wins: these records are appended at the next seq of the
run's log, which a store accepts once; the loser gets a clear refusal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from .. import _log as L
from .._definition._bounds import check_data
from .._definition._model import NodeSpec, WorkflowSpec
from .._definition._state import check_outcome, check_whole_values
from .._errors import UsageError
from . import _records as R
from ._fold import RunView
from ._gates import ambiguous, gate_name, oldest
from ._item_gates import item_decided
from ._view import Gate, gate_key

ENGINE = "interlock (deadline)"

log = logging.getLogger("interlock")


@dataclass(frozen=True, slots=True)
class Decision:
    """A human's decision on a waiting gate. Build one with `approve`, `reject`, `modify`."""

    kind: Literal["approve", "reject", "modify"]
    by: str | None = None
    comment: str | None = None
    patch: dict[str, Any] = field(default_factory=dict)
    at: str | None = None  # modify: the node to re-enter at
    node: str | None = None  # which gate, when several are waiting
    data: Any = None  # approve/reject: what the gate's ``input:`` schema asks for
    # the decider's roles, as an authenticating tool (a server) vouches for them: an
    # ``approvers:`` entry ``role:NAME`` admits a decider with the role NAME
    roles: tuple[str, ...] = ()
    # where it was made (the surface: "cli", "api", "dashboard", "slack", ...): recorded
    via: str | None = None
    # with ``node`` (required): the asking it answers (the gate's ``requested_at``, as
    # ``waiting.pending`` shows it), refused once the gate was asked again: a chat's
    # button, an inbox card decides only the request it was shown for
    requested_at: float | None = None

    def __post_init__(self) -> None:
        if self.requested_at is not None and self.node is None:
            raise UsageError("a decision pinned to an asking (requested_at) names its gate "
                             "too (node): without it, it would decide the oldest gate")


def approve(by: str | None = None, comment: str | None = None, *,
            node: str | None = None, data: Any = None) -> Decision:
    """Approve the waiting gate; ``data`` (JSON data) answers an approval's ``input:``."""
    return Decision("approve", by, comment, node=node, data=data)


def reject(by: str | None = None, comment: str | None = None, *,
           node: str | None = None, data: Any = None) -> Decision:
    """Reject the waiting gate. On a guarded tool call the model gets ``comment`` with
    the refusal; ``data`` (JSON data) answers an approval's ``input:``."""
    return Decision("reject", by, comment, node=node, data=data)


def modify(patch: dict[str, Any], at: str | None = None, *, by: str | None = None,
           comment: str | None = None, node: str | None = None) -> Decision:
    """Correct state fields and re-enter at ``at`` (an approval's ``on_modify``); on a
    guarded tool call, ``{"arguments": {...}}`` runs the tool with edited arguments."""
    if not isinstance(patch, dict) or not patch:
        raise UsageError("modify takes a non-empty JSON object: state fields to replace "
                         "(an approval), or {\"arguments\": {...}} (a guarded tool call)")
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
        if any(t == L.RUN_REJECTED for t, _ in items):
            break  # an expired gate's rejection ended the run, closing the others
        staged = {gate_key(f["node"], f["visit"], f.get("item"))
                  for t, f in items if t == L.APPROVAL_DECIDED}
        ns = spec.nodes[gate.node]
        on_timeout = ns.approval.on_timeout if ns.approval is not None else "reject"
        comment = f"no decision before the deadline ({_now_iso(gate.deadline)})"
        if gate.kind == "confirm" or on_timeout == "reject":
            items += _records(spec, view, gate, "rejected", ENGINE, comment, timed_out=True,
                              staged=staged)
        else:
            items += _records(spec, view, gate, "timed_out", ENGINE, comment, reenter=on_timeout,
                              timed_out=True, staged=staged)
    return items


def decide(spec: WorkflowSpec, view: RunView, decision: Decision, *,
           expired: Items | None = None) -> Items:
    """Check ``decision`` against the waiting gate and return the records it becomes.

    ``expired``: the records staged before this decision -- `expire`'s for gates whose
    deadline has passed (a decision on one of those comes too late), and the decisions
    folded in with it (`offered`): a rejection closes only the gates none of them
    decided. Raises UsageError (a refused decision)
    naming what is wrong and what is allowed.
    """
    timed_out = {gate_key(f["node"], f["visit"], f.get("item"))
                 for t, f in expired or () if t == L.APPROVAL_DECIDED}
    waiting = view.pending_gates()
    late = [g for g in waiting if g.slot in timed_out]
    pending = [g for g in waiting if g.slot not in timed_out]
    too_late = [g for g in late if g.node == decision.node] if decision.node is not None \
        else (late if not pending else [])
    if too_late:
        raise _too_late(spec, too_late[0])
    if not pending:
        raise UsageError("the decision is refused: nothing is waiting")
    gate = _pick(pending, decision.node, decision.via)
    ns = spec.nodes[gate.node]
    verb = {"approve": "approve", "reject": "reject", "modify": "modify"}[decision.kind]
    if verb not in gate.decisions:
        why = ""
        if verb == "modify":
            why = (" (declare approval.on_modify to allow modify)" if gate.kind == "approval"
                   else " (this confirmation offers no edit: a guarded tool's arguments can be "
                   "edited unless the agent redacts them)" if gate.kind == "tool"
                   else " (a confirmation is approved or rejected; modify is for an approval: "
                   "node that declares on_modify)")
        raise UsageError(f"{gate.node!r} accepts {', '.join(gate.decisions)}; not {verb}{why}")
    refused = approvers_refuse(spec, gate.node, decision.by, decision.roles)
    if refused is not None:
        raise NotAnApprover(refused)
    data = _checked_data(spec, gate, decision)
    if decision.kind == "approve":
        return _records(spec, view, gate, "approved", decision.by, decision.comment, data=data,
                        via=decision.via, staged=timed_out)
    if decision.kind == "reject":
        return _records(spec, view, gate, "rejected", decision.by, decision.comment, data=data,
                        via=decision.via, staged=timed_out)
    if gate.kind == "tool":
        return _records(spec, view, gate, "modified", decision.by, decision.comment,
                        patch=_checked_edit(gate, decision), via=decision.via)
    assert ns.approval is not None
    allowed = list(ns.approval.on_modify)
    target = decision.at or allowed[0]
    if target not in allowed:
        raise UsageError(f"re-entry at {target!r} is refused: {gate.node!r} allows modify to "
                         f"re-enter at {', '.join(allowed)} (approval.on_modify)")
    check_patch(spec, view, decision.patch)
    return _records(spec, view, gate, "modified", decision.by, decision.comment,
                    patch=L.to_json_value(decision.patch), reenter=target, via=decision.via)


def _too_late(spec: WorkflowSpec, gate: Gate) -> UsageError:
    """The refusal of a decision on ``gate``, whose deadline has passed undecided."""
    ns = spec.nodes[gate.node]
    then = ns.approval.on_timeout if ns.approval is not None else "reject"
    outcome = "rejects it" if then == "reject" or gate.kind == "confirm" \
        else f"re-enters the run at {then!r}"
    deadline = _now_iso(gate.deadline) if gate.deadline is not None else "its deadline"
    return UsageError(f"the decision is refused: {gate.node!r} passed its deadline "
                      f"({deadline}) undecided, and its on_timeout {outcome}; resume the "
                      "run without a decision to apply that")

class GateNotWaiting(UsageError):
    """A decision on a gate that does not wait (decided already, closed, or no gate of
    the run's), or on a mapped gate's bare name while several of its items wait (which
    one was meant?): refused as a double decision is (exit 2; a server answers 409)."""


class NoSuchGate(GateNotWaiting):
    """A decision naming a gate the run's workflow cannot have: no node of that name, or
    a node that is no gate -- a mistake in the request, whatever the run's state (exit 2;
    a server answers 422)."""


def requested(node: str, ns: NodeSpec, visit: int, state: Mapping[str, Any], *,
              item: int | None = None, value: Any = None, as_name: str = "item") -> R.Item:
    """``approval.requested`` for visit ``visit`` of an approval node or a node declared
    ``confirm: true`` (``node``, defined by ``ns``), showing what ``state`` holds now
    (``item``: for item ``item`` of a mapped approval, whose ``value`` it shows as
    ``as_name``; its decisions are approve and reject)."""
    if ns.approval is not None:
        kind = "approval"
        show = {f: state.get(f) for f in ns.approval.show}
        decisions = ["approve", "reject"] + (
            ["modify"] if ns.approval.on_modify and item is None else [])
        timeout = ns.approval.timeout
    else:
        kind = "confirm"
        reads = ns.reads or []
        show = {f: state.get(f) for f in reads}
        decisions = ["approve", "reject"]
        timeout = None
    if item is not None:
        show[as_name] = value
    deadline = round(time.time() + timeout, 6) if timeout else None
    fields = {"node": node, "visit": visit, "kind": kind, "show": L.to_json_value(show),
              "decisions": decisions, "approvers": approvers(ns), "deadline": deadline}
    if item is not None:
        fields["item"] = item
    if ns.approval is not None and ns.approval.input is not None:
        fields["input"] = ns.approval.input  # what a decision's data must satisfy
    return (L.APPROVAL_REQUESTED, fields)


def approvers(ns: NodeSpec) -> list[str] | None:
    """Who may decide at ``ns``'s gate (its ``approvers:``; None: anyone)."""
    return list(ns.approval.approvers) if ns.approval is not None and ns.approval.approvers \
        else None


class NotAnApprover(UsageError):
    """A decision refused by the gate's ``approvers:`` (a server answers 403)."""


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


_DATA_HINT = "--data JSON on the command line, approve(data=...) or reject(data=...) in Python"


def _checked_data(spec: WorkflowSpec, gate: Gate, decision: Decision) -> Any:
    """The decision's ``data``, checked against the gate's ``input:`` schema (JSON data;
    None when the gate declares none). Raises UsageError -- nothing is recorded."""
    if gate.kind == "unknown_outcome":
        return _checked_outcome(spec, gate, decision)
    schema = gate.input if gate.kind == "approval" else None
    if decision.data is None:
        if schema is not None and decision.kind == "approve":
            raise UsageError(f"the decision is refused: gate {gate.node!r} asks for input with "
                             f"its approval: pass data that satisfies its input schema "
                             f"{_schema_text(schema)} ({_DATA_HINT})")
        return None
    if decision.kind == "modify":
        raise UsageError("the decision is refused: --data goes with --approve or --reject, "
                         "not --modify (a modify's patch is its own data)")
    if gate.kind == "tool":
        raise UsageError(f"the decision is refused: {gate.node!r} waits for a confirmation "
                         "(a guarded tool call), which takes no --data; approve it, reject it "
                         "(--comment tells the model why), or edit its arguments with "
                         "--modify '{\"arguments\": {...}}'")
    if schema is None:
        where = ("its approval declares no input: schema" if gate.kind == "approval"
                 else "a confirm: true node is approved or rejected, without data")
        raise UsageError(f"the decision is refused: gate {gate.node!r} takes no --data "
                         f"({where}); decide without --data, or declare approval.input (a "
                         "JSON Schema) in the workflow for the runs that start after it")
    check_data(decision.data, "the decision's data")  # its depth, before it is converted
    try:
        value = L.to_json_value(decision.data)
    except TypeError as exc:
        raise UsageError(f"the decision is refused: its data is not JSON data: {exc}") from None
    check_data(None, "the decision's data", len(L.dumps(value)))
    problems = schema_problems(schema, value)
    if problems:
        raise UsageError(f"the decision is refused: its data does not satisfy the input "
                         f"schema of gate {gate.node!r}: {problems}; send data that does "
                         f"({_DATA_HINT}), the schema being {_schema_text(schema)}")
    return value


def _checked_outcome(spec: WorkflowSpec, gate: Gate, decision: Decision) -> Any:
    """An ``unknown_outcome`` gate's data: ``{"result": {...}}``, the outcome a person
    checked by hand (a node's update mapping), with an approve; None without."""
    if decision.data is None:
        return None
    if decision.kind != "approve":
        raise UsageError(f"the decision is refused: --data goes with --approve on "
                         f"{gate.node!r}'s unknown outcome (the outcome checked by hand); "
                         "--reject records the action as not done, without data")
    data = decision.data
    tool = gate.key is not None  # a guarded tool's: its return value, any JSON
    if not isinstance(data, dict) or set(data) != {"result"} \
            or not (tool or isinstance(data["result"], dict)):
        what = ("the tool's return value" if tool else
                "its update (a JSON object of state fields, {} for none)")
        raise UsageError(f"the decision is refused: the outcome of {gate.node!r} checked by "
                         f"hand is --data '{{\"result\": ...}}', {what}")
    check_data(data, "the decision's data")
    try:
        value = L.to_json_value(data)
    except TypeError as exc:
        raise UsageError(f"the decision is refused: its data is not JSON data: {exc}") from None
    check_data(None, "the decision's data", len(L.dumps(value)))
    if not tool:  # a node's update: its writes: and reducers, as its body's would be
        ns = spec.nodes[gate.node]
        check_outcome(gate.node, value["result"], None if ns.writes is None
                      else frozenset(ns.writes), {k: f.reducer for k, f in spec.state.items()})
    return value


def unknown_outcome(plan_view: RunView, gate: Gate, started: L.Record) -> Items:
    """The gate a ``confirm: true`` node's visit stops at when the run resumes and its
    body had started (``started``: that attempt's ``node.started``) without an outcome
    in the log: it is not run again unasked."""
    ns = plan_view.plan.nodes[gate.node].spec
    reads = ns.reads or []
    show = {"action": gate.node, "arguments": {f: plan_view.state.get(f) for f in reads},
            "started_at": started.get("at"), "attempt": started.get("attempt")}
    return [(L.APPROVAL_REQUESTED, {
        "node": gate.node, "visit": gate.visit, "kind": "unknown_outcome",
        "show": L.to_json_value(show), "decisions": ["approve", "reject"],
        "approvers": list(ns.approval.approvers) if ns.approval is not None
        and ns.approval.approvers else None, "deadline": None})]


def _checked_edit(gate: Gate, decision: Decision) -> dict[str, Any]:
    """A guarded tool call's edit (``{"arguments": {...}}``), checked against the
    schema the node asked with. Raises UsageError -- nothing is recorded."""
    if decision.at is not None:
        raise UsageError(f"the decision is refused: --at names where an approval re-enters "
                         f"the graph; {gate.node!r} waits for a confirmation (a guarded tool "
                         "call), whose modify edits only the call: drop --at")
    check_data(decision.patch, "the edit")
    try:
        patch: dict[str, Any] = L.to_json_value(decision.patch)
    except TypeError as exc:
        raise UsageError(f"the edit is refused: it is not JSON data: {exc}") from None
    check_data(None, "the edit", len(L.dumps(patch)))
    schema = gate.input or {}
    problems = schema_problems(schema, patch)
    if problems:
        tool = gate.show.get("tool")
        props = schema.get("properties")
        params = props.get("arguments") if isinstance(props, dict) else None
        if isinstance(tool, str) and params is not None:  # an agent's guarded tool call
            raise UsageError(f"the edit is refused: the call to {tool!r} does not take it: "
                             f"{problems}; send --modify '{{\"arguments\": {{...}}}}' "
                             "(modify({\"arguments\": ...}) in Python) with arguments that "
                             f"fit the tool's parameters {_schema_text(params)}")
        raise UsageError(f"the edit is refused: it does not satisfy the schema of "
                         f"{gate.node!r}'s confirmation {gate.key!r}: {problems}; send "
                         f"--modify PATCH_JSON (modify(patch) in Python) that satisfies "
                         f"{_schema_text(schema)}")
    return patch


def schema_problems(schema: dict[str, Any], value: Any) -> str:
    """Why ``value`` does not satisfy the JSON Schema ``schema`` ('' when it does)."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(value),
                    key=lambda e: list(map(str, e.path)))
    return "; ".join(f"at {e.json_path}: {e.message}" for e in errors[:5])


def _schema_text(schema: Any, limit: int = 400) -> str:
    text = L.dumps(schema).decode() if isinstance(schema, dict) else repr(schema)
    return text if len(text) <= limit else text[:limit] + "..."


def _pick(pending: list[Gate], node: str | None, via: str | None) -> Gate:
    if node is None:
        return oldest(pending)
    vague = ambiguous(node, pending, via)  # a mapped gate's name, several items waiting
    if vague is not None:
        raise GateNotWaiting(vague)
    for gate in pending:
        if gate.node == node or gate_name(gate) == node:
            return gate
    names = ", ".join(gate_name(g) for g in pending)
    raise GateNotWaiting(f"the decision is refused: no gate waits at {node!r} (it was decided "
                     f"already, or is not a gate of this run); waiting: {names}")


# -- several gates at once ----------------------------------------------------


def offer_of(gate: Gate, decision: Decision) -> dict[str, Any]:
    """What `Store.offer_decision` keeps of ``decision`` on ``gate`` (JSON data)."""
    return {"node": gate.node, "visit": gate.visit, "item": gate.item, "key": gate.key,
            "requested_at": gate.requested_at,
            "decision": decision.kind,
            "by": decision.by, "comment": decision.comment,
            "patch": L.to_json_value(decision.patch) if decision.patch else None,
            "at": decision.at, "data": L.to_json_value(decision.data),
            "roles": list(decision.roles), "via": decision.via,
            "offered_at": time.time()}


def offered(spec: WorkflowSpec, view: RunView, offers: dict[str, dict[str, Any]],
            *, expired: Items | None = None) -> Items:
    """The records of the decisions offered for gates still waiting in ``view`` (each
    checked again against the gate as it is now; one that no longer fits is dropped,
    logged): what an executor folds in, in the order they were offered. A rejection that
    ends the run ends the list."""
    items: Items = []
    done = {gate_key(f["node"], f["visit"], f.get("item"))
            for t, f in expired or () if t == L.APPROVAL_DECIDED}
    for _, d in sorted(offers.items(), key=lambda kv: kv[1].get("offered_at") or 0):
        item = d.get("item")
        key = gate_key(str(d.get("node")), int(d.get("visit") or 0),
                       item if isinstance(item, int) else None)
        gate = view.gates.get(key)
        if gate is None or gate.decision is not None or key in done \
                or d.get("key") != gate.key or d.get("requested_at") != gate.requested_at:
            continue
        decision = Decision(d["decision"], d.get("by"), d.get("comment"),
                            dict(d.get("patch") or {}), d.get("at"), gate_name(gate),
                            d.get("data"), tuple(d.get("roles") or ()), d.get("via"))
        try:
            # (its node: that gate) -- decided after those before it in this batch: the
            # view does not hold their records yet, so a rejection must not close them
            recs = decide(spec, view, decision, expired=[*(expired or ()), *items])
        except UsageError as exc:
            log.warning("a decision offered on gate %r (by %s) no longer fits it and is "
                        "dropped: %s", gate_name(gate), decision.by, exc)
            continue
        done.add(key)
        items += recs
        if any(t == L.RUN_REJECTED for t, _ in recs):
            break
    return items


def close_others(view: RunView, gate: Gate | None, why: str, by: str | None = None,
                 staged: Iterable[tuple[str, int]] = ()) -> Items:
    """``approval.decided`` ``closed`` for every gate still waiting but ``gate``: the run
    ends (rejected) and they are not needed. ``by``: who rejected it (the closing is
    theirs); ``staged``: the slots of gates decided by records staged before these (not
    in the view yet), which are not closed again."""
    skip = set(staged)
    return [(L.APPROVAL_DECIDED, {"node": g.node, "visit": g.visit, "kind": g.kind,
                                  "decision": "closed", "by": by, "comment": why,
                                  "key": g.key, **({"item": g.item} if g.item is not None
                                                   else {})})
            for g in view.pending_gates() if g is not gate and g.slot not in skip]


def known_fields(spec: WorkflowSpec, state: Iterable[str]) -> set[str]:
    """The fields a patch may set: the workflow's declared ones and the run's ``state``."""
    return spec.known_fields() | set(state)


def check_patch(spec: WorkflowSpec, view: RunView, patch: dict[str, Any]) -> None:
    known = known_fields(spec, view.state)
    unknown = sorted(k for k in patch if k not in known)
    if unknown:
        example = unknown[0]
        raise UsageError(f"the patch names field(s) the workflow does not know: "
                         f"{', '.join(unknown)}; known fields: {', '.join(sorted(known))}. "
                         "A patch may set a field the workflow declares: to add one, "
                         f"declare it in the workflow file (state: {{{example}: {{}}}}, or "
                         f"in input: or a node's writes:) and start a new run -- a run "
                         "keeps the definition it started with")
    check_data(patch, "the patch")  # its depth, before it is converted
    try:
        plain = L.to_json_value(patch)
    except TypeError as exc:  # e.g. an integer beyond 64 bits
        raise UsageError(f"the patch is refused: it is not JSON data the log can hold: "
                         f"{exc}") from None
    check_data(None, "the patch", len(L.dumps(plain)))
    # a patch replaces whole fields, bypassing reducers: a reducer field gets its kind
    check_whole_values(plain, {k: v.reducer for k, v in spec.state.items()},
                       "the patch")


# a reducer field's whole value, as a JSON Schema type (`check_whole_values`'s rule)
_WHOLE_TYPES = {"append": "array", "extend": "array", "merge": "object", "add": "number"}


def patch_schema(spec: WorkflowSpec, state: Iterable[str] = ()) -> dict[str, Any]:
    """A JSON Schema of the patches `check_patch` accepts for a run of ``spec`` whose
    state has the fields ``state``: an object of one or more known fields, a reducer
    field's value of its kind (or null). What a client (the dashboard) checks a modify
    against before it sends it; the decision is checked again when it arrives."""
    props: dict[str, Any] = {}
    for name in sorted(known_fields(spec, state)):
        field_spec = spec.state.get(name)
        kind = _WHOLE_TYPES.get(field_spec.reducer) if field_spec is not None else None
        props[name] = {"type": [kind, "null"]} if kind else {}
    return {"type": "object", "minProperties": 1, "additionalProperties": False,
            "properties": props}


def _records(spec: WorkflowSpec, view: RunView, gate: Gate, decision: str, by: str | None,
             comment: str | None, *, patch: dict[str, Any] | None = None,
             reenter: str | None = None, timed_out: bool = False,
             data: Any = None, via: str | None = None,
             staged: Iterable[tuple[str, int]] = ()) -> Items:
    base = {"node": gate.node, "visit": gate.visit, "kind": gate.kind, "decision": decision,
            "by": by, "comment": comment, "patch": patch, "reenter": reenter,
            "timed_out": timed_out or None, "key": gate.key}
    optional = {"data": data, "via": via, "item": gate.item}
    base.update({k: v for k, v in optional.items() if v is not None})
    items: Items = [(L.APPROVAL_DECIDED, base)]
    if gate.item is not None:  # a mapped node's item: `_item_gates`
        return items + item_decided(gate, decision, by, comment, data)
    if gate.kind == "workflow":
        # the node runs again and continues its child (`_runs.resume` has decided the
        # child's gate in the child)
        return items
    if gate.kind == "tool" or (gate.kind == "unknown_outcome" and gate.key is not None):
        # the node runs again: ctx.confirm gives it the decision, ctx.decision the rest
        items.append(_journaled(view, gate, decision, by, comment, patch, data))
        return items
    if gate.kind == "unknown_outcome":
        # approved: the body runs again; with data: the outcome checked by hand is its
        # completion; rejected: the visit fails (`UnknownOutcome`) when the run goes on
        if decision == "approved" and data is not None:
            items.append(R.gate_completed(gate.node, gate.visit, dict(data["result"]), None))
        return items
    if gate.kind == "confirm":
        if decision != "approved":
            msg = f"{gate.node!r} needed confirmation and was {decision} by {by}"
            items += close_others(view, gate, f"not needed: the run was rejected at "
                                  f"{gate.node!r}", by, staged)
            items.append(R.run_rejected(gate.node, msg + (f": {comment}" if comment else "")))
        return items
    record: dict[str, Any] = {"decision": decision, "by": by, "comment": comment,
                              "at": _now_iso()}
    if gate.input is not None:  # a gate that asks for input always has its data field
        record["data"] = data
    if patch is not None:
        record["patch"] = patch
        items.append((L.STATE_PATCHED, {"node": gate.node, "patch": patch}))
    if reenter is not None:
        record["reenter"] = reenter
    items.append(R.gate_completed(gate.node, gate.visit, {gate.node: record}, reenter))
    if decision in ("rejected", "timed_out") and reenter is None \
            and (not any(gate.node in e.source for e in spec.edges)
                 or _rejection_ends_now(view, gate)):
        # a rejected gate with no edge of its own to follow: the run ends REJECTED, as
        # when its edges follow none (the decider says so for a gate that has edges)
        items += close_others(view, gate, f"not needed: the run was rejected at "
                              f"{gate.node!r}", by, staged)
        items.append(R.run_rejected(gate.node, f"approval {gate.node!r} was {decision} by "
                                    f"{by or 'an anonymous decider'}"
                                    + (f": {comment}" if comment else "")))
    return items


def _journaled(view: RunView, gate: Gate, decision: str, by: str | None, comment: str | None,
               patch: dict[str, Any] | None, data: Any) -> R.Item:  # `Context.decision`
    assert gate.key is not None
    visit = view.running.get((gate.node, gate.visit))
    said: dict[str, Any] = {"decision": decision, "by": by, "comment": comment, "patch": patch}
    if data is not None:  # an unknown outcome checked by hand
        said["data"] = data
    attempt = visit.attempt if visit is not None else 1
    return R.decision_journaled(gate.node, gate.visit, attempt, gate.key, said)


def _rejection_ends_now(view: RunView, gate: Gate) -> bool:
    """Whether rejecting ``gate`` ends the run at once: none of its edges (its
    joins included) reads ``<gate>.decision`` -- so none is followed -- while other gates
    wait or other visits run (alone, the edges' decision says so, as it always has)."""
    pn = view.plan.nodes[gate.node]
    path = f"{gate.node}.decision"
    for e in pn.out:
        if any(path in x.paths for x in (e.cond, e.switch) if x is not None):
            return False
    others = [g for g in view.pending_gates() if g is not gate]
    running = [k for k in view.running if k != (gate.node, gate.visit)]
    return bool(others or running)
