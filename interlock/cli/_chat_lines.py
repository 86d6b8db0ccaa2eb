"""What a line typed into ``interlock chat`` means (local and ``--server`` alike).

A line is a message to the agent, unless it starts with ``/``: then it is one of the
session's commands -- ``/end`` (a message the agent takes as the conversation's end),
``/approve [COMMENT]`` and ``/reject [COMMENT]`` (the decision of the gate that waits).
A slash word that is not a command (``/aprove``), or a decision with no gate waiting, is
answered here and neither sent to the model nor recorded: a typo must not become part
of the conversation (and of what ``recall`` finds later). ``//text`` sends the literal
``/text``.
"""

from __future__ import annotations

import asyncio
import difflib
import sys
import threading
from dataclasses import dataclass

END = "/end"
DECISIONS = ("/approve", "/reject")
COMMANDS = (END, *DECISIONS)


@dataclass(frozen=True)
class Line:
    """A typed line: ``send`` (a message's text), ``decide`` (``approve`` or ``reject``,
    with ``text`` the comment, or None), or ``say`` (what to tell the person instead;
    nothing is sent)."""

    action: str
    text: str | None = None
    decision: str = ""


def read_line(line: str, gate_waits: bool) -> Line | None:
    """The meaning of ``line`` while the conversation waits for a message (or, with
    ``gate_waits``, for a decision); None for a blank line."""
    text = line.strip()
    if not text:
        return None
    if text.startswith("//"):  # a message that starts with a slash
        literal = text[1:]
        if gate_waits:
            return Line("say", _gate_waits())
        return Line("send", literal)
    word, _, rest = text.partition(" ")
    if word in DECISIONS:
        if not gate_waits:
            return Line("say", f"no gate waits: {word} decides a gate the turn reached; "
                               "nothing was sent (to send the text itself, start it with //)")
        return Line("decide", rest.strip() or None, word[1:])
    if word.startswith("/") and word != END:  # (a typo while a gate waits too: said so)
        close = difflib.get_close_matches(word.lower(), COMMANDS, n=1, cutoff=0.6)
        guess = f" (did you mean {close[0]}?)" if close else ""
        then = (f"; {_gate_waits()}" if gate_waits else
                f"; to send a message that starts with /, type //{word[1:]}")
        return Line("say", f"unknown command {word}{guess}: nothing was sent; the commands "
                           f"are {', '.join(COMMANDS)}{then}")
    if gate_waits:
        return Line("say", _gate_waits())
    return Line("send", text)


def _gate_waits() -> str:
    return "a gate waits: /approve [COMMENT] or /reject [COMMENT]"


class Lines:
    """Standard input's lines as they are typed, read by a daemon thread into a queue on
    the event loop -- so that the loop can show what happens meanwhile, and a session that
    ends while the person has typed nothing does not wait for them (a thread blocked in
    ``readline`` would keep `asyncio.run` from returning). None: standard input ended."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        stdin = sys.stdin  # (the one of this session: a test's runner swaps it)

        def read() -> None:
            try:
                while True:
                    line = stdin.readline()
                    loop.call_soon_threadsafe(self.queue.put_nowait, line or None)
                    if not line:
                        return
            except (RuntimeError, ValueError, OSError):  # the loop or the file closed
                return

        threading.Thread(target=read, daemon=True,
                         name="interlock chat: standard input").start()

    async def get(self) -> str | None:
        return await self.queue.get()


__all__ = ["COMMANDS", "Line", "Lines", "read_line"]
