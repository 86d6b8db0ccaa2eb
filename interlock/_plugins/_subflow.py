"""Sub-workflows: a node that runs another workflow as a child run.

    nodes:
      remediate: {workflow: remediation.yaml, input: {incident: 'incident'}, output: result}

To the engine a ``workflow:`` node is an async ``fn(state, ctx)`` (`SubflowKind.build`),
like an agent node. Its body asks the run executing it (`ChildRuns`, which `_runs`
implements and puts in `CHILD_RUNS` for the run's tasks) to start or continue the
child, then turns the child's end into the node's:

    child COMPLETED          -> the node's update: the child's state (or ``output``)
                                under the node's name (or ``output_key``)
    child WAITING_APPROVAL   -> the node pauses (`PauseRequested` with the gate's path,
                                ``remediate/approval``): the parent waits too
    child FAILED             -> the node fails (its ``retry`` continues the same child:
                                a resume of it, nothing it completed runs again) --
                                but a limit of the parent's the child crossed fails the
                                parent as that limit (never retried)
    child CANCELLED/REJECTED -> the node fails

The child's id is derived from the visit (`child_run_id`), so every attempt of a visit
-- a retry, the re-run after a crash or after a decision -- finds the same child. Its
tokens and steps are counted in the parent exactly once: each time the child stops,
what it spent since it was last counted is charged through ``ctx.once`` keyed by the
child's last record (`_account`), so a crash or a replay does not count it twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._definition._expr import ExpressionSyntaxError, compile_expression
from .._definition._kinds import Checker
from .._definition._model import NodeSpec, WorkflowSpec
from .._definition._spec import parse
from .._engine._context import PauseRequested
from .._engine._fold import RunResult
from .._engine._journal import StoreOutage
from .._errors import BudgetExceededError, ChildRunError, NodeError, StepLimitError, StoreError
from .._json import JSONObject

if TYPE_CHECKING:
    from .._definition._plan import Plan
    from .._engine._context import Context


@dataclass(frozen=True, slots=True)
class ChildRequest:
    """What a sub-workflow node asks of its run: start (or continue) this child."""

    run_id: str
    plan: Plan  # the child's, executable
    definition: JSONObject  # pinned in the parent's definition
    input: Callable[[], dict[str, object]]  # the child's input (only evaluated to start it)
    link: dict[str, object]  # {run, node, visit[, item]}: written in the child's run.started
    callables: Mapping[str, Callable[..., object]]  # a builder child's Python functions


@dataclass(frozen=True, slots=True)
class ChildOutcome(RunResult):
    """Where the child stopped (its summary, as its log has it), and its last record."""

    last_seq: int
    inherited: list[str] = field(default_factory=list)  # limits that are the parent's


class ChildRuns(Protocol):
    """What a sub-workflow node needs of the run executing it (`_ops._execute` implements it)."""

    async def run(self, ctx: Context, request: ChildRequest) -> ChildOutcome:
        """Start the child, or continue it (resume it, unless it ended or waits for a
        human) -- on the parent's store, under the parent's remaining limits."""

    async def stopped(self, child_id: str) -> None:
        """The node's visit was cancelled while the child ran: when the parent is being
        cancelled, cancel the child (else it stays interrupted, to be continued)."""

    async def search_messages(self, query: str, limit: int) -> list[Any]:
        """The messages of earlier conversations of this run's workflow that best match
        ``query`` (`Store.search_messages`, this run left out): a ``recall`` tool's."""

    def steps(self) -> tuple[int, int | None]:
        """The run's steps so far and its ``limits.steps`` (None: no limit): what a
        conversation's turn checks (each turn is a step)."""


#: the child runs of the run whose tasks see it (set by `_execute.drive`, per run)
CHILD_RUNS: ContextVar[ChildRuns | None] = ContextVar("interlock_child_runs", default=None)


