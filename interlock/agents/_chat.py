"""A conversation's agent: the node a ``chat:`` file names.

One visit of the node is the whole conversation. Its body, each time it runs::

    transcript = []
    for n = 0, 1, ...:
        message n in the journal?  no -> pause: the run waits for it (WAITING_INPUT,
                                         waiting.kind "message"); `_ops._messages.send`
                                         journals it and the visit runs again
        "/end"                     -> the conversation ends (the node completes)
        a turn: the model gets the system prompt and the last `history` messages of
        the transcript; tool calls are run and answered, as an agent node's are, until
        it replies in text (``chat.reply``) -- or calls ``end_conversation``

Every model call (``llm-K``), tool call (``tool-K-I``) and message (``decision:message-N``)
is journaled in the visit, and K counts model calls over the whole conversation: so each
re-run replays the turns before from the log -- the transcript is rebuilt from it, not kept
anywhere else -- and a turn interrupted by a crash resumes where it was, completed tool
calls and child runs not done again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._engine._context import PauseRequested
from ._delegates import DelegatingAgent, _data_tool
from ._errors import AgentTurnsError
from ._node import _assistant
from ._tools import Tool

if TYPE_CHECKING:
    from .._engine._context import Context

END_TOOL = "end_conversation"
END_COMMAND = "/end"


def message_key(n: int) -> str:
    """The journal key of a conversation's message ``n`` (from 0)."""
    return f"message-{n}"


def _end_tool() -> Tool:
    return _data_tool(END_TOOL, "End the conversation: call it when the user is done (say "
                      "goodbye in your reply's text first).", {})


class ChatAgent(DelegatingAgent):
    """The agent of a conversation (``chat: NODE``)."""

    def _more_tools(self, tools: dict[str, Tool]) -> None:
        tools[END_TOOL] = _end_tool()
        if self.spec.recall:
            from ._recall import RecallTool

            recall = RecallTool()
            tools[recall.tool.name] = recall.tool
            self.delegates[recall.tool.name] = recall
        self.streams = "reply" not in self.redact  # (a redacted reply is shown to nobody)

    async def run(self, state: dict[str, Any], ctx: Context) -> Any:
        self._prepare()
        scope = {**state, "config": dict(ctx.config)}
        system = await self._system(scope)
        transcript: list[dict[str, Any]] = []
        turn = 0  # model calls so far, over the whole conversation (the journal's keys)
        last: str | None = None
        n = 0
        while True:
            message = ctx.decision(message_key(n))
            if message is None:
                raise PauseRequested(message_key(n), {"turn": n, "last_reply": last},
                                     decisions=["message"], kind="message")
            text = str(message.get("text") or "")
            if text.strip() == END_COMMAND:
                return {self.output_key: last}
            transcript.append({"role": "user", "content": text})
            turn, last, ended = await self._turn(ctx, n, turn, system, transcript, last)
            if ended:
                return {self.output_key: last}
            n += 1

    async def _system(self, scope: dict[str, Any]) -> str | None:
        from ._prompt import render, render_in_thread

        if self.system_t is None:
            return None
        template = self.system_t
        return await render_in_thread(render, template, scope)

    def _window(self, system: str | None, transcript: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
        """The system prompt and the last ``history`` messages -- starting after a tool's
        answer whose call fell out of the window (a provider refuses one without it)."""
        recent = transcript[-self.spec.history:]
        while recent and recent[0]["role"] == "tool":
            recent = recent[1:]
        head = [{"role": "system", "content": system}] if system else []
        return head + recent

    async def _turn(self, ctx: Context, n: int, turn: int, system: str | None,
                    transcript: list[dict[str, Any]], last: str | None
                    ) -> tuple[int, str | None, bool]:
        """One turn: model calls and tool calls until a reply in text. Returns the model
        calls made so far, the reply, and whether the conversation ended."""
        calls = 0
        while True:
            note = {"message": n, "history": self.spec.history,
                    "tools": list(self.tools) or None}
            reply = await self._call(ctx, turn, self._window(system, transcript), note)
            turn += 1
            calls += 1
            if reply.content:
                last = reply.content
            if not reply.tool_calls:
                transcript.append(_assistant(reply))
                await ctx.once(f"reply-{n}", self._log_reply, ctx, n, last)
                return turn, last, False
            if calls >= self.spec.max_turns:
                raise AgentTurnsError(
                    f"node {self.name!r}: message {n + 1} of the conversation: the model "
                    f"asked for tools again after max_turns={self.spec.max_turns} model "
                    "calls without a reply; raise the agent's max_turns")
            asked = _assistant(reply)
            transcript.append(asked)
            ended = False
            for i, call in enumerate(reply.tool_calls):
                if call.name == END_TOOL:
                    ended = True
                    answer = {"role": "tool", "tool_call_id": call.id,
                              "content": "The conversation has ended."}
                    await ctx.once(f"tool-{turn - 1}-{i}", self._log_end, ctx, turn - 1, call.id)
                else:
                    answer, edited = await self._tool(ctx, turn - 1, i, call)
                    if isinstance(answer["content"], dict):
                        raise AgentTurnsError(f"node {self.name!r}: a conversation's tool "
                                              "cannot hand off (goto); end the conversation "
                                              "with end_conversation instead")
                    if edited is not None:
                        asked["tool_calls"][i]["function"]["arguments"] = edited
                transcript.append(answer)
            if ended:
                if reply.content:
                    await ctx.once(f"reply-{n}", self._log_reply, ctx, n, last)
                return turn, last, True

    async def _log_reply(self, ctx: Context, n: int, text: str | None) -> int:
        await ctx.log("chat.reply", self._hide({"message": n, "reply": text}))
        return n

    async def _log_end(self, ctx: Context, turn: int, call_id: str) -> str:
        await ctx.log("tool.called", {"turn": turn, "tool": END_TOOL, "call_id": call_id,
                                      "result": "ended"})
        return json.dumps("ended")
