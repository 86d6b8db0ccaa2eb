"""How values and records are put into words: durations, ages, short JSON, the style of
each status, and the parts of a node or decision line that the live progress and
``interlock trace`` share."""

from __future__ import annotations

import json
import shlex
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..support import EdgeSpec, Record


_STATUS_STYLE = {
    "running": "cyan", "completed": "green", "failed": "bold red", "retrying": "yellow",
    "caught": "yellow",  # failed, and an error edge took the run on
    "waiting": "magenta", "taken": "cyan", "skipped": "dim", "not run": "dim",
    "COMPLETED": "bold green", "FAILED": "bold red", "CANCELLED": "bold red",
    "WAITING_APPROVAL": "bold magenta", "WAITING_INPUT": "bold cyan", "REJECTED": "bold yellow",
    "approved": "green", "rejected": "yellow", "modified": "cyan", "timed_out": "yellow",
    "PENDING": "dim", "RUNNING": "cyan", "RETRYING": "yellow",
    "RUNNING (interrupted)": "bold yellow", "RETRYING (interrupted)": "bold yellow",
}


def decision_flags(waiting: dict[str, Any], *, short: bool = False) -> list[str]:
    """The ``interlock resume`` options for each decision a waiting gate accepts
    (`interlock.support.decision_flags`), an unknown outcome's with the outcome checked
    by hand too (approving it runs the action again)."""
    if waiting.get("kind") == "unknown_outcome":  # approve runs it again; data records it
        from ._gate_hints import data_example

        return ["--approve", "--reject", f"--approve --data '{data_example(waiting)}'"]
    from ..support import decision_flags as flags

    return flags(waiting, short=short)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.1f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{int(minutes)}m {seconds:04.1f}s"


def _when(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _ago(ts: float) -> str:
    return f"{_age(time.time() - ts)} ago"


def _age(seconds: float) -> str:
    """'45s', '3m 10s', '2h 05m', '3d 4h'."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _reads(reads: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={_json(v)}" for k, v in reads.items()) + ")"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


STATE_SHOWN = 400  # characters of a finished run's state printed by run/resume/status


def state_line(result: Any, where: str = "") -> str | None:
    """A finished run's final state, on one line (shortened; ``--json`` has all of it:
    the command that prints it carries ``where``, the options that reach the same store
    or server)."""
    if result.status not in ("COMPLETED", "FAILED", "REJECTED", "CANCELLED"):
        return None
    text = _json(result.state)
    if len(text) > STATE_SHOWN:
        from ._gate_hints import in_memory

        text = f"{text[:STATE_SHOWN - 3]}... " + (
            "(--json prints all of it)" if in_memory(where) else
            f"(`interlock status {shlex.quote(result.run_id)} --json{where}` prints all of it)")
    return f"state: {text}"


def traceback_hint(result: Any, where: str = "") -> list[str]:
    """For an exception a node raised, where its whole traceback is (the error's line
    names only the innermost frame of the user's code); printed after the error."""
    details = (result.error or {}).get("details")
    if not isinstance(details, dict) or not details.get("traceback"):
        return []
    from ._gate_hints import in_memory

    if in_memory(where):  # (no later command reads a memory:// run)
        return ["the full traceback: in the error's details, which --json prints "
                "(error.details.traceback)"]
    return [f"the full traceback: `interlock status {shlex.quote(result.run_id)} --json"
            f"{where}` (error.details.traceback)"]


def where_options(store_url: str | None = None, server_url: str | None = None,
                  token: str | None = None) -> str:
    """The options a printed follow-up command needs to reach the same run: ``--store``,
    or ``--server`` and ``--token`` -- each unless its environment variable holds it (the
    next command reads it again), and never the token itself (a TOKEN placeholder)."""
    import os

    if server_url:
        where = "" if os.environ.get("INTERLOCK_SERVER") == server_url \
            else f" --server {shlex.quote(server_url)}"
        given = token and os.environ.get("INTERLOCK_TOKEN") != token
        return where + (" --token TOKEN" if given else "")
    from ..support import store_word  # (its password left out)

    if not store_url or os.environ.get("INTERLOCK_STORE") == store_url:
        return ""
    return f" --store {store_word(store_url)}"


# -- node, edge and decision details ----------------------------------------------------------


def _sources(edge: EdgeSpec) -> str:
    return edge.source[0] if len(edge.source) == 1 else "[" + ", ".join(edge.source) + "]"


def _node_detail(rec: Record) -> str:
    parts = []
    if rec["type"] == "node.started" and rec.get("attempt", 1) > 1:
        parts.append(f"attempt {rec['attempt']}")
    if rec.get("items") is not None:  # a mapped node's visit, every item completed
        parts.append(_plural(rec["items"], "item"))
    if rec.get("duration_ms") is not None:
        parts.append(_duration(rec["duration_ms"]))
    if rec.get("tokens"):
        parts.append(_plural(rec["tokens"], "token"))
    error = rec.get("error")
    if error:
        parts.append(_short(str(error.get("message", "")).splitlines()[0], 200))
    if rec.get("caught"):  # an error edge caught it: the run goes on along that edge
        parts.append(f"caught by edge {rec['caught'].get('edge')} (on_error)")
    if rec["type"] == "node.retrying" and rec.get("delay_ms") is not None:
        parts.append(f"retry in {_duration(rec['delay_ms'])}")
    return "  ".join(parts)


def _decision_detail(rec: Record) -> str:
    """'by alice: looks fine; patch {...}; re-enter at a' for an approval.decided record."""
    if not rec.get("by") and rec.get("decision") in ("closed", "continued"):
        # the engine's, not a person's: a gate closed (the run ended), a child run's gate
        # decided in the child
        return f"({rec['comment']})" if rec.get("comment") else ""
    text = f"by {rec['by']}" if rec.get("by") else "by an anonymous decider"
    if rec.get("comment"):
        text += f": {_short(str(rec['comment']), 100)}"
    if rec.get("data") is not None:
        text += f"; data {_short(_json(rec['data']), 100)}"
    if rec.get("patch"):
        text += f"; patch {_short(_json(rec['patch']), 100)}"
    if rec.get("reenter"):
        text += f"; re-enter at {rec['reenter']}"
    if rec.get("timed_out"):
        text += " (deadline passed)"
    return text
