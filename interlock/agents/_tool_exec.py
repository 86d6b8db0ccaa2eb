"""An agent's tool executed: its result as the model's answer (journaled, or not when
``redact: [result]``), its error (``tool_errors``), its handoff (``goto``), a call refused."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _log as L
from .._engine._context import Goto
from .._errors import RouteError
from ._agent_setup import REDACTED, AgentSetup
from ._errors import AgentError, ToolUnavailable
from ._providers import ToolCall
from ._tools import Tool

if TYPE_CHECKING:
    from .._engine._context import Context


async def _step(ctx: Context, key: str, journal: bool, fn: Callable[..., Any],
                *args: Any) -> Any:
    """``fn(*args)`` through the journal (``ctx.once``), or, when its result may not be
    journaled, directly -- and so again on every re-run of the visit."""
    if journal:
        return await ctx.once(key, fn, *args)
    return await fn(*args)


def _loads(arguments: str, redact: frozenset[str]) -> Any:
    if "arguments" in redact:
        return REDACTED
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class ToolExecution(AgentSetup):
    """Running an agent's tool and logging what it did (`tool.called`)."""

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

    async def _refuse(self, ctx: Context, base: dict[str, Any], call: ToolCall,
                      problem: str) -> str:
        answer = json.dumps({"error": problem}, ensure_ascii=False)
        if "arguments" in self.redact:
            problem = "the arguments do not fit the tool (details withheld: redact)"
        await ctx.log("tool.called", self._hide({
            **base, "arguments": _loads(call.arguments, frozenset()), "problem": problem}))
        return answer
