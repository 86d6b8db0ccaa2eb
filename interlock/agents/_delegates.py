"""Tools that are not Python functions: a workflow, or a specialist agent.

    tools:
      - {workflow: workflow.yaml, name: run_triage, description: Sweep every service}
      - {name: kafka, description: Ask the Kafka specialist,
         agent: {provider: openai, model: gpt-4o-mini, system: You know Kafka.}}

A **workflow tool** starts a child run per call, exactly as a ``workflow:`` node does
(`_plugins._subflow`: the same `ChildRuns` host, so the child is pinned in the caller's
definition, linked both ways, counted in the caller's limits and cancelled with it). The
child's id is derived from the call (``RUN.NODE.VISIT.tool.NAME.TURN-CALL``), so every
re-run of the caller's visit -- after a crash, after a decision -- finds the same child. A
gate in the child pauses the caller with the path ``NODE/NAME/GATE``
(``assistant/run_triage/approval``), decided through the caller (`_ops._children`); then
the child goes on and its final state is the tool's result. A child that fails is a tool
error (``tool_errors`` applies).

A **specialist agent** runs its own model conversation inside the caller's visit, with
its own tools, ``output:`` and ``max_turns``: its journal keys are the caller's, under a
prefix of its own (`Scoped`), so its model calls and tool calls are replayed like the
caller's own, its records carry the tool's name, and its tokens are charged to the caller.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, create_model

from .._engine._context import PauseRequested
from .._errors import StoreError
from ._errors import AgentConfigError, AgentError
from ._node import _Agent
from ._spec import AgentSpec, ToolSpec
from ._tools import Tool

if TYPE_CHECKING:
    from .._definition._plan import Plan
    from .._engine._context import Context

#: compiles a child workflow (set by `_plugins._compile`, which knows every node kind)
COMPILE: list[Callable[..., tuple[Plan, list[Any]]]] = []

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_child_id(run_id: str, node: str, visit: int, tool: str, turn: int,
                  call_id: str) -> str:
    """The run id of the child a workflow tool's call starts: stable across the visit's
    attempts, one per call. `_ops._children` reads the tool's name back from it."""
    return f"{run_id}.{node}.{visit}.tool.{tool}.{turn}-{_UNSAFE.sub('_', call_id)[:40]}"


def _data_tool(name: str, description: str, params: Mapping[str, tuple[Any, Any]]) -> Tool:
    """A `Tool` whose arguments are ``params`` (name -> (type, default or ...)); its
    function is the delegate's, called by the agent (never `Tool.invoke`)."""
    fields = {f"p{i}": (typ, Field(default, alias=p))
              for i, (p, (typ, default)) in enumerate(params.items())}
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"),
                         **fields)  # type: ignore[call-overload]
    schema = model.model_json_schema(by_alias=True)
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return Tool(name, _never, False, description, model, tuple(params), schema, True)


async def _never(**kwargs: Any) -> Any:
    raise AgentError("a workflow or agent tool is run by its agent, not called")


def delegate(node: str, spec: ToolSpec, callables: Mapping[str, Callable[..., Any]]
             ) -> WorkflowTool | AgentTool:
    assert spec.name is not None
    if spec.workflow is not None:
        if not isinstance(spec.workflow, dict):
            raise AgentConfigError(f"node {node!r}: tool {spec.name!r}: workflow "
                                   f"{spec.workflow!r} was not read; load the workflow from "
                                   "its file (interlock.load) so that the child is pinned")
        from .._definition._spec import parse

        definition = spec.workflow["definition"]
        child = parse(definition)
        params = {f: (Any, ...) for f in child.input}
        desc = spec.description or child.description or f"Run the workflow {child.workflow}"
        return WorkflowTool(_data_tool(spec.name, desc, params), node, spec.name, definition,
                            {k[len(node) + 1:]: fn for k, fn in callables.items()
                             if k.startswith(f"{node}/")})
    assert spec.agent is not None
    block = dict(spec.agent)
    block.setdefault("prompt", "{{ request }}")
    agent_spec = AgentSpec.model_validate(block)
    desc = spec.description or f"Ask the {spec.name} specialist"
    return AgentTool(_data_tool(spec.name, desc, {"request": (str, ...)}), node, spec.name,
                     agent_spec, dict(callables))


