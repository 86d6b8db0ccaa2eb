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

A store URL is printed without its password (`store_word`): a hint is copied into chats,
tickets and shell history, and a ``postgresql://user:secret@host/db`` in it would hand
the password on. The printed ``postgresql://user@host/db`` works where the password is
found the way PostgreSQL's own tools find it -- ``PGPASSWORD``, or ``~/.pgpass`` -- and
a store named by ``$INTERLOCK_STORE`` is not printed at all (the next command reads the
variable again).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def shell_word(text: object) -> str:
    """``text`` as one shell word (quoted only when a shell would change it)."""
    return shlex.quote(str(text))


def without_password(url: str, placeholder: str = "") -> str:
    """``url`` with its password (in ``user:password@``, or a ``password=`` query
    parameter) left out -- or, with ``placeholder``, replaced by it (``***`` for a
    message that shows there is one)."""
    try:
        parts = urlsplit(url)
        netloc, query = parts.netloc, parts.query
        if parts.password is not None:
            user, host = parts.username or "", netloc.rpartition("@")[2]
            secret = f":{placeholder}" if placeholder else ""
            netloc = f"{user}{secret}@{host}" if user or secret else host
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            kept = [(k, v) for k, v in pairs if k != "password" or placeholder]
            query = urlencode([(k, placeholder if k == "password" else v) for k, v in kept],
                              safe="*")
    except ValueError:  # not a URL a store would take: printed as given
        return url
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # (as given: urlunsplit would change sqlite:////abs.db)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def store_word(url: str) -> str:
    """A store URL as printed commands carry it: one shell word, without its password
    (the module's docstring says why and where the password is found instead)."""
    return shell_word(without_password(url))


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


__all__ = ["decide_command", "decide_hint", "decision_flags", "shell_word", "store_word",
           "without_password"]
