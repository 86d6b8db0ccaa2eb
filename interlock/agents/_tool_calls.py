"""One tool call an agent's model asked for, answered: parsed, asked of a human first for
a guarded tool (approved, edited, rejected), its start committed and an unknown outcome
asked about, journaled under a key bound to the call when the reply is not journaled."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from ._agent_setup import REDACTED, _identity
from ._providers import ToolCall
from ._tool_exec import ToolExecution, _step
from ._tools import Tool, ToolArgumentsError

if TYPE_CHECKING:
    from .._engine._context import Context


_REJECTED = ("A human reviewer rejected this call to {tool}; it was not executed. Do not "
             "call it again for this; carry on without it.")
_REJECTED_WITH = ("A human reviewer rejected this call to {tool}; it was not executed. The "
                  "reviewer's comment: {comment}")


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


def _digest(salt: str, name: str, arguments: str) -> str:
    """A short digest of one tool call (name + arguments, as canonical JSON where they
    parse), salted with the visit."""
    with contextlib.suppress(ValueError):
        arguments = json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    h = hashlib.sha256("\0".join((salt, name, arguments)).encode())
    return h.hexdigest()[:16]


class ToolCalls(ToolExecution):
    """A model's tool call answered, a human asked first when the tool is guarded."""

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
        """A guarded tool call about to run (destructive actions are never
        repeated silently): its start is committed first; a call that had started in an
        earlier attempt and left no result in the log is not run again unasked -- the
        run waits at an ``unknown_outcome`` gate. The text the model gets when a person
        said it was not done (reject) or gave the outcome checked by hand (approve with
        data); None: run it (now, or again)."""
        if ctx.recorded(key)[0]:
            return None  # its result is in the log: replayed, never called again
        # Each run of the call has its start committed under a key of its own, and each
        # unknown outcome is asked under one: the first ``KEY-started``/``KEY-unknown``,
        # the run a person approved after it ``KEY-started-1``/``KEY-unknown-1``, and so
        # on -- so a re-run that is interrupted too is asked about again, never repeated
        # on the strength of the earlier approval.
        n = 0
        while True:
            suffix = f"-{n}" if n else ""
            started, at = ctx.recorded(f"{key}-started{suffix}")
            if not started:
                await ctx.once(f"{key}-started{suffix}", _identity, round(time.time(), 6))
                return None  # run it: the first time, or again as a person approved
            ask = f"{key}-unknown{suffix}"
            answer = ctx.confirm(ask, {**show, "started_at": at}, kind="unknown_outcome")
            said = ctx.decision(ask) or {}
            if answer != "approved":
                return await self._not_done(ctx, key, base, said)
            data = said.get("data")
            if isinstance(data, dict) and "result" in data:  # the outcome checked by hand
                value = data["result"]
                await ctx.log("tool.called", self._hide({**base, "result": value,
                                                         "checked_by": said.get("by")}))
                text = value if isinstance(value, str) else json.dumps(value,
                                                                       ensure_ascii=False)
                recorded: str = await ctx.once(key, _identity, text)
                return recorded
            n += 1  # approved: it runs again, under a start of its own

    async def _not_done(self, ctx: Context, key: str, base: dict[str, Any],
                        said: dict[str, Any]) -> str:
        """A call with an unknown outcome a person recorded as not done: what the model
        is told (journaled as the call's result)."""
        comment = said.get("comment") or ("its outcome was unknown (the process running "
                                          "it stopped) and a person recorded it as not done")
        text: str = await ctx.once(key, self._rejected, ctx, base, comment)
        return text

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

    async def _rejected(self, ctx: Context, base: dict[str, Any], comment: str | None) -> str:
        fields = {**base, "comment": comment} if comment else dict(base)
        await ctx.log("tool.rejected", self._hide(fields))
        if comment:  # the reviewer's feedback reaches the model with the refusal
            return _REJECTED_WITH.format(tool=base["tool"], comment=comment)
        return _REJECTED.format(tool=base["tool"])
