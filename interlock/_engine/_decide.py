"""Edge decisions: where the run goes from a completed node, or from a settled join.

`Decider.due` decides everything the view has due, staging ``edge.taken`` /
``edge.skipped`` records through the sink (the fold then makes successors ready, and
settles joins downstream, which makes them due in turn). A decision that leaves a node
with nowhere to go fails the run (`Abort` with a `NoRouteError` that explains every
edge); a rejected approval whose edges do not read its decision ends it (`Rejected`).
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import _log as L
from .._definition._edge import MAP_MAX_ITEMS, case_key
from .._definition._expr import EvaluationError
from .._definition._model import END, ERROR_FIELD
from .._definition._plan import Plan, PlanEdge, PlanNode
from .._errors import (
    BudgetExceededError,
    ExpressionError,
    NodeError,
    NoRouteError,
    RouteError,
    RunError,
)
from .._json import JSON, JSONObject
from . import _records as R
from ._flow import Due
from ._fold import RunView, Scope
from ._origin import unlocated


class Abort(Exception):
    """Raised inside the loop to end the run with ``error``."""

    def __init__(self, error: RunError) -> None:
        self.error = error


class Rejected(Exception):
    """Raised inside the loop when a human rejection ends the run (status REJECTED)."""

    def __init__(self, node: str, message: str, by: str | None = None) -> None:
        self.node = node
        self.message = message
        self.by = by  # who rejected it: the other gates it closes are closed by them

    @classmethod
    def ending(cls, items: list[R.Item]) -> Rejected:
        """The rejection ``items`` (decisions folded in, with a ``run.rejected``) end
        the run with, once the visits still running are stopped."""
        end = next(f for t, f in items if t == L.RUN_REJECTED)
        by = next((f.get("by") for t, f in items if t == L.APPROVAL_DECIDED
                   and f.get("node") == end["node"]), None)
        return cls(end["node"], end["error"]["message"], by if isinstance(by, str) else None)


def _implied_sources(plan: Plan, view: RunView) -> frozenset[str]:
    """Log format 2: the nodes whose ``otherwise`` edges the fold decides from their one
    ``when`` edge's record (`Plan.implied_otherwise`): the decider decides and writes
    that edge only. Its ``otherwise`` edges are taken when it was not, so the group
    always takes something (nothing to strand), and no gate is among these nodes (no
    rejection to follow)."""
    if view.format < 2:
        return frozenset()
    return frozenset(plan.edges[i].sources[0] for i in plan.implied_otherwise)


class _Raised(NamedTuple):
    """A router's exception, kept until its edge is decided."""

    exc: Exception