@dataclass
class WorkflowTool:
    tool: Tool
    node: str
    name: str
    definition: dict[str, Any]
    callables: Mapping[str, Callable[..., Any]]
    _plan: list[Plan] = field(default_factory=list)

    async def run(self, ctx: Context, base: Mapping[str, Any], kwargs: dict[str, Any]) -> Any:
        import asyncio

        from .._engine._journal import StoreOutage
        from .._plugins._subflow import CHILD_RUNS, ChildRequest, _account, child_gates

        host = CHILD_RUNS.get()
        if host is None:
            raise AgentError(f"node {self.node!r}: tool {self.name!r} runs a workflow, which "
                             "needs the run executing the agent")
        if not self._plan:
            if not COMPILE:
                raise AgentConfigError("workflow tools need interlock's node kinds loaded")
            from .._definition._spec import parse

            self._plan.append(COMPILE[0](parse(self.definition), self.callables)[0])
        plan = self._plan[0]
        real = getattr(ctx, "real", ctx)  # a specialist's scoped context: the visit's own
        child_id = tool_child_id(real.run_id, real.node, real.visit, self.name,
                                 int(base.get("turn") or 0), str(base.get("call_id") or ""))
        link: dict[str, Any] = {"run": real.run_id, "node": real.node, "visit": real.visit,
                                "tool": self.name}
        data = {k: v for k, v in kwargs.items() if v is not None or k in plan.spec.input}
        request = ChildRequest(child_id, plan, self.definition, lambda: data, link,
                               self.callables)
        try:
            out = await host.run(real, request)
        except asyncio.CancelledError:
            await asyncio.shield(host.stopped(child_id))
            raise
        except StoreError as exc:
            raise StoreOutage(exc) from exc
        await _account(real, out)
        if out.status == "COMPLETED":
            return out.state
        if out.status == "WAITING_APPROVAL":
            waiting = out.waiting or {}
            raise PauseRequested(out.run_id, waiting.get("show") or {}, waiting.get("input"),
                                 path=f"{real.node}/{self.name}/{waiting.get('node')}",
                                 decisions=list(waiting.get("decisions")
                                                or ["approve", "reject"]),
                                 pending=child_gates(f"{real.node}/{self.name}", waiting,
                                                    plan.spec))
        error = out.error or {}
        if out.status == "FAILED":
            how = f"failed at node {error.get('node')!r}: {error.get('message')}"
        else:  # rejected or cancelled: by whom, and their comment (the model can say why)
            how = f"was {out.status.lower()}" + (f": {error['message']}"
                                                 if error.get("message") else "")
        raise ToolWorkflowError(f"the workflow {plan.spec.workflow!r} (run {out.run_id}) {how}")


class ToolWorkflowError(AgentError):
    """A workflow tool's child run did not complete (the model is told, or the node
    fails, as ``tool_errors`` says)."""


@dataclass
class AgentTool:
    tool: Tool
    node: str
    name: str
    spec: AgentSpec
    callables: dict[str, Callable[..., Any]]
    _agent: list[Any] = field(default_factory=list)

    async def run(self, ctx: Context, base: Mapping[str, Any], kwargs: dict[str, Any]) -> Any:
        if not self._agent:
            owner = _Owner()
            agent = DelegatingAgent(f"{self.node}/{self.name}", self.spec,
                                    owner,  # type: ignore[arg-type]
                                    self.callables, [])
            agent.output_key = "reply"
            self._agent.append(agent)
        agent = self._agent[0]
        call = f"{int(base.get('turn') or 0)}-{_UNSAFE.sub('_', str(base.get('call_id')))[:40]}"
        scoped = Scoped(ctx, f"agent.{self.name}.", f"{call}:", self.name)
        out = await agent.run({"request": kwargs["request"]}, scoped)
        if not isinstance(out, dict):
            raise AgentError(f"node {self.node!r}: the specialist {self.name!r} handed off "
                             "(goto); a specialist answers its caller")
        return out["reply"]


class DelegatingAgent(_Agent):
    """An agent whose tools may be workflows and specialist agents."""

    def _delegate(self, tool: ToolSpec) -> WorkflowTool | AgentTool:
        return delegate(self.name, tool, self.callables)

    def _tool_context(self, ctx: Context, base: dict[str, Any]) -> Any:
        call = f"{int(base.get('turn') or 0)}-{_UNSAFE.sub('_', str(base.get('call_id')))[:40]}"
        return Scoped(ctx, f"tool.{base.get('tool')}.", f"{call}:", None)


class _Owner:
    """The node a specialist runs in, as far as `_Agent` asks (it has none of its own)."""

    def output_field(self, name: str) -> str:
        return "reply"


class Scoped:
    """A node's `Context` as a specialist agent sees it: its journal keys under a prefix
    of its own (``agent.NAME.CALL:``), so that it replays its own model and tool calls,
    and its records tagged with the tool's name. Everything else is the visit's."""

    def __init__(self, real: Any, family: str, call: str, tool: str | None) -> None:
        self.real = getattr(real, "real", real)
        self._ctx = real
        self._family = family
        self._prefix = family + call
        self._tool = tool
        # one per call, stable across the visit's attempts (an external effect's key)
        self.idempotency_key = f"{real.idempotency_key}:{self._prefix.rstrip(':')}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def once(self, key: str, fn: Callable[..., Any], *args: Any
             ) -> Coroutine[Any, Any, Any]:
        return self._ctx.once(self._prefix + key, fn, *args)  # type: ignore[no-any-return]

    def recorded(self, key: str) -> tuple[bool, Any]:
        return self._ctx.recorded(self._prefix + key)  # type: ignore[no-any-return]

    def effect_keys(self) -> list[str]:
        """This specialist's keys in the run (every call), without their call prefix: its
        model calls so far, which its scripted replies are counted by."""
        return [k[len(self._family):].partition(":")[2] for k in self._ctx.effect_keys()
                if k.startswith(self._family)]

    def log(self, type: str, fields: Mapping[str, Any] | None = None
            ) -> Coroutine[Any, Any, None]:
        if self._tool is None:
            return self._ctx.log(type, fields)  # type: ignore[no-any-return]
        return self._ctx.log(type, {**(fields or {}), "agent_tool": self._tool})  # type: ignore[no-any-return]

    def confirm(self, key: str, show: Mapping[str, Any], *,
                edit: Mapping[str, Any] | None = None) -> str:
        return self._ctx.confirm(self._prefix + key, show, edit=edit)  # type: ignore[no-any-return]

    def decision(self, key: str) -> dict[str, Any] | None:
        return self._ctx.decision(self._prefix + key)  # type: ignore[no-any-return]