def child_run_id(run_id: str, node: str, visit: int, item: int | None = None) -> str:
    """A child's run id: its parent's, the node and the visit (and a mapped node's item)
    -- stable across the visit's attempts, distinct between visits."""
    base = f"{run_id}.{node}.{visit}"
    return base if item is None else f"{base}.{item}"


Compile = Callable[[WorkflowSpec, Mapping[str, Callable[..., object]]], tuple["Plan", list[Any]]]
Check = Callable[[WorkflowSpec, Mapping[str, Callable[..., object]]], Any]


class SubflowKind:
    """The ``workflow:`` node kind, as validation and the plan take it
    (`interlock._definition._kinds`).
    ``check_child``/``compile_child`` validate and compile a child with every node kind
    (`_compile` gives them: a child may hold agents and sub-workflows too)."""

    name = "workflow"

    def __init__(self) -> None:
        self.check_child: Check | None = None
        self.compile_child: Compile | None = None

    def owns(self, node: NodeSpec) -> bool:
        return node.workflow is not None

    def check(self, checker: Checker, name: str, node: NodeSpec) -> None:
        assert node.workflow is not None and self.check_child is not None
        spec = checker.spec
        where = ("nodes", name, "workflow")
        child = spec._children.get(name) or _child_spec(node)
        label = node.workflow.file or child.workflow
        if node.isolation == "process":
            checker.add("error", f"node {name!r}: a sub-workflow runs in the engine, not in a "
                        "worker process; remove 'isolation: process' (put it on the child's "
                        "nodes)", ("nodes", name, "isolation"), "subflow")
        prefix = f"{name}/"
        provided = {k[len(prefix):]: fn for k, fn in checker.provided.items()
                    if k.startswith(prefix)}
        result = self.check_child(child, provided)
        for d in result.diagnostics:
            if d.severity == "error":
                checker.add("error", f"node {name!r}: its sub-workflow {label!r} is invalid: "
                            f"{d}", where, "subflow")
            elif d.code == "api-key":  # the child runs in this process too
                checker.add("warning", f"node {name!r}: its sub-workflow {label!r}: {d}",
                            where, "api-key")
        for path, fn in result.callables.items():  # what running the child needs
            checker.result.callables[prefix + path] = fn
        known = spec.known_fields()
        # a map edge's item (``as:``) is in the state of each visit it makes of this node
        known |= {e.item_name for e in spec.edges if e.kind == "map" and e.to == [name]}
        mapped = node.input or {}
        for field_name, src in mapped.items():
            at = ("nodes", name, "input", field_name)
            try:
                compile_expression(src)
            except ExpressionSyntaxError as exc:
                checker.add("error", f"node {name!r}: input {field_name!r}: the expression "
                            f"{src!r} does not compile: {exc}", at, "expression")
            if child.input and field_name not in child.input:
                checker.add("warning", f"node {name!r}: input {field_name!r} is not one of "
                            f"the sub-workflow's inputs ({', '.join(child.input)}); it is "
                            "passed in its input anyway", at, "subflow")
        # without every node's ``writes``, a field may come from a node that does not say
        all_known = all(ns.written(n) is not None for n, ns in spec.nodes.items())
        for field_name in child.input:
            if field_name not in mapped and field_name not in known:
                lacks = "does not have" if all_known else \
                    "may not have (no node declares writing it)"
                checker.add("error" if all_known else "warning",
                            f"node {name!r}: the sub-workflow {label!r} needs input "
                            f"{field_name!r}, which is not mapped and which this workflow "
                            f"{lacks}; map it: input: {{{field_name}: 'EXPR'}} (a CEL "
                            "expression over this workflow's state)",
                            ("nodes", name, "input") if node.input is not None else where,
                            "subflow")
        outputs = [node.output] if isinstance(node.output, str) else node.output or []
        child_known = child.known_fields()
        for out in outputs:
            if out not in child_known:
                checker.add("warning", f"node {name!r}: output {out!r} is a field the "
                            f"sub-workflow {label!r} does not declare or write "
                            f"(its fields: {', '.join(sorted(child_known)) or 'none'})",
                            ("nodes", name, "output"), "subflow")

    def build(self, name: str, node: NodeSpec, *, callables: Mapping[str, Callable[..., object]],
              workflow: WorkflowSpec) -> Callable[..., object]:
        assert node.workflow is not None
        prefix = f"{name}/"
        own = {k[len(prefix):]: fn for k, fn in callables.items() if k.startswith(prefix)}
        return _body(self, name, node, own)