class Decider:
    """Decides the edges due in a run's view, staging their records in ``sink``."""

    fast = True  # `Plan.always_taken` nodes' edges skip the decision (tests turn it off)

    def __init__(self, plan: Plan, view: RunView, sink: R.Sink) -> None:
        self.plan = plan
        self.view = view
        self.sink = sink
        self.fast = self.fast  # (the class's, read faster from the instance)
        self._scope = Scope(view)  # what conditions see (state, config, run), looked up lazily
        # the answers of async routers, awaited by the loop before their edge is decided
        self._routed: dict[tuple[int, str], object] = {}
        self._implied = _implied_sources(plan, view)
        # `Plan.always_taken` nodes' edges skip the decision (unless ``fast`` is off)
        self._always_taken = plan.always_taken if self.fast else frozenset()

    def due(self) -> Due | None:
        """Decide everything due, staging the edge records, until nothing is due.

        A completed node's edges are decided together (``otherwise`` needs its
        siblings); a settled join is decided on its own. Deciding may settle joins
        downstream, which makes them due in turn. Stops at a group with an ``async def``
        router whose answer is not in yet, and returns its due: the loop awaits the router
        (`call_async_router`) and decides on.
        """
        # How this loop ends: every record ``put`` stages is folded at once, and the fold
        # pops the due it decides (`RunView._on_edge`). So each turn removes at least the
        # group it decided, and may add dues at the end of ``view.due`` (a join settled
        # downstream, a dead path that reaches one): the dict is a FIFO, and decisions
        # are made -- and logged -- in the order they became due, which a replay repeats.
        # (When ``due`` empties, the fold's quiescence may settle partial joins and make
        # more due: the ``while`` sees those too.)
        due = self.view.due
        always_taken = self._always_taken
        put = self.sink.put
        while due:
            first = next(iter(due.values()))
            source = first.source
            # a node's edges are one group (``otherwise`` depends on its siblings); a
            # join's decision is alone: its due is keyed by the join edge, not a node
            if source == "*" or len(due) == 1:
                group = [first]
            else:
                group = [d for d in due.values() if d.source == source]
            if source in always_taken:  # what `_decide_group` would find, without the work
                for d in group:  # R.edge_taken(...), inlined (see `_records`: the hot path)
                    put(L.EDGE_TAKEN, {"edge": d.edge.index, "from": source,
                                       "to": list(d.edge.targets)})
                continue
            if self.plan.async_routers:
                # the whole group waits for the router's answer: its siblings must not be
                # decided (and logged) first, or ``otherwise`` would be decided without it
                for d in group:
                    if d.edge.router_async and (d.edge.index, d.source) not in self._routed:
                        return d
            if source in self._implied:  # only its ``when`` edge (see `_implied_sources`)
                for d in group:
                    if not d.edge.otherwise:
                        rtype, fields = self._decide_edge(d.edge, d, self._scope)
                        put(rtype, fields)
                continue
            for rtype, fields in self._decide_group(source, group):
                put(rtype, fields)
        return None

    def when(self, node: str) -> R.Item | None:
        """Log format 3: the decision of an implied-otherwise ``node``'s one ``when``
        edge, due since its completion was folded, for its ``node.visited`` to carry
        (`_staging.Staging.visited`): the record `due` would stage for it (not staged
        here). None when that decision is not due (a goto). Raises `Abort` as `due` does
        (a condition that cannot be evaluated)."""
        e = self.plan.implied_when[node][0]  # (a plain ``when``: no router, no gate)
        d = self.view.due.get((e.index, node))
        if d is None or d.goto is not None:
            return None
        return self._decide_edge(e, d, self._scope)

    def _decide_group(self, source: str, dues: list[Due]) -> list[R.Item]:
        """Decide the edges of one completed node (or one settled join), in declaration order:
        ``when`` edges and the rest first, then ``otherwise`` edges."""
        # What must hold:
        # - nothing is staged until the whole group is decided: a group that strands a
        #   node raises `Abort` with no record of it, so a resume (after ``--set``, say)
        #   decides the group again instead of replaying a dead end;
        # - ``otherwise`` edges come last (``when_taken`` must be final when they are
        #   decided); among the others, declaration order, which is the log's order;
        # - ``otherwise`` is taken when no ``when`` edge of the group was taken: a sibling
        #   without ``when`` does not count (it is not an alternative, it is a fork);
        # - after a rejected (or timed-out) approval, only edges that read
        #   ``<gate>.decision`` are followed; if none is taken, the group is logged as
        #   skipped and the run ends REJECTED (`_rejection`).
        scope = self._scope  # the names conditions read, looked up when read
        items: list[R.Item] = []
        taken_any = False
        when_taken = False
        rejected = source in self.plan.approvals and _rejected_gate(self.plan, self.view, source)
        gate = source
        if source == "*" and dues:  # a settled join: a rejected gate among its arrivals
            # (a rejection is followed only by edges that read its decision)
            for arrived in dues[0].arrived:
                if arrived in self.plan.approvals \
                        and _rejected_gate(self.plan, self.view, arrived) \
                        and not _reads_decision(dues[0].edge, arrived):
                    rejected, gate = True, arrived
                    break
        if len(dues) > 1 and source not in self.plan.in_decision_order:
            dues = sorted(dues, key=_decision_order)  # (most nodes are: no sort)
        for due in dues:
            e = due.edge
            if rejected and not _reads_decision(e, gate):
                # after a rejection only edges that read <gate>.decision are followed
                item = R.edge_decided(e.index, due.source, [], reason="rejected")
            elif e.otherwise:
                item = R.edge_decided(e.index, due.source,
                                      [] if when_taken else list(e.targets), "otherwise",
                                      not when_taken)
            elif e.catches is not None:
                item = self._decide_error_edge(e, due)
            else:
                item = self._decide_edge(e, due, scope)
            taken = item[0] == L.EDGE_TAKEN
            if taken and e.cond is not None:
                when_taken = True
            taken_any = taken_any or taken
            items.append(item)
        if rejected and not taken_any:
            self.sink.stage(items)  # the skipped edges are the rejection's trace
            raise _rejection(self.view, gate)
        # a group that takes something strands nobody; one that takes nothing may leave
        # its node (or a join's sources) with no route left -- see `_stranded`
        stranded = [] if taken_any else self._stranded(source, dues)
        if stranded:
            raise Abort(_no_route(source, stranded, dues, items))
        return items

    def _stranded(self, source: str, dues: list[Due]) -> list[str]:
        """Nodes this decision leaves with nowhere to go (no silent dead ends).

        A node's routes are its own edges, decided when it completes, and the joins it
        arrives at, decided when they settle. The last of these to be decided without
        any taken strands it. Checked before the decision is recorded, so a resume
        decides again (after a --set, say) rather than following a dead end.
        """
        # ``routed`` and ``route_wait`` are the fold's, as of the records applied so far:
        # this group's records are not applied yet (see `_decide_group`), so "the last
        # route" is the one being decided now. A node is stranded when none of its joins
        # is still undecided (``route_wait``) and nothing took it anywhere before
        # (``routed``: a join it arrived at that was taken). A settled join strands each
        # source for which it was the last undecided route and that has no decision of
        # its own still due.
        view = self.view
        if not dues:
            return []
        if source != "*":
            if source == "START" or (view.route_wait[source] <= 0
                                     and not view.routed.get(source, False)):
                return [source]
            return []
        return [s for s in dues[0].arrived
                if view.route_wait[s] == 1 and not view.routed.get(s, False)
                and not any(k[1] == s for k in view.due)]

    def _decide_edge(self, e: PlanEdge, due: Due, scope: Scope) -> R.Item:
        targets: list[str]
        expr: str | None = None
        value: Any = None
        reads: JSONObject | None = None
        reason = None
        state = self.view.state
        if due.goto is not None and e.kind != "choose":
            # the node chose its successor (interlock.goto, its own or a tool's): that is
            # its whole routing -- its other edges are not decided, and not taken
            return R.edge_decided(e.index, due.source, [], None, None, None,
                                  f"the node chose {due.goto!r} (goto)", due.arrived)
        if e.kind == "plain":
            targets = list(e.targets)
            cond = e.cond
            if cond is not None:
                expr = cond.source
                value, reads = _condition(self.plan, state, e, scope)
                if not value:
                    targets = []
        elif e.kind == "switch":
            assert e.switch is not None and e.spec.cases is not None
            expr = e.switch.source
            try:
                value, reads = e.switch.decide(state if e.switch.state_only else scope)
            except EvaluationError as exc:
                raise Abort(_cannot_evaluate(self.plan, e, expr, exc)) from None
            chosen = e.spec.cases.get(case_key(value), e.spec.default)
            targets = [chosen] if chosen is not None else []
        elif e.kind == "router":
            expr = e.spec.router
            value = self._route(e, due)
            targets = value
        elif e.kind == "map":
            assert e.mapping is not None
            expr = e.mapping.source
            try:
                value, reads = e.mapping.decide(state if e.mapping.state_only else scope)
            except EvaluationError as exc:
                raise Abort(_cannot_evaluate(self.plan, e, expr, exc)) from None
            value = _map_items(self.plan, e, value)
            targets = list(e.targets)
        else:  # choose
            expr = "goto"
            value = due.goto
            targets = [due.goto] if due.goto is not None else []
        # ``max`` counts the takes in the log (a resume counts the same); skipped, with why
        if targets and e.max is not None and self.view.takes.get(e.index, 0) >= e.max:
            reason = f"max {e.max} reached"
            targets = []
        # the value as JSON: what a replay reads back is what the decision saw
        if e.kind != "plain" and value is not None and type(value) not in _PLAIN_VALUES:
            value = L.to_json_value(value)  # what the log will give back
        # (positional: one per decided edge)
        return R.edge_decided(e.index, due.source, targets, expr, value, reads, reason,
                              due.arrived)

    # -- error edges -----------------------------------------------------------

    def catch(self, pn: PlanNode, error: RunError) -> PlanEdge | None:
        """The error edge of ``pn`` that catches ``error`` (its visit failed after its
        retries): the first, in declaration order, whose class names match the error's
        class hierarchy and whose ``max`` is not used up. None when no edge does, or the
        error is not the node's own (an engine limit is never caught: `catchable`)."""
        if not catchable(error):
            return None
        names = error_classes(error)
        takes = self.view.takes
        for e in pn.errors:
            assert e.catches is not None
            if e.catches and not any(n in e.catches for n in names):
                continue
            if e.max is not None and takes.get(e.index, 0) >= e.max:
                continue
            return e
        return None

    def uncaught(self, pn: PlanNode, error: RunError) -> str:
        """Why none of ``pn``'s error edges caught ``error`` (`catch` found none): for the
        run's error, so that a reader knows the edges were considered."""
        if not catchable(error):
            what = {"budget_exceeded": "the run's token budget (limits.tokens)",
                    "invalid_route": "a route to an undeclared target"}.get(
                        error.type, f"a {error.type}")
            return (f"not caught: {what} is the engine's rule, not the node's failure, and "
                    "error edges never catch those")
        names = error_classes(error)
        spent = [e for e in pn.errors if e.max is not None
                 and self.view.takes.get(e.index, 0) >= e.max
                 and (not e.catches or any(n in (e.catches or ()) for n in names))]
        if spent:
            return (f"not caught: its error edge {spent[0].name()} was taken "
                    f"{spent[0].max} time{'s' if spent[0].max != 1 else ''}, its max")
        listed = sorted({n for e in pn.errors for n in e.catches or ()})
        return (f"not caught: its error edges catch {', '.join(listed)}, and "
                f"{names[0]} is none of those nor a subclass of one")

    def _decide_error_edge(self, e: PlanEdge, due: Due) -> R.Item:
        """The caught error's edge, due because `catch` chose it: taken (the record says
        which error it caught, as a condition's record says what it read)."""
        error = self.view.state.get(ERROR_FIELD)
        if not isinstance(error, dict):  # (the fold wrote it when the error was caught)
            error = {}
        return R.edge_decided(e.index, due.source, list(e.targets), "on_error",
                              error.get("type"), {ERROR_FIELD: error})

    async def call_async_router(self, due: Due) -> None:
        """Await an ``async def`` router; `_route` takes its answer (or its exception)."""
        e = due.edge
        assert e.router is not None
        answer: object
        try:
            answer = await e.router(dict(self.view.state))
        except Exception as exc:
            answer = _Raised(exc)
        self._routed[(e.index, due.source)] = answer

    def _route(self, e: PlanEdge, due: Due) -> list[str]:
        # A router is user code: it runs here, once, when its edge is decided, and its
        # answer becomes the record (``to``, ``value``); a replay reads the record and
        # never calls it again. Its exception is kept as a value (`_Raised`) and turned
        # into the run's `RouteError` by `_targets`, so it cannot escape mid-group.
        assert e.router is not None
        result: object
        if e.router_async:
            result = self._routed.pop((e.index, due.source))
        else:
            try:
                result = e.router(dict(self.view.state))
            except Exception as exc:
                result = _Raised(exc)
        return _targets(e, result)


