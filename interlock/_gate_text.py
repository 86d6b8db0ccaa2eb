"""What people are told about a waiting gate, in the same words wherever they look: the
CLI's ``status``, ``runs --waiting`` and decide-with hints, ``interlock chat``, the API's
approval rows and the dashboard's gate cards, the MCP tools' answers and questions, the
Slack and Google Chat messages and ``--notify``'s webhook messages.

An ``unknown_outcome`` gate is a destructive action (a ``confirm: true`` node, a map item
of one, a guarded tool call) that was approved and started, whose process died before its
outcome was recorded: it may or may not have happened. Approving it runs it AGAIN,
rejecting it records it as not done, and approving with ``{"result": ...}`` as data records
the outcome a person checked by hand (it is not run again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

UNKNOWN = "unknown_outcome"


def utc(ts: object) -> str:
    """An epoch time as a readable UTC time (``2026-12-05 04:14:58 UTC``)."""
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return "at an unrecorded time"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def is_unknown(waiting: Mapping[str, Any]) -> bool:
    return waiting.get("kind") == UNKNOWN


def _show(waiting: Mapping[str, Any]) -> Mapping[str, Any]:
    show = waiting.get("show")
    return show if isinstance(show, Mapping) else {}


def action(waiting: Mapping[str, Any]) -> str:
    """What ran: ``tool 'wipe' (in node 'a')``, ``node 'fix'``, ``item 'deploy[2]'``."""
    show, node = _show(waiting), waiting.get("node")
    if show.get("tool") is not None:
        return f"tool {show['tool']!r} (called by node {node!r})"
    what = show.get("action") or node
    return f"item {what!r}" if "[" in str(what) else f"node {what!r}"


def data_example(waiting: Mapping[str, Any]) -> str:
    """The ``--data`` that records the outcome checked by hand: a tool's return value, or
    a node's state update (a JSON object of fields)."""
    if _show(waiting).get("tool") is not None:
        return '{"result": "WHAT THE TOOL RETURNED"}'
    return '{"result": {"FIELD": "VALUE"}}'


def shown(waiting: Mapping[str, Any]) -> dict[str, Any]:
    """The gate's ``show`` for people: an unknown outcome's ``started_at`` as UTC time."""
    show = dict(_show(waiting))
    if is_unknown(waiting) and "started_at" in show:
        show["started_at"] = utc(show["started_at"])
    return show


def unknown_lines(waiting: Mapping[str, Any], *, data: str = "") -> list[str]:
    """An ``unknown_outcome`` gate explained: what ran with which arguments and when, and
    what each decision does. ``data``: how this surface approves with data (a CLI
    option); by default the words the API and dashboard use."""
    show = _show(waiting)
    attempt = show.get("attempt")
    started = utc(show.get("started_at")) + (f", attempt {attempt}" if attempt else "")
    args = json.dumps(show.get("arguments") or {}, ensure_ascii=False, sort_keys=True)
    data = data or f"approve with data {data_example(waiting)}"
    return [f"OUTCOME UNKNOWN: {action(waiting)} was approved and started ({started}), and "
            "the process running it died before its outcome was recorded: it may or may "
            "not have happened",
            f"arguments: {args}",
            "approve: runs it AGAIN (check first that it did not happen)",
            "reject: records it as not done (it is not run again)",
            f"{data}: records the outcome you checked by hand (it is not run again)"]


def headline(waiting: Mapping[str, Any]) -> str:
    """An ``unknown_outcome`` gate in one line, where there is room for one (a message's
    first line, a task's status): what may or may not have happened, and that approving
    runs it again."""
    return (f"OUTCOME UNKNOWN: {action(waiting)} may or may not have happened (its process "
            "died while it ran); approving runs it AGAIN")


def outcome_info(waiting: Mapping[str, Any]) -> dict[str, Any] | None:
    """An ``unknown_outcome`` gate for the API and the dashboard (None for another
    gate): what ran, with which arguments, when (UTC), the explanation, and the data
    an approve takes to record the outcome checked by hand."""
    if not is_unknown(waiting):
        return None
    show = _show(waiting)
    return {"action": action(waiting), "arguments": show.get("arguments") or {},
            "started_at": utc(show.get("started_at")), "explain": unknown_lines(waiting),
            "data_example": json.loads(data_example(waiting))}


def deadline_passed(waiting: Mapping[str, Any], now: float | None = None) -> bool:
    """The gate's deadline passed undecided: a decision is refused, and a plain resume
    applies its ``on_timeout``."""
    deadline = waiting.get("deadline")
    return isinstance(deadline, int | float) and not isinstance(deadline, bool) \
        and deadline <= (time.time() if now is None else now)


def passed_line(waiting: Mapping[str, Any], resume: str) -> str:
    """What to do about a gate past its deadline (``resume``: the command that works)."""
    return (f"{waiting.get('node')!r} passed its deadline ({utc(waiting.get('deadline'))}) "
            f"undecided: a decision is refused now; `{resume}` applies its on_timeout")
