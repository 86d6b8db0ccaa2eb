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


class TurnFailed(Exception):
    """A turn of the conversation hit a limit of its own (``max_turns``, a tool's handoff):
    the turn ends with the error as its reply (``chat.reply {error}``, ``waiting.show.
    turn_error``) and the conversation waits for the next message. ``turn``: the model
    calls made so far, over the whole conversation. The conversation's own limits
    (``limits:``, the node's ``tokens``) are not turn limits: they end the run."""

    def __init__(self, turn: int, error: Exception) -> None:
        super().__init__(str(error))
        self.turn, self.error = turn, error


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
        # the first turn replayed (those before it fall out of the window), the model
        # calls so far (over the whole conversation: the journal's keys), the last reply
        n, turn, last = self._resume_point(ctx)
        error: str | None = None  # why the last turn failed
        while True:
            message = ctx.decision(message_key(n))
            if message is None:
                show: dict[str, Any] = {"turn": n, "last_reply": last}
                if error is not None:  # the turn before failed (the conversation goes on)
                    show = {"turn": n, "last_reply": None, "turn_error": error}
                raise PauseRequested(message_key(n), show, decisions=["message"],
                                     kind="message")
            text = str(message.get("text") or "")
            if text.strip() == END_COMMAND:
                return {self.output_key: last}
            if not ctx.recorded(f"reply-{n}")[0]:  # the turn to answer (not one replayed)
                _within_steps(ctx, n)
            base = len(transcript)
            transcript.append({"role": "user", "content": text})
            error = None
            try:
                turn, last, ended = await self._turn(ctx, n, turn, system, transcript, last,
                                                     base)
            except TurnFailed as failed:  # the turn's own limit: its reply is the error
                turn, ended, error = failed.turn, False, str(failed.error)
                _answered(transcript)
                await ctx.once(f"reply-{n}", self._log_reply, ctx, n, None,
                               self._mark(turn, len(transcript) - base, last), error)
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

    def _resume_point(self, ctx: Context) -> tuple[int, int, str | None]:
        """Where this run of the visit starts replaying: the first turn whose messages are
        in the window (``history``), the model calls made before it and the reply before
        it -- from the marks the turns before left (``reply-N``: its model calls, its
        messages, the last reply), read back from the latest turn only as far as the
        window reaches, so a turn's cost does not grow with the conversation. (0, 0, None)
        -- the whole conversation replayed -- where the marks are not there (a log
        written before them) or the replies are not journaled (``redact: [reply]``)."""
        if not self.replayable or not ctx.recorded("reply-0")[0]:
            return 0, 0, None
        j, count = _last_reply(ctx), 0
        while j >= 0 and count < self.spec.history:
            mark = ctx.recorded(f"reply-{j}")[1]
            if not isinstance(mark, dict) or not isinstance(mark.get("messages"), int):
                return 0, 0, None
            count += mark["messages"]
            j -= 1
        if j < 0:
            return 0, 0, None
        mark = ctx.recorded(f"reply-{j}")[1]
        if not isinstance(mark, dict) or not isinstance(mark.get("turn"), int):
            return 0, 0, None
        return j + 1, mark["turn"], mark.get("last")

    def _mark(self, turn: int, messages: int, last: str | None) -> dict[str, Any] | None:
        """What a turn's ``reply-N`` journals for `_resume_point` (None when replies are
        not journaled: they are redacted)."""
        if not self.replayable:
            return None
        return {"turn": turn, "messages": messages, "last": last}

    async def _turn(self, ctx: Context, n: int, turn: int, system: str | None,
                    transcript: list[dict[str, Any]], last: str | None, base: int
                    ) -> tuple[int, str | None, bool]:
        """One turn: model calls and tool calls until a reply in text. Returns the model
        calls made so far, the reply, and whether the conversation ended. ``base``: the
        transcript's length before the turn's message."""
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
                await ctx.once(f"reply-{n}", self._log_reply, ctx, n, last,
                               self._mark(turn, len(transcript) - base, last))
                return turn, last, False
            if calls >= self.spec.max_turns:
                raise TurnFailed(turn, AgentTurnsError(
                    f"node {self.name!r}: message {n + 1} of the conversation: the model "
                    f"asked for tools again after max_turns={self.spec.max_turns} model "
                    "calls without a reply; the turn failed, the conversation goes on "
                    "(send the next message; raise the agent's max_turns for longer "
                    "turns)"))
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
                        raise TurnFailed(turn, AgentTurnsError(
                            f"node {self.name!r}: a conversation's tool cannot hand off "
                            "(goto); end the conversation with end_conversation instead"))
                    if edited is not None:
                        asked["tool_calls"][i]["function"]["arguments"] = edited
                transcript.append(answer)
            if ended:
                if reply.content:
                    await ctx.once(f"reply-{n}", self._log_reply, ctx, n, last,
                                   self._mark(turn, len(transcript) - base, last))
                return turn, last, True

    async def _log_reply(self, ctx: Context, n: int, text: str | None,
                         mark: dict[str, Any] | None, error: str | None = None
                         ) -> dict[str, Any] | int:
        data: dict[str, Any] = {"message": n, "reply": text}
        if error is not None:
            data["turn_error"] = error
        await ctx.log("chat.reply", self._hide(data))
        return n if mark is None else {"message": n, **mark}

    async def _log_end(self, ctx: Context, turn: int, call_id: str) -> str:
        await ctx.log("tool.called", {"turn": turn, "tool": END_TOOL, "call_id": call_id,
                                      "result": "ended"})
        return json.dumps("ended")


def _within_steps(ctx: Context, n: int) -> None:
    """Refuse message ``n``'s turn when its step crossed the run's ``limits.steps``: each
    turn is a step (the first is the node's visit, each later one is counted with its
    message, `_ops._messages`), so the limit covers a conversation that only talks as
    it does one whose tools start child runs. The run fails as at any limit; a resume
    with a higher limit answers the message."""
    from .._errors import StepLimitError
    from .._plugins._subflow import CHILD_RUNS

    host = CHILD_RUNS.get()
    if host is None:  # (no run executing the agent: nothing counts its steps)
        return
    steps, limit = host.steps()
    if limit is not None and steps > limit:
        raise StepLimitError(
            f"run {ctx.run_id!r}: the conversation reached limits.steps={limit} before "
            f"message {n + 1} could be answered (each turn is a step, and the child runs "
            f"its tools start count theirs); a resume that raises the limit (--set "
            "limits.steps=N) answers it", node=ctx.node, limit=limit, used=steps)


def _answered(transcript: list[dict[str, Any]]) -> None:
    """The transcript of a failed turn without its last tool round when some of that
    round's calls were not answered (a provider refuses a call without its answer); the
    rounds before, answered, stay: the model knows what its tools did."""
    for i in range(len(transcript) - 1, -1, -1):
        m = transcript[i]
        if m["role"] == "assistant" and m.get("tool_calls"):
            answered = {a.get("tool_call_id") for a in transcript[i + 1:]}
            if any(c["id"] not in answered for c in m["tool_calls"]):
                del transcript[i:]
            return
        if m["role"] == "user":
            return


def _last_reply(ctx: Context) -> int:
    """The latest turn that ended (its ``reply-N`` is journaled; ``reply-0`` is), found in
    O(log N) lookups: the turns that ended are 0..N, each with its ``reply-N``."""
    lo, hi = 0, 1
    while ctx.recorded(f"reply-{hi}")[0]:  # reply-lo recorded, reply-hi not
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ctx.recorded(f"reply-{mid}")[0]:
            lo = mid
        else:
            hi = mid
    return lo