def _rejection(view: RunView, source: str) -> Rejected:
    """How the rejection at gate ``source`` ends the run (`Decider._decide_group`)."""
    gate = view.state.get(source)
    if not isinstance(gate, dict):  # (a gate's field is its record: a dict)
        gate = {}
    by = gate.get("by")
    return Rejected(source, f"approval {source!r} was rejected by "
                    f"{by or 'an anonymous decider'}"
                    + (f": {gate['comment']}" if gate.get("comment") else ""),
                    by if isinstance(by, str) else None)


def _rejected_gate(plan: Plan, view: RunView, source: str) -> bool:
    """Whether ``source`` is a gate whose decision was a rejection (or timed out)."""
    pn = plan.nodes.get(source)
    if pn is None or not pn.gate or pn.spec.approval is None:
        return False
    record = view.state.get(source)
    return isinstance(record, dict) and record.get("decision") in ("rejected", "timed_out") \
        and record.get("reenter") is None


def catchable(error: RunError) -> bool:
    """Whether an error edge may catch ``error``: the node's own failures (its body
    raised, timed out, returned what it may not, crossed its own ``tokens:``), not the
    engine's limits (the run's budget, a goto to an undeclared target; write conflicts,
    steps and no route never reach here)."""
    if isinstance(error, BudgetExceededError):
        return error.details.get("scope") == "node"
    return isinstance(error, NodeError)