def _child_spec(node: NodeSpec) -> WorkflowSpec:
    assert node.workflow is not None
    return parse(node.workflow.definition)


def _body(kind: SubflowKind, name: str, node: NodeSpec,
          callables: Mapping[str, Callable[..., object]]) -> Callable[..., object]:
    assert node.workflow is not None
    definition = node.workflow.definition
    exprs = {f: compile_expression(src) for f, src in (node.input or {}).items()}
    key = node.output_field(name)
    assert key is not None
    compiled: list[Plan] = []  # compiled when the node first runs (reading needs nothing)

    async def run_subflow(state: dict[str, object], ctx: Context) -> Any:
        host = CHILD_RUNS.get()
        if host is None:
            raise NodeError(f"node {name!r} runs a sub-workflow, which needs the run "
                            "executing it; it cannot be called on its own", node=name)
        if not compiled:
            assert kind.compile_child is not None
            compiled.append(kind.compile_child(parse(definition), callables)[0])
        plan = compiled[0]
        child_id = child_run_id(ctx.run_id, name, ctx.visit, ctx.item_index)
        link: dict[str, object] = {"run": ctx.run_id, "node": name, "visit": ctx.visit}
        if ctx.item_index is not None:
            link["item"] = ctx.item_index

        def child_input() -> dict[str, object]:
            scope = {**state, "config": ctx.config}
            data = {f: state[f] for f in plan.spec.input if f not in exprs and f in state}
            for f, expr in exprs.items():
                try:
                    data[f] = expr.evaluate(scope)
                except Exception as exc:  # an EvaluationError, or a cost bound
                    raise NodeError(f"node {name!r}: input {f!r}: evaluating {expr.source!r} "
                                    f"failed: {exc}", node=name) from None
            missing = [f for f in plan.spec.input if f not in data]
            if missing:
                raise NodeError(f"node {name!r}: the sub-workflow's input lacks "
                                f"{', '.join(map(repr, missing))} (no such field in this "
                                "run's state); map it with input: {FIELD: 'EXPR'}", node=name)
            return data

        request = ChildRequest(child_id, plan, definition, child_input, link, callables)
        try:
            out = await host.run(ctx, request)
        except asyncio.CancelledError:
            await asyncio.shield(host.stopped(child_id))
            raise
        except StoreError as exc:  # the store failed under the child: not this node's
            # failure (no retry, no error edge); the parent stops unfinished with it too
            raise StoreOutage(exc) from exc
        await _account(ctx, out)
        return _result(name, key, node, plan.spec, out)

    return run_subflow


async def _account(ctx: Context, out: ChildOutcome) -> None:
    """Charge the parent, once, with what the child spent since it was last counted."""
    prefix = f"child:{out.run_id}:"
    tokens = steps = 0
    for k in ctx.effect_keys():
        if k.startswith(prefix):
            found, value = ctx.recorded(k)
            if found and isinstance(value, dict):
                tokens += value.get("tokens", 0)
                steps += value.get("steps", 0)
    new_tokens, new_steps = out.tokens - tokens, out.steps - steps
    if new_tokens <= 0 and new_steps <= 0:
        return

    def charge() -> dict[str, object]:
        if new_tokens > 0:
            ctx.record_tokens(new_tokens)  # the parent's budgets (raises when crossed)
        ctx.spent.steps = max(new_steps, 0)  # counted with this effect's record
        return {"run_id": out.run_id, "status": out.status, "tokens": max(new_tokens, 0),
                "steps": max(new_steps, 0)}

    await ctx.once(f"{prefix}{out.last_seq}", charge)


