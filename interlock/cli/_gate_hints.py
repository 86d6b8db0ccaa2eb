"""The lines the CLI adds about a waiting gate where it says how to decide it (``status``,
``run``/``resume``, ``runs --waiting``, ``interlock chat``): an unknown outcome explained,
a gate past its deadline resumed instead of decided, a branch whose executor is gone.
The words are `interlock.support.gate_text`'s, which the server's approval rows use too."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType


def _text() -> ModuleType:
    from ..support import gate_text  # (imported when used: the CLI starts fast)

    return gate_text


def is_unknown(w: dict[str, Any]) -> bool:
    """An ``unknown_outcome`` gate: approving it runs a destructive action again."""
    return w.get("kind") == "unknown_outcome"


def shown(w: dict[str, Any]) -> dict[str, Any]:
    """The gate's ``show`` as people read it (an unknown outcome's start as UTC time)."""
    show: dict[str, Any] = _text().shown(w)
    return show


def data_example(w: dict[str, Any]) -> str:
    """The ``--data`` of an unknown outcome's approval that records it checked by hand."""
    example: str = _text().data_example(w)
    return example


def outcome_notes(w: dict[str, Any]) -> list[str]:
    """An ``unknown_outcome`` gate's explanation (none for another gate)."""
    if not is_unknown(w):
        return []
    lines: list[str] = _text().unknown_lines(w, data=f"--approve --data '{data_example(w)}'")
    return lines


def past_deadline(run_id: str, w: dict[str, Any], where: str) -> str | None:
    """The one command that works for a gate past its deadline (a decision is refused)."""
    if w.get("deadline") is None or not _text().deadline_passed(w):
        return None
    line: str = _text().passed_line(w, f"interlock resume {run_id}{where}")
    return line


def beside(running: list[Any], run_id: str, where: str, live: bool | None) -> str:
    """The run's other branches beside its gates: at work, or interrupted (no process
    holds the run's lease: its executor died; None: not known, a server's client)."""
    names = ", ".join(map(str, running)) or "-"
    if live is not False:
        return (f"still running beside the gate: {names} (its executor continues a decided "
                "gate's branch at once)")
    return (f"interrupted beside the gate: {names} (no process is executing the run: its "
            f"executor stopped); continue it with `interlock resume {run_id}{where}` (the "
            "gates keep waiting)")


def chat_outcome_lines(run_id: str, w: dict[str, Any], where: str) -> list[str]:
    """``interlock chat``'s words for an ``unknown_outcome`` gate: the gate's ``show``
    as people read it, then what happened and what ``/approve`` and ``/reject`` do, and
    the command that records the outcome checked by hand (none for another gate)."""
    if not is_unknown(w):
        return []
    data = (f"`interlock resume {run_id} --gate {w.get('node')} --approve --data "
            f"'{data_example(w)}'{where}`")
    lines: list[str] = _text().unknown_lines(w, data=data)
    lines[2:4] = ["/approve: runs it AGAIN (check first that it did not happen)",
                  "/reject: records it as not done (it is not run again)"]
    return [json.dumps(shown(w), ensure_ascii=False), *lines]


def code_drift(nodes: list[str]) -> str:
    """The nodes still to run whose code changed since the run started (`status`)."""
    return (f"code changed since the run started: {', '.join(nodes)} (a continuation, a "
            "decision's included, runs them on the code as it is now and records "
            "run.code_changed; --strict-code refuses)")