def error_classes(error: RunError) -> list[str]:
    """The class names an ``on_error`` list is matched against: the body's exception's
    MRO (a timeout is a ``TimeoutError``), or the engine error's own class's."""
    names = error.details.get("mro")
    if names:
        return list(names)
    exc = error.details.get("exception")
    cls = getattr(builtins, exc, None) if isinstance(exc, str) else None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return [c.__name__ for c in cls.__mro__]
    return [c.__name__ for c in type(error).__mro__]


def caught_error(pn: PlanNode, error: RunError, attempt: int) -> JSONObject:
    """The reserved ``error`` field an error edge's target sees: ``{node, type,
    message, attempt}`` -- the exception's class name and its own message."""
    exc = error.details.get("exception")
    etype = exc if isinstance(exc, str) else error_classes(error)[0]
    message = error.message
    prefix = f"node {pn.name!r} raised {etype}: "
    if message.startswith(prefix):
        message = unlocated(message[len(prefix):], error.details.get("at"))
    return {"node": pn.name, "type": etype, "message": message, "attempt": attempt}


def _targets(e: PlanEdge, result: object) -> list[str]:
    """The targets a router's answer names (or the run fails with a `RouteError`)."""
    if isinstance(result, _Raised):
        raised = result.exc
        raise Abort(RouteError(f"router {e.spec.router} of edge {e.name()} raised "
                               f"{type(raised).__name__}: {raised}", node=_edge_node(e),
                               edge=e.index))
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise Abort(RouteError(
            f"router {e.spec.router} of edge {e.name()} returned an awaitable, not its "
            "targets: make it an `async def` function (interlock awaits those) or a "
            "plain function that returns the targets", node=_edge_node(e), edge=e.index))
    if not isinstance(result, str | list | tuple | set | frozenset) and result is not None:
        raise Abort(RouteError(
            f"router {e.spec.router} returned {result!r} "
            f"({type(result).__name__}); edge {e.name()} declares to: "
            f"[{', '.join(e.targets)}] -- return one of those names (or END), or a list "
            "of them", node=_edge_node(e), edge=e.index))
    chosen = [result] if isinstance(result, str) else list(result or [])
    # a router returns declared targets, or END (declared or not)
    bad = [c for c in chosen if c not in e.targets and c != END]
    if bad or any(not isinstance(c, str) for c in chosen):
        raise Abort(RouteError(
            f"router {e.spec.router} returned {result!r}; edge {e.name()} declares "
            f"to: [{', '.join(e.targets)}] -- return one or more of those (or END), or "
            "add the target to the edge", node=_edge_node(e), edge=e.index))
    return list(dict.fromkeys(chosen))


