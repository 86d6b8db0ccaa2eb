"""The commands interlock prints for a person to copy: how to decide a waiting gate.

Every "decide with" hint -- ``run``, ``resume``, ``status``, ``send``, ``chat``, a message
refused while a gate waits -- is built here, so that each one is a command line that works
when pasted into a shell:

    interlock resume c1 --gate assistant/run_triage/approval --approve (or --reject)

The gate is always named (``--gate``): the same command run twice (a retry, a double
click) is then refused as a second decision instead of deciding whichever gate waits
next. The options that reach the same store or server (``where``: ``--store URL``, or
``--server URL`` and a ``--token TOKEN`` placeholder, never the token) go after the
decision flag. Words a shell would change (a map item's ``deploy[2]``, a store path with
spaces) are quoted.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any


def shell_word(text: object) -> str:
    """``text`` as one shell word (quoted only when a shell would change it)."""
    return shlex.quote(str(text))


def decision_flags(waiting: Mapping[str, Any], *, short: bool = False) -> list[str]:
    """The ``interlock resume`` options for each decision a waiting gate accepts, in the
    gate's order: an approval whose ``input:`` asks for data takes ``--data``, a guarded
    tool call's modify edits its arguments, an unknown outcome is also approved with the
    outcome checked by hand (``short``: placeholders, for one line)."""
    if waiting.get("kind") == "unknown_outcome":  # approve runs it again; data records it
        from ._gate_text import data_example

        return ["--approve", "--reject", f"--approve --data '{data_example(waiting)}'"]
    data = waiting.get("input") is not None and waiting.get("kind") == "approval"
    tool = waiting.get("kind") == "tool"
    patch = "PATCH_JSON [--at NODE]" if short else "'{\"field\": value}' [--at NODE]"
    flags = {"approve": "--approve" + (" --data JSON" if data else ""),
             "reject": "--reject" + (" [--data JSON]" if data else ""),
             "modify": "--modify " + ("'{\"arguments\": {...}}'" if tool else patch)}
    return [flags[d] for d in waiting.get("decisions") or [] if d in flags]


def decide_command(run_id: str, gate: object, flag: str, where: str = "") -> str:
    """``interlock resume RUN --gate GATE FLAG WHERE``: one decision of one gate."""
    return f"interlock resume {shell_word(run_id)} --gate {shell_word(gate)} {flag}{where}"


def decide_hint(run_id: str, waiting: Mapping[str, Any], where: str = "") -> str:
    """How to decide the gate ``waiting`` names, on one line: the command with its first
    decision, then the others -- ``interlock resume c1 --gate G --approve (or --reject)``.
    A gate with ``approvers:`` gets ``--by NAME`` (a decision without it is anonymous,
    which the approvers refuse)."""
    flags = decision_flags(waiting, short=True) or ["--approve", "--reject"]
    by = " --by NAME" if waiting.get("approvers") else ""
    command = decide_command(run_id, waiting.get("node"), flags[0] + by, where)
    if len(flags) == 1:
        return command
    return f"{command} (or {', or '.join(flags[1:])})"


__all__ = ["decide_command", "decide_hint", "decision_flags", "shell_word"]
