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

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .._definition._model import NodeSpec, WorkflowSpec
from .._engine._context import Goto, goto
from .._engine._guards import BudgetExceededError
from ._agent_setup import _REPLY_FIELDS, REDACTED, _identity
from ._errors import AgentConfigError, AgentError, AgentOutputError, AgentTurnsError
from ._providers import TOKEN_SINK, ChatRequest, RepliesExhausted, Reply
from ._spec import AgentSpec
from ._tool_calls import ToolCalls
from ._tool_exec import _loads

if TYPE_CHECKING:
    from .._engine._context import Context

AgentFn = Callable[[dict[str, Any], "Context"], Awaitable[Any]]

_SCHEMA_HINT = ("Reply with only a JSON document (no prose, no code fences) that satisfies "
                "this JSON Schema:\n")
_REPAIR = ("Your reply does not satisfy the required JSON Schema: {problem}\n"
           "Reply again with only a corrected JSON document.")


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


class _Agent(ToolCalls):
    """One visit of an agent node: the turn loop, its model calls and its reply checked
    (its set-up, tool calls and confirmations are its bases')."""

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
                handoff = await self._answer(ctx, turn, reply, messages)
                if handoff is not None:
                    return handoff
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

    async def _answer(self, ctx: Context, turn: int, reply: Reply,
                      messages: list[dict[str, Any]]) -> Goto | None:
        """Answer the reply's tool calls: the reply and each call's answer appended to
        ``messages``; a tool's handoff (``goto``) ends the turn and is returned."""
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
        return None

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