_PLAIN_VALUES = frozenset({bool, str, float})  # an edge's value JSON keeps as it is


def _map_items(plan: Plan, e: PlanEdge, value: object) -> list[JSON]:
    """A map edge's list (what its ``value`` records, each item as JSON data), or the run
    fails before any item starts."""
    expr = e.spec.map
    where = f"{_edge_location(plan, e, 'map')}edge {e.name()}"
    if isinstance(value, dict) or not isinstance(value, list | tuple):
        raise Abort(ExpressionError(
            f"{where}: map {expr!r} gave {value!r} ({type(value).__name__}), not a list; "
            "a map edge runs its target once per item of a list", node=_edge_node(e),
            edge=e.index, expr=expr))
    limit = e.spec.max_items if e.spec.max_items is not None else MAP_MAX_ITEMS
    if len(value) > limit:
        raise Abort(RunError(
            f"{where}: map {expr!r} gave {len(value)} items, over the edge's max_items "
            f"({limit}); raise max_items on the edge if that many visits are meant",
            node=_edge_node(e), edge=e.index, items=len(value), limit=limit))
    return list(L.to_json_value(list(value)))


def _no_route(source: str, stranded: list[str], dues: list[Due],
              items: list[R.Item]) -> NoRouteError:
    """Why ``stranded`` have nowhere to go: each edge of the decision, explained."""
    explain = [_explain(d.edge, fields) for d, (_, fields) in zip(dues, items, strict=True)]
    where = "none of its outgoing edges was taken" if source != "*" else \
        f"the join {dues[0].edge.name()}, its last way on, was not taken"
    return NoRouteError(
        f"no route from {', '.join(map(repr, stranded))}: {where} -- "
        + "; ".join(explain)
        + f". Add an 'otherwise: true' edge from {stranded[0]!r} (or a switch "
        "default) to say where the run goes in that case",
        node=None if stranded == ["START"] else stranded[0], edges=explain)


