"""The agent node: an async ``fn(state, ctx)`` built from an ``agent:`` block.

One visit is a conversation::

    messages = [system (+ the output schema), user (the rendered prompt)]
    loop:
        reply = model(messages)                      ctx.once("llm-<turn>"): journaled
        tool calls? run each (ctx.once("tool-<turn>-<i>"); confirm: true asks a human
                    first through ctx.confirm) and answer them as tool messages
        else: parse + validate the reply; invalid -> one repair round, then fail

Every model call and every tool execution is journaled, so a re-run of the visit (a
retry, a resume after a crash, the re-run after a guarded tool's decision) replays them
instead of paying or acting twice; a call's tokens are charged inside its journaled
step, so a replay charges nothing. A conversation that failed for good (no valid reply
after the repair, ``max_turns`` exhausted) is marked in the journal, so the next attempt
(the retry policy, or a resume of the failed run) starts a fresh conversation rather
than replaying the same failure.

Redaction (``redact: [fields]``). A named field never reaches the run's log -- not the
``agent.*``/``tool.*`` records, not the journal (``effect.recorded``), not error messages
(``node.failed``, ``node.retrying``), not ``waiting.show``. The rule: *the journal holds
only what the log may hold, and a step whose result it may not hold is not replayed.*

- ``prompt`` / ``system``: left out of ``agent.request`` (they are never journaled).
  A state field's name masks its value in the logged prompt.
- ``reply`` (the assistant's text), ``tool_calls`` or ``arguments`` (what the model asked
  for): a model call is journaled only as a stub ``{"redacted": [...], "model", "usage"}``
  under ``llm-<turn>-call-<n>`` (it counts the call; no text, no hash). A re-run of the
  visit therefore *calls the model again*, and that call is charged again -- it is paid
  again. Because a fresh reply may ask for something else, each tool step's key, and so
  a guarded tool's confirmation, is bound to a digest of the exact call (tool name and
  arguments, salted with the visit's idempotency key): a human's decision applies to
  that call only, and a different call is asked about anew. Schema problems in the reply
  are logged (and raised) without their details; the model still gets them in the
  repair round. With ``arguments`` redacted, ``waiting.show`` has ``"arguments":
  "[redacted]"``.
- ``result``: a tool's result is not journaled, so a re-run of the visit *runs the tool
  again* (at-least-once: make such tools idempotent). A rejected or refused call is
  still journaled (its text holds no result).
- The node's validated output is state, and state is in the log (``node.completed``'s
  ``update``; resume rebuilds state from it): ``redact`` does not apply to it. To keep
  the model's text out of the log, give the node an ``output`` schema that holds only
  what the workflow needs (without a schema the output *is* the reply: its text, or the
  JSON object it is).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from .. import _log as L
from .._definition._model import NodeSpec, WorkflowSpec
from .._engine._context import Goto, goto
from .._engine._guards import BudgetExceededError
from .._errors import RouteError
from ._errors import (
    AgentConfigError,
    AgentError,
    AgentOutputError,
    AgentTurnsError,
    ToolUnavailable,
)
from ._providers import (
    TOKEN_SINK,
    ChatRequest,
    OpenAIProvider,
    Provider,
    RepliesExhausted,
    Reply,
    ScriptedProvider,
    ToolCall,
)
from ._spec import AgentSpec, ToolSpec
from ._tools import Tool, ToolArgumentsError, make_tool

if TYPE_CHECKING:
    from jinja2 import Template

    from .._engine._context import Context

REDACTED = "[redacted]"
_REPLY_FIELDS = frozenset({"reply", "tool_calls", "arguments"})  # what a journaled reply holds
AgentFn = Callable[[dict[str, Any], "Context"], Awaitable[Any]]

_SCHEMA_HINT = ("Reply with only a JSON document (no prose, no code fences) that satisfies "
                "this JSON Schema:\n")
_REPAIR = ("Your reply does not satisfy the required JSON Schema: {problem}\n"
           "Reply again with only a corrected JSON document.")
_REJECTED = ("A human reviewer rejected this call to {tool}; it was not executed. Do not "
             "call it again for this; carry on without it.")
_REJECTED_WITH = ("A human reviewer rejected this call to {tool}; it was not executed. The "
                  "reviewer's comment: {comment}")


def build_agent_node(name: str, agent: Mapping[str, Any], node: NodeSpec, *,
                     callables: Mapping[str, Callable[..., Any]] | None = None,
                     workflow: WorkflowSpec | None = None,
                     agent_class: type[_Agent] | None = None) -> AgentFn:
    """The node function of agent node ``name``. Nothing is imported or resolved until the
    node first runs (a plan built only to read a stored run never runs it)."""
    choices: list[str] = []
    if workflow is not None:
        choices = [t for e in workflow.edges if e.kind == "choose" and e.source == [name]
                   for t in e.targets]
    try:
        spec = AgentSpec.model_validate(dict(agent))
    except ValidationError as exc:
        problem = f"node {name!r}: invalid agent block: {exc}"

        async def broken(state: dict[str, Any], ctx: Context) -> Any:
            raise AgentConfigError(problem)

        return broken
    agent_run = (agent_class or _Agent)(name, spec, node, dict(callables or {}), choices)

    async def agent_node(state: dict[str, Any], ctx: Context) -> Any:
        return await agent_run.run(state, ctx)

    agent_node.__qualname__ = agent_node.__name__ = f"agent:{name}"
    return agent_node


def output_schema(spec: AgentSpec, model: type[BaseModel] | None,
                  choices: list[str]) -> dict[str, Any] | None:
    """The schema a reply must satisfy: ``output`` (or the model's), with a ``choose``
    field limited to the declared targets when the schema does not limit it itself."""
    schema = spec.output
    if schema is None and model is not None:
        schema = model.model_json_schema()
    if schema is None:
        return None
    schema = copy.deepcopy(schema)
    field = spec.choose
    props = schema.get("properties")
    if field is not None and isinstance(props, dict):
        fs = props.get(field)
        if isinstance(fs, dict) and "enum" not in fs and "const" not in fs and choices:
            props[field] = {**fs, "enum": list(choices)}
        required = schema.setdefault("required", [])
        if isinstance(required, list) and field not in required:
            required.append(field)
    return schema


class _Agent:
    def __init__(self, name: str, spec: AgentSpec, node: NodeSpec,
                 callables: dict[str, Callable[..., Any]], choices: list[str]) -> None:
        self.name = name
        self.spec = spec
        self.node = node
        self.callables = callables
        self.choices = choices
        self.output_key = node.output_field(name) or name
        self.redact = frozenset(spec.redact)
        # a reply may be journaled (and replayed) only when no part of it is redacted
        self.replayable = not (self.redact & _REPLY_FIELDS)
        # MCP servers' tools are listed per visit, on a copy of this agent (`_mcp`)
        self.servers = any(t.mcp is not None for t in spec.tools)
        self.visiting = False
        # a reply streams to a `TOKEN_SINK` when one is set (a conversation's agent)
        self.streams = False
        self._ready = False

    # -- set up on first run --------------------------------------------------------------

    def _resolve(self, path: str) -> Callable[..., Any]:
        fn = self.callables.get(path)
        if fn is None:
            from .._definition._callables import import_callable

            fn = self.callables[path] = import_callable(path)
        return fn

    def _prepare(self) -> None:
        if self._ready:
            return
        from jsonschema import Draft202012Validator

        from ._prompt import compile_template

        spec = self.spec
        try:
            self.system_t: Template | None = (compile_template(spec.system)
                                              if spec.system else None)
            # (a conversation's agent has none: its messages are the user's)
            self.prompt_t: Template = compile_template(spec.prompt or "")
        except Exception as exc:
            raise AgentConfigError(f"node {self.name!r}: invalid template: {exc}") from None
        self.model_cls: type[BaseModel] | None = None
        if spec.output_model is not None:
            cls = self._resolve(spec.output_model)
            if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
                raise AgentConfigError(f"node {self.name!r}: output_model "
                                       f"{spec.output_model} is not a pydantic model")
            self.model_cls = cls
        self.schema = output_schema(spec, self.model_cls, self.choices)
        self.validator = Draft202012Validator(self.schema) if self.schema is not None else None
        tools: dict[str, Tool] = {}
        # tools that are not Python functions: a workflow (a child run per call) or a
        # specialist agent (SPEC §11), by name
        self.delegates: dict[str, Any] = {}
        for t in spec.tools:
            if t.mcp is not None:  # an MCP server's tools: listed when a visit starts (_mcp)
                continue
            if t.call is None:
                d = self._delegate(t)
                tools[d.tool.name] = d.tool
                self.delegates[d.tool.name] = d
                continue
            tool = make_tool(self._resolve(t.call), t.confirm is True)
            tools[tool.name] = tool
        self._more_tools(tools)
        self.tools = tools
        self.tool_schemas = [t.schema() for t in tools.values()] or None
        self.provider: Provider
        if spec.provider == "scripted":
            self.provider = ScriptedProvider(
                [x.model_dump(mode="json", exclude_defaults=True) for x in r]
                if isinstance(r, list) else r.model_dump(mode="json", exclude_defaults=True)
                for r in spec.replies or [])
        else:
            self.provider = OpenAIProvider(spec.base_url, spec.api_key_env)
        self.url_t: Template | None = None
        if spec.base_url is not None and "{{" in spec.base_url:
            self.url_t = compile_template(spec.base_url)  # e.g. {{ config.llm_base_url }}
        self._ready = True

    def _delegate(self, tool: ToolSpec) -> Any:
        """A workflow or agent tool (`_delegates.DelegatingAgent` makes them)."""
        raise AgentConfigError(f"node {self.name!r}: tool {tool.name!r} is a workflow or an "
                               "agent, which this agent cannot call")

    def _tool_context(self, ctx: Context, base: dict[str, Any]) -> Any:
        """The context a tool that takes ``ctx`` gets (`_delegates.Scoped`)."""
        raise AgentConfigError(f"node {self.name!r}: tool {base.get('tool')!r} takes ctx, "
                               "which this agent cannot give")

    def _more_tools(self, tools: dict[str, Tool]) -> None:
        """Built-in tools of a kind of agent (a conversation's ``end_conversation``)."""

    def _provider(self, ctx: Context) -> Provider:
        if self.url_t is None:
            return self.provider
        from ._prompt import render

        try:
            url = render(self.url_t, {"config": dict(ctx.config)}).strip()
        except Exception as exc:
            raise AgentConfigError(f"node {self.name!r}: cannot render base_url: {exc}") from None
        return OpenAIProvider(url or None, self.spec.api_key_env)

    # -- one visit ------------------------------------------------------------------------

    async def run(self, state: dict[str, Any], ctx: Context) -> Any:
        self._prepare()
        if self.servers and not self.visiting:  # this visit's tools, its MCP sessions
            from ._mcp import mcp_visit

            async with mcp_visit(self, ctx) as visit:
                return await visit.run(state, ctx)
        failures, turn = _restart_point(ctx)
        scope = {**state, "config": dict(ctx.config)}
        messages, opening = await self._opening(scope)
        calls = 0
        repairs = 0
        note: dict[str, Any] = opening
        while True:
            repairing = bool(note.get("repair"))
            try:
                reply = await self._call(ctx, turn, messages, note)
            except RepliesExhausted as exc:
                if not repairing:
                    raise
                # the real cause is the reply before: say so, not only "no reply left"
                raise AgentOutputError(
                    f"node {self.name!r}: the model's reply does not satisfy the output "
                    f"schema: {note['repair']}; the repair round found no reply to ask for "
                    f"({exc})") from None
            note = {}
            if not repairing:
                calls += 1
            if reply.tool_calls:
                if calls >= self.spec.max_turns:
                    await self._give_up(ctx, failures, turn + 1, AgentTurnsError(
                        f"node {self.name!r}: the model asked for tools again after "
                        f"max_turns={self.spec.max_turns} model calls without a final "
                        "answer; raise max_turns or make the task smaller"))
                asked = _assistant(reply)
                messages.append(asked)
                for i, call in enumerate(reply.tool_calls):
                    answer, edited = await self._tool(ctx, turn, i, call)
                    if isinstance(answer["content"], dict):  # a tool handed off: goto
                        # the turn ends here; the calls after it in this reply do not run
                        return goto(answer["content"]["goto"], answer["content"]["update"])
                    if edited is not None:  # the conversation shows the call that ran
                        asked["tool_calls"][i]["function"]["arguments"] = edited
                    messages.append(answer)
                turn += 1
                continue
            value, problem = self._check(reply.content)
            turn += 1
            if problem is None:
                break
            shown = self._shown_problem(problem)
            if repairs:
                await self._give_up(ctx, failures, turn, AgentOutputError(
                    f"node {self.name!r}: the model's reply does not satisfy the output "
                    f"schema, even after a repair round: {shown}"))
            repairs += 1
            messages.append(_assistant(reply))
            messages.append({"role": "user", "content": _REPAIR.format(problem=problem)})
            note = {"repair": shown}
        update = {self.output_key: value}
        if self.spec.choose is not None:
            return goto(str(value[self.spec.choose]), update)
        return update

    def _render(self, scope: dict[str, Any]) -> tuple[str | None, str]:
        from ._prompt import render

        system = render(self.system_t, scope) if self.system_t is not None else None
        prompt = render(self.prompt_t, scope)
        if self.schema is not None:
            hint = _SCHEMA_HINT + json.dumps(self.schema, ensure_ascii=False)
            system = f"{system}\n\n{hint}" if system else hint
        return system, prompt

    async def _opening(self, scope: dict[str, Any]
                       ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        from ._prompt import render_in_thread

        try:
            system, prompt = await render_in_thread(self._render, scope)
        except Exception as exc:  # a missing field, a sandbox violation
            raise AgentConfigError(f"node {self.name!r}: cannot render the prompt: "
                                   f"{type(exc).__name__}: {exc}") from None
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        note: dict[str, Any] = {"system": system, "prompt": prompt,
                                "tools": list(self.tools) or None}
        masked = [k for k in self.redact if k in scope and k != "config"]
        if masked:  # the log gets the prompts with the redacted fields' values masked
            try:
                note["system"], note["prompt"] = await render_in_thread(
                    self._render, {**scope, **dict.fromkeys(masked, REDACTED)})
            except Exception:  # the template needs the real value's shape
                note["system"] = note["prompt"] = REDACTED
        return messages, note

    def _request(self, messages: list[dict[str, Any]]) -> ChatRequest:
        response_format = None
        if self.schema is not None:
            response_format = {"type": "json_schema", "json_schema": {
                "name": re.sub(r"[^A-Za-z0-9_-]", "_", self.output_key)[:64],
                "schema": self.schema, "strict": False}}
        return ChatRequest(self.name, self.spec.model, [dict(m) for m in messages],
                           self.tool_schemas, response_format, self.spec.temperature)

    async def _call(self, ctx: Context, turn: int, messages: list[dict[str, Any]],
                    note: dict[str, Any]) -> Reply:
        request = self._request(messages)
        provider = self._provider(ctx)
        over: list[BudgetExceededError] = []
        sink = TOKEN_SINK.get() if self.streams else None
        if sink is not None:  # the reply's text goes to whoever shows it as it arrives
            run_id, node = ctx.run_id, self.name

            def delta(text: str) -> None:
                sink({"run_id": run_id, "node": node, "turn": turn, "text": text})

            request.on_delta = delta

        async def call() -> dict[str, Any]:
            request.index = _calls_made(ctx)
            request.item = ctx.item_index
            if request.item is not None:  # a mapped node's item: its own calls too
                request.item_call = _item_calls(ctx)
            await ctx.log("agent.request", self._hide({
                "turn": turn, "provider": self.spec.provider, "model": self.spec.model,
                "messages": len(request.messages), **note}))
            t0 = time.perf_counter()
            reply = await provider.complete(request)
            await ctx.log("agent.reply", self._hide({
                "turn": turn, "model": reply.model, "reply": reply.content,
                "tool_calls": [{"id": c.id, "name": c.name,
                                "arguments": _loads(c.arguments, self.redact)}
                               for c in reply.tool_calls] or None,
                "usage": reply.usage or None,
                "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}))
            if reply.tokens:
                try:  # charged inside the journaled step: a replay does not charge again
                    ctx.record_tokens(reply.tokens)
                except BudgetExceededError as exc:
                    over.append(exc)  # journal the reply (it was paid for), then stop
            return reply.to_json()

        if self.replayable:
            data = await ctx.once(f"llm-{turn}", call)
        else:  # not journaled, so not replayed: a re-run of the visit calls the model again
            data = await call()
            stub = self._hide({"redacted": sorted(self.redact & _REPLY_FIELDS),
                               "model": data.get("model"), "usage": data.get("usage") or None})
            await ctx.once(f"llm-{turn}-call-{_calls_made(ctx)}", _identity, stub)
        if over:
            raise over[0]
        return Reply.from_json(data)

    async def _tool(self, ctx: Context, turn: int, i: int, call: ToolCall
                    ) -> tuple[dict[str, Any], str | None]:
        """The tool message answering ``call``, and the arguments a human edited it to
        (JSON text; None when it ran -- or was refused -- as the model asked)."""
        key = f"tool-{turn}-{i}"
        if not self.replayable:  # a fresh reply may ask for another call: bind the key to it
            key += "-" + _digest(ctx.idempotency_key, call.name, call.arguments)
        refusable = "arguments" not in self.redact  # a refusal's text may quote them
        tool = self.tools.get(call.name)
        base = {"turn": turn, "tool": call.name, "call_id": call.id,
                **(tool.origin() if tool is not None else {})}
        text: str | dict[str, Any]  # a dict: a tool's handoff (goto)
        if tool is None:
            problem = (f"there is no tool {call.name!r}; the tools are: "
                       f"{', '.join(self.tools) or 'none'}")
            text = await _step(ctx, key, refusable, self._refuse, ctx, base, call, problem)
        else:
            try:
                kwargs, shown = tool.parse(call.arguments)
            except ToolArgumentsError as exc:
                text = await _step(ctx, key, refusable, self._refuse, ctx, base, call,
                                   str(exc))
            else:
                base["arguments"] = shown
                answer = "approved"
                if tool.confirm:
                    hidden = "arguments" in self.redact  # unseen arguments are not edited
                    show = {"tool": tool.name, "arguments": REDACTED if hidden else shown}
                    answer = ctx.confirm(key, show, edit=None if hidden else edit_schema(tool))
                if answer == "modified":
                    return await self._edited(ctx, key, base, tool, call)
                if answer != "approved":
                    comment = (ctx.decision(key) or {}).get("comment")
                    text = await ctx.once(key, self._rejected, ctx, base, comment)
                else:  # a redacted result is not journaled: a re-run runs the tool again
                    known = None
                    if tool.confirm and "result" not in self.redact:
                        known = await self._started(ctx, key, base, show)
                    text = known if known is not None else await _step(
                        ctx, key, "result" not in self.redact, self._execute, ctx, base,
                        tool, kwargs)
        return {"role": "tool", "tool_call_id": call.id, "content": text}, None

    async def _started(self, ctx: Context, key: str, base: dict[str, Any],
                       show: dict[str, Any]) -> str | None:
        """A guarded tool call about to run (SPEC §3: destructive actions are never
        repeated silently): its start is committed first; a call that had started in an
        earlier attempt and left no result in the log is not run again unasked -- the
        run waits at an ``unknown_outcome`` gate. The text the model gets when a person
        said it was not done (reject) or gave the outcome checked by hand (approve with
        data); None: run it (now, or again)."""
        if ctx.recorded(key)[0]:
            return None  # its result is in the log: replayed, never called again
        started, at = ctx.recorded(f"{key}-started")
        if not started:
            await ctx.once(f"{key}-started", _identity, round(time.time(), 6))
            return None
        ask = f"{key}-unknown"
        answer = ctx.confirm(ask, {**show, "started_at": at}, kind="unknown_outcome")
        said = ctx.decision(ask) or {}
        if answer != "approved":
            comment = said.get("comment") or ("its outcome was unknown (the process running "
                                              "it stopped) and a person recorded it as not "
                                              "done")
            text: str = await ctx.once(key, self._rejected, ctx, base, comment)
            return text
        data = said.get("data")
        if isinstance(data, dict) and "result" in data:  # the outcome checked by hand
            value = data["result"]
            await ctx.log("tool.called", self._hide({**base, "result": value,
                                                     "checked_by": said.get("by")}))
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            recorded: str = await ctx.once(key, _identity, text)
            return recorded
        return None  # approved: it runs again

    async def _edited(self, ctx: Context, key: str, base: dict[str, Any], tool: Tool,
                      call: ToolCall) -> tuple[dict[str, Any], str | None]:
        """Run ``call`` with the arguments a human edited it to (``modify``): the tool
        sees them, the model's conversation shows them, the log has both."""
        decision = ctx.decision(key) or {}
        arguments = json.dumps((decision.get("patch") or {}).get("arguments", {}),
                               ensure_ascii=False)
        base = {**base, "model_arguments": base.get("arguments"), "edited_by": decision.get("by")}
        try:
            kwargs, shown = tool.parse(arguments)
        except ToolArgumentsError as exc:  # the schema let it through, the signature did not
            problem = f"the reviewer's edited arguments do not fit the tool: {exc}"
            text = await _step(ctx, key, True, self._refuse, ctx, base,
                               ToolCall(call.id, call.name, arguments), problem)
        else:
            base["arguments"] = shown
            text = await _step(ctx, key, "result" not in self.redact, self._execute, ctx, base,
                               tool, kwargs)
        return {"role": "tool", "tool_call_id": call.id, "content": text}, arguments

    async def _execute(self, ctx: Context, base: dict[str, Any], tool: Tool,
                       kwargs: dict[str, Any]) -> str | dict[str, Any]:
        """Run the tool: its result as the text the model gets -- or, for a tool that
        returned ``interlock.goto``, the handoff (`_handoff`)."""
        t0 = time.perf_counter()
        try:
            d = self.delegates.get(tool.name)
            if d is not None:
                result = await d.run(ctx, base, kwargs)
            elif tool.takes_ctx:  # its own `once` keys and idempotency key, per call
                result = await tool.invoke({**kwargs, "ctx": self._tool_context(ctx, base)})
            else:
                result = await tool.invoke(kwargs)
        except ToolUnavailable:
            raise  # its server cannot be reached: the node fails, whatever tool_errors says
        except Exception as exc:
            # tool_errors: return -- the model gets the error as the tool's answer (and may
            # correct itself); raise -- the node fails with the tool's own exception (so
            # `retry.errors` can name it). The log says which call raised it either way.
            message = str(exc)[:2000]
            fields = {**base, "error": {"type": type(exc).__name__, "message":
                                        "withheld: redact" if "result" in self.redact
                                        else message}}
            if self.spec.tool_errors == "return":
                fields["returned"] = True  # to the model, as the tool's answer
            fields["duration_ms"] = round((time.perf_counter() - t0) * 1000, 3)
            await ctx.log("tool.called", self._hide(fields))
            if self.spec.tool_errors == "raise":
                raise
            return json.dumps({"error": f"{type(exc).__name__}: {message}"}, ensure_ascii=False)
        if isinstance(result, Goto):
            return await self._handoff(ctx, base, tool, result, t0)
        try:
            value = L.to_json_value(result)
        except TypeError as exc:
            raise AgentError(f"node {self.name!r}: tool {tool.name!r} returned a value that "
                             f"is not JSON data: {exc}") from None
        await ctx.log("tool.called", self._hide({
            **base, "result": value,
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}))
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    async def _handoff(self, ctx: Context, base: dict[str, Any], tool: Tool, result: Goto,
                       t0: float) -> dict[str, Any]:
        """A tool's ``interlock.goto(target)``: the turn ends and the node routes to
        ``target`` -- one of its ``choose`` targets, else the node fails, as a node's own
        goto would. Journaled as ``{"goto", "update"}`` (a tool's answer is otherwise text)."""
        if result.node not in self.choices:
            targets = ", ".join(self.choices) if self.choices else \
                f"none: declare {{from: {self.name}, choose: [...]}}"
            raise RouteError(f"node {self.name!r}: tool {tool.name!r} returned "
                             f"goto({result.node!r}); the node's choose targets are: {targets}",
                             node=self.name)
        try:
            update = L.to_json_value(dict(result.update or {}))
        except TypeError as exc:
            raise AgentError(f"node {self.name!r}: tool {tool.name!r} returned goto with an "
                             f"update that is not JSON data: {exc}") from None
        handoff = {"goto": result.node, "update": update}
        await ctx.log("tool.called", self._hide({
            **base, "result": handoff,
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}))
        return handoff

    async def _rejected(self, ctx: Context, base: dict[str, Any], comment: str | None) -> str:
        fields = {**base, "comment": comment} if comment else dict(base)
        await ctx.log("tool.rejected", self._hide(fields))
        if comment:  # the reviewer's feedback reaches the model with the refusal
            return _REJECTED_WITH.format(tool=base["tool"], comment=comment)
        return _REJECTED.format(tool=base["tool"])

    async def _refuse(self, ctx: Context, base: dict[str, Any], call: ToolCall,
                      problem: str) -> str:
        answer = json.dumps({"error": problem}, ensure_ascii=False)
        if "arguments" in self.redact:
            problem = "the arguments do not fit the tool (details withheld: redact)"
        await ctx.log("tool.called", self._hide({
            **base, "arguments": _loads(call.arguments, frozenset()), "problem": problem}))
        return answer

    async def _give_up(self, ctx: Context, failures: int, next_turn: int,
                       exc: AgentError) -> None:
        """End this conversation for good: the next attempt starts a fresh one."""
        await ctx.once(f"agent-failed-{failures}", _identity,
                       {"next_turn": next_turn, "error": str(exc)})
        raise exc

    # -- the reply ------------------------------------------------------------------------

    def _check(self, content: str | None) -> tuple[Any, str | None]:
        """The reply as the node's output, or why it is not acceptable."""
        if self.validator is None and self.model_cls is None:
            return _as_object(content or ""), None
        text = _unfence(content or "")
        try:
            data = json.loads(text)
        except ValueError as exc:
            return None, f"the reply is not a JSON document ({exc}): {_clip(text)!r}"
        if self.validator is not None:
            errors = sorted(self.validator.iter_errors(data), key=lambda e: list(e.path))
            if errors:
                return None, "; ".join(f"at {e.json_path}: {e.message}" for e in errors[:5])
        if self.model_cls is not None:
            try:
                data = self.model_cls.model_validate(data).model_dump(mode="json")
            except ValidationError as exc:
                return None, "; ".join(
                    f"at $.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                    for e in exc.errors(include_url=False)[:5])
        return data, None

    def _shown_problem(self, problem: str) -> str:
        """A schema problem as the log may show it (its details quote the reply)."""
        if "reply" in self.redact:
            return "details withheld (redact: reply)"
        return problem

    def _hide(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A log record's fields without the ones ``redact:`` names (``arguments`` covers
        the model's own, ``model_arguments``, beside a human's edit)."""
        return {k: v for k, v in fields.items() if k not in self.redact
                and not (k == "model_arguments" and "arguments" in self.redact)}


def edit_schema(tool: Tool) -> dict[str, Any]:
    """What a human's edit of a call to ``tool`` must be: ``{"arguments": {...}}`` with
    arguments that fit its parameters (the JSON Schema of its signature)."""
    params = dict(tool.parameters)
    defs = params.pop("$defs", None)  # its $refs point at the root: keep them there
    schema: dict[str, Any] = {"type": "object", "properties": {"arguments": params},
                              "required": ["arguments"], "additionalProperties": False}
    if defs is not None:
        schema["$defs"] = defs
    return schema


def _restart_point(ctx: Context) -> tuple[int, int]:
    """(conversations that failed for good in this visit, the turn the next one starts at)."""
    failures = turn = 0
    while True:
        found, value = ctx.recorded(f"agent-failed-{failures}")
        if not found:
            return failures, turn
        turn = int(value.get("next_turn", turn)) if isinstance(value, dict) else turn
        failures += 1


def _calls_made(ctx: Context) -> int:
    """Model calls this node made in this run so far (every visit), from the journal."""
    return sum(1 for key in ctx.effect_keys() if key.startswith("llm-"))


def _item_calls(ctx: Context) -> int:
    """Model calls a mapped node's item made in this visit so far (from its journal)."""
    n = 0
    while ctx.recorded(f"llm-{n}")[0]:
        n += 1
    return n


def _assistant(reply: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in reply.tool_calls]
    return msg


def _identity(value: Any) -> Any:
    return value


async def _step(ctx: Context, key: str, journal: bool, fn: Callable[..., Any],
                *args: Any) -> Any:
    """``fn(*args)`` through the journal (``ctx.once``), or, when its result may not be
    journaled, directly -- and so again on every re-run of the visit."""
    if journal:
        return await ctx.once(key, fn, *args)
    return await fn(*args)


def _digest(salt: str, name: str, arguments: str) -> str:
    """A short digest of one tool call (name + arguments, as canonical JSON where they
    parse), salted with the visit."""
    with contextlib.suppress(ValueError):
        arguments = json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    h = hashlib.sha256("\0".join((salt, name, arguments)).encode())
    return h.hexdigest()[:16]


def _loads(arguments: str, redact: frozenset[str]) -> Any:
    if "arguments" in redact:
        return REDACTED
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)


def _as_object(text: str) -> Any:
    """A reply without an ``output`` schema: a JSON object (fenced or not) is kept as the
    object, so ``{{ node.field }}`` and ``node.field`` in a condition read it; any other
    text -- a number, ``true``, a list, prose -- stays the text the model wrote."""
    body = _unfence(text).strip()
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except ValueError:
            return text
        if isinstance(data, dict):
            return data
    return text


def _unfence(text: str) -> str:
    """A JSON document a model wrapped in a Markdown code fence, unwrapped."""
    m = _FENCE.match(text)
    return m.group(1) if m else text


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."