def child_gates(prefix: str, waiting: Mapping[str, Any], child: WorkflowSpec | None = None
                ) -> list[JSONObject]:
    """The gates a child run waits at (its ``waiting.pending``: its own children's
    already named by their paths), as its parent lists them: each named by its path from
    the parent -- ``prefix`` (the node, ``node[i]`` for a map item's child, the agent node
    and tool) then the child's name for it, ``remediate/approval``,
    ``remediate/deploy[2]``, ``remediate/fix/approval`` -- and decided through the parent
    by that path. Each says who may decide it (``approvers``, from the gate's node in
    ``child``, the child's definition; a grandchild's gate says it already): the parent's
    definition does not know them."""
    gates = waiting.get("pending") or [waiting]
    out: list[JSONObject] = []
    for g in gates:
        if not isinstance(g, dict):
            continue
        entry = {k: v for k, v in g.items() if k not in ("pending", "running")}
        name = str(g.get("node"))
        if child is not None and "approvers" not in entry and "/" not in name:
            ns = child.nodes.get(name.split("[", 1)[0])
            if ns is not None and ns.approval is not None and ns.approval.approvers:
                entry["approvers"] = list(ns.approval.approvers)
        entry["node"] = f"{prefix}/{name}"
        out.append(entry)
    return out


def _result(name: str, key: str, node: NodeSpec, child: WorkflowSpec,
            out: ChildOutcome) -> dict[str, object]:
    if out.status == "COMPLETED":
        state = out.state
        if node.output is None:
            value: Any = state
        elif isinstance(node.output, str):
            value = state.get(node.output)
        else:
            value = {f: state.get(f) for f in node.output}
        return {key: value}
    if out.status == "WAITING_APPROVAL":
        waiting = out.waiting or {}
        # (the gate's schema for its decision's data or patch, shown with the parent too)
        raise PauseRequested(out.run_id, waiting.get("show") or {}, waiting.get("input"),
                             path=f"{name}/{waiting.get('node')}",
                             decisions=list(waiting.get("decisions") or ["approve", "reject"]),
                             kind=str(waiting.get("kind") or "approval"),
                             pending=child_gates(name, waiting, child))
    error = out.error or {}
    etype = error.get("type")
    details = error.get("details") or {}
    message = error.get("message") or out.status.lower()
    if etype in ("budget_exceeded", "step_limit"):
        limit = "tokens" if etype == "budget_exceeded" else "steps"
        if limit in out.inherited and (etype == "step_limit" or details.get("scope") == "run"):
            what = (f"the parent's remaining budget of {details.get('limit')} tokens"
                    if limit == "tokens" else "the parent's remaining limits.steps")
            cls = BudgetExceededError if limit == "tokens" else StepLimitError
            raise cls(f"node {name!r}: its sub-workflow (run {out.run_id}) crossed {what}: "
                      f"{message}", node=name, child_run=out.run_id, scope="run")
    if out.status == "FAILED":
        text = (f"node {name!r}: its sub-workflow {child.workflow!r} (run {out.run_id}) "
                f"failed at node {error.get('node')!r}: {message}")
    else:
        text = (f"node {name!r}: its sub-workflow {child.workflow!r} (run {out.run_id}) was "
                f"{out.status.lower()}" + (f": {message}" if out.error else ""))
    raise ChildRunError(text, node=name, child_run=out.run_id, child_status=out.status,
                        child_error=error or None,
                        exception="ChildRunError", mro=["ChildRunError", "NodeError",
                                                        "RunError", "Exception"])


__all__ = ["CHILD_RUNS", "ChildOutcome", "ChildRequest", "ChildRuns",
           "SubflowKind", "child_gates", "child_run_id"]