def _condition(plan: Plan, state: JSONObject, e: PlanEdge, scope: Scope
               ) -> tuple[bool, JSONObject | None]:
    """A plain edge's condition: its boolean and the fields it read."""
    cond = e.cond
    assert cond is not None
    expr = cond.source
    try:  # an expression reading state fields alone takes the state itself
        value, reads = cond.decide(state if cond.state_only else scope)
    except EvaluationError as exc:
        raise Abort(_cannot_evaluate(plan, e, expr, exc)) from None
    if not isinstance(value, bool):
        raise Abort(ExpressionError(
            f"{_edge_location(plan, e, 'when')}edge {e.name()}: condition {expr!r} "
            f"gave {value!r} "
            f"({type(value).__name__}), not a boolean", node=_edge_node(e),
            edge=e.index, expr=expr))
    return value, reads


def _cannot_evaluate(plan: Plan, e: PlanEdge, expr: str, exc: Exception) -> ExpressionError:
    key = {"plain": "when", "switch": "switch", "map": "map"}.get(e.kind)  # as validate's
    return ExpressionError(f"{_edge_location(plan, e, key)}edge {e.name()}: cannot evaluate "
                           f"{expr!r}: {exc}", node=_edge_node(e), edge=e.index, expr=expr)


def _reads_decision(e: PlanEdge, gate: str) -> bool:
    exprs = [x for x in (e.cond, e.switch) if x is not None]
    return any(f"{gate}.decision" in x.paths for x in exprs)


def _edge_node(e: PlanEdge) -> str | None:
    """The node an edge's fault is reported at: its source (none for START or a join)."""
    return e.sources[0] if len(e.sources) == 1 and e.sources[0] != "START" else None


def _decision_order(due: Due) -> tuple[bool, int]:
    return due.edge.otherwise, due.edge.index


def _explain(e: PlanEdge, fields: Mapping[str, object]) -> str:
    what = fields.get("expr")
    value = fields.get("value")
    reason = fields.get("reason")
    s = f"{e.name()}"
    if what:  # the value as the log and the trace show it (true, not True)
        s += f" [{what} = {L.dumps(value).decode()}]"
    if reason:
        s += f" ({reason})"
    return s


def _edge_location(plan: Plan, e: PlanEdge, key: str | None = None) -> str:
    from .._definition._spec import locate

    loc = locate(plan.spec, ("edges", e.index, key) if key else ("edges", e.index))
    return f"{loc}: " if loc.line is not None else ""


__all__ = ["Abort", "Decider", "Rejected"]
